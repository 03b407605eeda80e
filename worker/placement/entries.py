"""What a snapshot holds, whatever its format: a list of entries (a directory, a regular file with
its data chunks, a symbolic link), and the rules every entry is checked against before anything of
a snapshot is written into a home.

An ``Entry``'s ``path`` is relative to the home, ``/``-separated. Refused (``SnapshotRefused``,
naming the entry): an empty or absolute path, a ``.``, ``..`` or empty component, a NUL byte, a
component over 255 bytes or a path over 4096; a path listed twice; a path under something that is
not a directory of the snapshot; a symbolic link whose target is absolute or climbs above the home
from where the link stands; permission bits beyond ``0o777`` (setuid, setgid, sticky); a file's
chunks that overlap, leave its size, or exceed ``MAX_CHUNK`` bytes. Hard links, devices, FIFOs and
sockets have no ``Entry`` kind: the readers of each format refuse them. ``Limits`` bounds the data
bytes and the entry count, checked on the whole list (``check``) before the first write.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from worker.placement.signing import SnapshotRefused

MAX_COMPONENT = 255
MAX_PATH = 4096
MAX_CHUNK = 8 << 20  # bytes of one chunk, whatever the chunker's settings
MAX_FILE_SIZE = 1 << 44  # 16 TiB: ext4's largest file
BLOCK = 4096  # what a directory, a long symlink or a partial block of data costs on the home's file system
_HASH = re.compile(r"[0-9a-f]{64}\Z")

DIR, FILE, LINK = "d", "f", "l"


@dataclass(frozen=True)
class Chunk:
    """``length`` bytes of a file at ``offset``, whose SHA-256 is ``sha256`` (hex)."""

    offset: int
    length: int
    sha256: str


@dataclass(frozen=True)
class Entry:
    """One thing in a home: ``kind`` is ``DIR``, ``FILE`` or ``LINK``; ``mode`` its permission bits;
    a file's apparent ``size`` and ``chunks`` (what is not covered is a hole), or ``whole`` when its
    ``size`` bytes follow in an archive (tar), and its ``mtime_ns``; a link's ``target``."""

    kind: str
    path: str
    mode: int = 0o755
    size: int = 0
    chunks: tuple[Chunk, ...] = ()
    target: str = ""
    whole: bool = False
    mtime_ns: int = 0  # a file's modification time (0: not kept)

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("/"))

    def data_bytes(self) -> int:
        return self.size if self.whole else sum(c.length for c in self.chunks)


@dataclass
class Limits:
    """What a home can take: ``max_bytes`` of blocks (data rounded up to blocks, plus a block per
    directory and long link) and ``max_entries``."""

    max_bytes: int
    max_entries: int


@dataclass
class Totals:
    """What a list of entries needs: ``entries``, ``data`` bytes (chunks), ``blocks`` bytes on disk."""

    entries: int = 0
    data: int = 0
    blocks: int = 0
    seen: dict[str, str] = field(default_factory=dict)


def check_path(path: str) -> str:
    """``path`` if it is a confined relative path (module docstring), else ``SnapshotRefused``."""
    raw = path.encode("utf-8", "surrogateescape")
    if not path or path.startswith("/") or "\x00" in path or len(raw) > MAX_PATH:
        raise SnapshotRefused(f"it holds the path {path[:200]!r}, which is not a path inside a home")
    for part in path.split("/"):
        if part in ("", ".", "..") or len(part.encode("utf-8", "surrogateescape")) > MAX_COMPONENT:
            raise SnapshotRefused(f"it holds the path {path[:200]!r}, which is not a path inside a home")
    return path


def check_link(path: str, target: str) -> None:
    """Refuse a link at ``path`` whose ``target`` is absolute or leads above the home."""
    if not target or target.startswith("/") or "\x00" in target or len(target) > MAX_PATH:
        raise SnapshotRefused(f"it holds a link {path[:200]!r} -> {target[:200]!r} that leads outside the home")
    depth = len(path.split("/")) - 1  # the link's directory, below the home
    for part in target.split("/"):
        if part == "..":
            depth -= 1
            if depth < 0:
                raise SnapshotRefused(f"it holds a link {path[:200]!r} -> {target[:200]!r} that leads outside the home")
        elif part not in ("", "."):
            depth += 1


def _check_file(e: Entry) -> None:
    if not 0 <= e.size <= MAX_FILE_SIZE:
        raise SnapshotRefused(f"it holds the file {e.path[:200]!r} of {e.size} bytes")
    if e.whole and e.chunks:
        raise SnapshotRefused(f"its file {e.path[:200]!r} is both whole and in chunks")
    end = 0
    for c in e.chunks:
        if c.offset < end or c.length <= 0 or c.length > MAX_CHUNK or c.offset + c.length > e.size:
            raise SnapshotRefused(f"its chunks of {e.path[:200]!r} overlap or leave the file")
        if not _HASH.match(c.sha256):
            raise SnapshotRefused(f"it names a chunk of {e.path[:200]!r} that is not a SHA-256")
        end = c.offset + c.length


