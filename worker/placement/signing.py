"""The signature of a snapshot: an HMAC-SHA256 with the key every tools node holds
(``AGENT_SNAPSHOT_KEY``), never stored in the bucket.

A snapshot's top object (its manifest, or a whole-home archive) is::

    b"agent-snapshot 1\\n" + header (one line of JSON) + b"\\n" + MAC (64 hex digits) + b"\\n" + body

The header says whose home it is and when it was taken: ``agent``, ``epoch`` (the placement epoch
that took it), ``object`` (its own key in the store), ``node``, ``taken_at``, ``format``
(``manifest`` or ``tar``), and the body's ``sha256`` and ``size`` (bytes). The MAC covers the first line
and the header, so it binds the body (through its digest) to the agent, the epoch and the object
name. A reader checks, before it reads any of the body: the MAC (``SnapshotRefused``: "it was
changed after it was taken"), then that the header names the agent, epoch and object it expected
from the placement records (``SnapshotRefused``: another snapshot was put in its place); it then
hashes the body as it reads it and compares the digest.

Why a MAC and not a signature with a public key: only the tools nodes write and read snapshots,
and they all hold the key anyway; HMAC-SHA256 is in the standard library (``hmac``), constant-time
compared (``hmac.compare_digest``). A bucket writer without the key can delete snapshots or put
garbage, never a snapshot a node accepts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from typing import Any

MAGIC = b"agent-snapshot 1\n"
MIN_KEY_CHARS = 32
MAX_HEADER_BYTES = 4096
_MAC_HEX = 64


class SnapshotRefused(Exception):
    """A snapshot that is not restored: ``reason`` is what the model and the operators are told
    ("it was changed after it was taken", "it does not fit in the home's quota"...)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


CHANGED = "it was changed after it was taken"


@dataclass(frozen=True)
class Header:
    """What a snapshot says about itself (module docstring); ``sha256``/``size`` are its body's."""

    agent: str
    epoch: int
    object: str
    node: str
    taken_at: float
    format: str
    sha256: str
    size: int

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True, separators=(",", ":")).encode()


class SnapshotKey:
    """The nodes' key. Raises ``ValueError`` for a key under ``MIN_KEY_CHARS`` characters."""

    def __init__(self, secret: str):
        if len(secret) < MIN_KEY_CHARS:
            raise ValueError(f"AGENT_SNAPSHOT_KEY must have at least {MIN_KEY_CHARS} characters")
        self._key = secret.encode()

    def _mac(self, header: bytes) -> str:
        return hmac.new(self._key, MAGIC + header, hashlib.sha256).hexdigest()

    def seal(self, header: Header, body: bytes) -> bytes:
        """The object for ``body`` described by ``header`` (its ``sha256``/``size`` must be the body's)."""
        assert header.sha256 == hashlib.sha256(body).hexdigest() and header.size == len(body)
        head = header.to_json()
        return MAGIC + head + b"\n" + self._mac(head).encode() + b"\n" + body

    def open_header(self, prefix: bytes, expect: dict[str, Any]) -> tuple[Header, int]:
        """Check the first bytes of an object (at least its first three lines, at most
        ``MAX_HEADER_BYTES`` + 100): the MAC, then each ``expect``ed header field. Returns the header
        and the offset of the body. Raises ``SnapshotRefused``."""
        if not prefix.startswith(MAGIC):
            raise SnapshotRefused(f"{CHANGED} (it is not a signed snapshot)")
        rest = prefix[len(MAGIC) :]
        head, sep, rest = rest.partition(b"\n")
        mac, sep2, _ = rest.partition(b"\n")
        if not sep or not sep2 or len(head) > MAX_HEADER_BYTES or len(mac) != _MAC_HEX:
            raise SnapshotRefused(f"{CHANGED} (its header is malformed)")
        if not hmac.compare_digest(mac, self._mac(head).encode()):
            raise SnapshotRefused(CHANGED)
        try:
            fields = json.loads(head)
            header = Header(**fields)
        except (ValueError, TypeError) as exc:  # signed, yet unreadable: a key shared with another format
            raise SnapshotRefused(f"its header cannot be read ({exc})") from None
        for name, value in expect.items():
            if getattr(header, name) != value:
                raise SnapshotRefused(
                    f"{CHANGED}: it is the snapshot of {header.agent!r} at epoch {header.epoch} "
                    f"({header.object}), put in place of the one recorded"
                )
        return header, len(MAGIC) + len(head) + 1 + _MAC_HEX + 1

    def open(self, blob: bytes, expect: dict[str, Any]) -> tuple[Header, bytes]:
        """Check a whole object held in memory and return its header and body. Raises ``SnapshotRefused``."""
        header, offset = self.open_header(blob[: len(MAGIC) + MAX_HEADER_BYTES + _MAC_HEX + 2], expect)
        body = blob[offset:]
        if len(body) != header.size or not hmac.compare_digest(hashlib.sha256(body).hexdigest(), header.sha256):
            raise SnapshotRefused(CHANGED)
        return header, body
