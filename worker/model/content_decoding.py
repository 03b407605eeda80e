"""Bounded decoding of a response body's ``Content-Encoding`` (decompression-bomb guard).

httpx decodes each network chunk in one call per encoding, without an output bound:
with ``Content-Encoding: gzip, gzip`` a chunk of 1,827 bytes decodes to a megabyte of
inner gzip, which decodes in one call to gigabytes, before any size cap can apply (a
decompression bomb: docs/isolation.md, "Web"). Here every stage is a ``zlib.decompressobj`` asked for at most ``BLOCK``
bytes at a time (``decompress(data, max_length)``, the rest kept in
``unconsumed_tail``), and stages are pulled from the last one: a stage only decodes
what the stage above asks for. So memory stays within a few ``BLOCK`` per stage
whatever the ratio, and the caller stops pulling at its decoded-bytes cap.

Encodings (RFC 9110 section 8.4): ``gzip``/``x-gzip``, ``deflate`` (zlib-wrapped, or
raw as some servers send), ``identity``; listed in the order they were applied, so
they are undone from the last. Others (``br``, ``zstd``, ``compress``) are refused: the
clients that use this (``worker.model.http_pool``, ``worker.tools.web.fetch``) advertise only
``ACCEPT_ENCODING``.
"""

from __future__ import annotations

import zlib
from typing import Iterator

BLOCK = 64 * 1024  # bytes asked of a stage at a time
MAX_ENCODINGS = 4  # more stacked encodings than this is refused (each adds CPU work per byte)
ACCEPT_ENCODING = "gzip, deflate"

_GZIP = 16 + zlib.MAX_WBITS
_ZLIB_OR_GZIP = 32 + zlib.MAX_WBITS  # auto-detects the zlib or gzip header
_RAW = -zlib.MAX_WBITS


class ContentEncodingError(ValueError):
    """An unsupported or corrupt ``Content-Encoding``. The message names the encoding."""


def parse_content_encoding(header: str | None) -> list[str]:
    """The encodings of a ``Content-Encoding`` header, in applied order, lowercased, without
    ``identity``. Raises ``ContentEncodingError`` for an unsupported one or too many."""
    names = [n.strip().lower() for n in (header or "").split(",")]
    names = [n for n in names if n and n != "identity"]
    for n in names:
        if n not in ("gzip", "x-gzip", "deflate"):
            raise ContentEncodingError(f"unsupported Content-Encoding {n!r} (supported: gzip, deflate)")
    if len(names) > MAX_ENCODINGS:
        raise ContentEncodingError(f"{len(names)} stacked Content-Encodings (at most {MAX_ENCODINGS})")
    return names


class _Stage:
    """One decompressor with its pending input (at most one ``BLOCK`` from the stage before it)."""

    def __init__(self, name: str):
        self.name = name
        self.wbits = _ZLIB_OR_GZIP if name == "deflate" else _GZIP
        self.d = zlib.decompressobj(self.wbits)
        self.pending = b""
        self.started = False
        self.done = False  # a deflate stream ended: anything after it is ignored

    def read(self) -> bytes:
        """Up to ``BLOCK`` decoded bytes from the pending input (b"" when it needs more input)."""
        if self.done:
            self.pending = b""
            return b""
        if self.d.eof:
            # Another gzip member may follow (concatenated members are one stream, RFC 1952);
            # zero padding between or after members is skipped.
            leftover = (self.d.unused_data + self.pending).lstrip(b"\0")
            if self.name == "deflate":
                self.done, self.pending = True, b""
                return b""
            self.d = zlib.decompressobj(self.wbits)
            self.pending = leftover
            if not leftover:
                return b""
        try:
            out = self.d.decompress(self.pending, BLOCK)
        except zlib.error as exc:
            if self.name == "deflate" and not self.started:
                # "deflate" without the zlib wrapper (raw), as some servers send it.
                self.wbits = _RAW
                self.d = zlib.decompressobj(_RAW)
                out = self.d.decompress(self.pending, BLOCK)
            else:
                raise ContentEncodingError(f"corrupt {self.name} data: {exc}") from None
        self.started = self.started or bool(self.pending)
        self.pending = self.d.unconsumed_tail
        return out


class BoundedDecoder:
    """Decode a body encoded with ``encodings`` (as from ``parse_content_encoding``), chunk by chunk.

    ``feed(raw)`` yields decoded pieces of at most ``BLOCK`` bytes; the caller may stop
    iterating at any time (its cap) and nothing more is decoded. ``ContentEncodingError``
    for corrupt data. With no encodings, chunks pass through unchanged.
    """

    def __init__(self, encodings: list[str]):
        # Undone in reverse order of application: the last applied is the first stage.
        self.stages = [_Stage(n) for n in reversed(encodings)]

    def _pull(self, i: int, raw_left: list[bytes]) -> bytes:
        """The next decoded piece of stage ``i`` (b"" when the raw input is used up)."""
        stage = self.stages[i]
        while True:
            out = stage.read()
            if out:
                return out
            if i == 0:
                if not raw_left:
                    return b""
                stage.pending += raw_left.pop()
                continue
            below = self._pull(i - 1, raw_left)
            if not below:
                return b""
            stage.pending += below

    def feed(self, raw: bytes) -> Iterator[bytes]:
        """Decoded pieces (each at most ``BLOCK`` bytes) of ``raw``, the next network chunk."""
        if not self.stages:
            if raw:
                yield raw
            return
        raw_left = [raw[i : i + BLOCK] for i in range(0, len(raw), BLOCK)][::-1]  # popped from the end
        while True:
            piece = self._pull(len(self.stages) - 1, raw_left)
            if not piece:
                return
            yield piece