def check(entries: Iterable[Entry], limits: Limits, totals: Totals | None = None) -> Totals:
    """Check every entry (module docstring) and their totals against ``limits``; returns the totals.
    ``totals`` carries the state across calls for a list checked in pieces. Raises ``SnapshotRefused``."""
    t = totals or Totals()
    for e in entries:
        check_path(e.path)
        if e.path in t.seen:
            raise SnapshotRefused(f"it lists {e.path[:200]!r} twice")
        parent = e.path.rpartition("/")[0]
        if parent and t.seen.get(parent) != DIR:
            raise SnapshotRefused(f"it puts {e.path[:200]!r} under something that is not one of its directories")
        if e.mode & ~0o777:
            raise SnapshotRefused(f"it gives {e.path[:200]!r} the mode {e.mode:o} (setuid, setgid or sticky bits)")
        if e.kind == FILE:
            _check_file(e)
            t.data += e.data_bytes()
            pieces = [e.size] if e.whole else [c.length for c in e.chunks]
            t.blocks += sum(math.ceil(n / BLOCK) * BLOCK for n in pieces)
        elif e.kind == LINK:
            check_link(e.path, e.target)
            t.blocks += BLOCK if len(e.target.encode()) >= 60 else 0  # ext4 keeps short targets in the inode
        elif e.kind == DIR:
            t.blocks += BLOCK
        else:
            raise SnapshotRefused(f"it holds {e.path[:200]!r} of an unknown kind")
        t.seen[e.path] = e.kind
        t.entries += 1
        if t.entries > limits.max_entries:
            raise SnapshotRefused(
                f"it holds more than {limits.max_entries} entries, more than the home's file system can take"
            )
        if t.blocks > limits.max_bytes:
            raise SnapshotRefused(
                f"it needs more than {limits.max_bytes // 1024**2} MiB, more than the home's quota can take"
            )
    return t


# ----- the manifest's body: JSON, one array per entry ----------------------------


def encode(entries: list[Entry]) -> bytes:
    """The manifest's JSON: ``{"v": 1, "entries": [[kind, path, mode, size, [[offset, length, sha256]...], mtime_ns]
    | [kind, path, mode] | [kind, path, mode, target]]}``."""
    rows: list[list[Any]] = []
    for e in entries:
        if e.kind == FILE:
            chunks = [[c.offset, c.length, c.sha256] for c in e.chunks]
            rows.append([FILE, e.path, e.mode, e.size, chunks, e.mtime_ns])
        elif e.kind == LINK:
            rows.append([LINK, e.path, e.mode, e.target])
        else:
            rows.append([DIR, e.path, e.mode])
    return json.dumps({"v": 1, "entries": rows}, separators=(",", ":")).encode()


def _row(row: Any) -> Entry:
    kind, path, mode = row[0], row[1], row[2]
    if not (isinstance(kind, str) and isinstance(path, str) and isinstance(mode, int)):
        raise TypeError("kind, path and mode")
    if kind == FILE:
        size, chunks = row[3], row[4]
        mtime = row[5] if len(row) > 5 else 0
        if not isinstance(size, int) or not isinstance(chunks, list) or not isinstance(mtime, int):
            raise TypeError("size, chunks and mtime")
        parsed = []
        for c in chunks:
            offset, length, digest = c
            if not (isinstance(offset, int) and isinstance(length, int) and isinstance(digest, str)):
                raise TypeError("chunk")
            parsed.append(Chunk(offset, length, digest))
        return Entry(FILE, path, mode, size, tuple(parsed), mtime_ns=mtime)
    if kind == LINK:
        if not isinstance(row[3], str):
            raise TypeError("target")
        return Entry(LINK, path, mode, target=row[3])
    return Entry(kind, path, mode)


def decode(body: bytes) -> list[Entry]:
    """The entries of a manifest's JSON (``encode``), not yet ``check``ed. Raises ``SnapshotRefused``."""
    try:
        doc = json.loads(body)
        if not isinstance(doc, dict) or doc.get("v") != 1 or not isinstance(doc.get("entries"), list):
            raise ValueError("not a version 1 manifest")
        return [_row(row) for row in doc["entries"]]
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise SnapshotRefused(f"its manifest cannot be read ({exc.__class__.__name__}: {str(exc)[:200]})") from None
