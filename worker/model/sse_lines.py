"""The lines of a server-sent event stream, cut from its bytes as they arrive: ``SSELines``.

The SSE standard (HTML Living Standard, "Server-sent events", parsing an event stream) ends a line at
CRLF, LF or a bare CR, and nowhere else. Both model clients cut lines here, then hand each line to
httpx-sse's ``SSEDecoder``:

- not aiohttp's line reader: it refuses a line over 64 KiB, and one event can be megabytes
  (``response.completed`` carries the whole reply);
- not httpx's ``iter_lines``: it splits with ``str.splitlines``, also at U+2028, U+0085 and other
  separators, which servers that do not escape non-ASCII in JSON (llama.cpp's, vLLM's) send raw
  inside an event when the model writes one: the event was cut in two, read as non-JSON, retried
  and paid for again, five times.
"""

from __future__ import annotations

import re

from httpx_sse import ServerSentEvent
from httpx_sse._decoders import SSEDecoder

_LINE_END = re.compile(rb"\r\n|\r|\n")


class SSELines:
    """``feed(chunk)``: the lines (text, without their line end) that ``chunk`` completes;
    ``close()``: the last, unterminated line(s) at the end of the stream. Bytes are decoded as
    UTF-8, an invalid sequence replaced (the event's JSON parse then refuses it).

    Each chunk is searched for a line end once (its own bytes, and a CR held from the chunk
    before), so an event of N bytes costs O(N), not O(N**2): re-searching a growing buffer held
    the process's event loop for 7 s on a 50 MB event. A CR that ends a chunk is held until the
    next one says whether an LF follows: a CRLF cut between two chunks is one line end, not two
    (the empty line would end a multi-line event early)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, chunk: bytes) -> list[str]:
        """The complete lines once ``chunk`` is added."""
        buf = self._buf
        start = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        buf += chunk
        end = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        cut = max(buf.rfind(b"\n", start, end), buf.rfind(b"\r", start, end))
        if cut < 0:
            return []
        lines = _LINE_END.split(bytes(buf[: cut + 1]))
        del buf[: cut + 1]
        return [line.decode("utf-8", "replace") for line in lines[:-1]]

    def close(self) -> list[str]:
        """The lines left at the end of the stream (none, or one without its line end)."""
        rest, self._buf = bytes(self._buf), bytearray()
        return [line.decode("utf-8", "replace") for line in _LINE_END.split(rest) if line]


class SSEEvents:
    """The server-sent events of a byte stream: ``SSELines`` decoded by httpx-sse's ``SSEDecoder``.

    ``feed(chunk)`` and ``close()`` give one entry per completed line: the event that line
    completed, or None (a field or a comment line), so a reader can look at the clock while a
    stream sends only comments (``wire_format.read_events``). Both model clients read streams
    through it."""

    def __init__(self) -> None:
        self._lines = SSELines()
        self._decoder = SSEDecoder()

    def feed(self, chunk: bytes) -> list[ServerSentEvent | None]:
        """The entries of the lines ``chunk`` completes."""
        return [self._decoder.decode(line) for line in self._lines.feed(chunk)]

    def close(self) -> list[ServerSentEvent | None]:
        """The entries of the stream's last lines, and of the blank line that ends its last event."""
        return [self._decoder.decode(line) for line in (*self._lines.close(), "")]
