"""Taking a snapshot of a home: what changed since the last one is read, cut into content-defined
chunks, and only the chunks the store does not hold yet are uploaded; the manifest naming every
file's chunks is signed and uploaded last (``docs/placement.md``, "Snapshots").

- **Walk.** The home is read by directory descriptors (``O_NOFOLLOW`` per component, as the file
  tools do): directories, regular files and symbolic links whose target stays in the home. Left
  out (and logged): links leading outside the home, FIFOs, sockets, devices, names that are not
  UTF-8. Permission bits are kept, never setuid/setgid/sticky bits. A file with several hard links
  is stored once per name.
- **What changed.** A file whose inode, size, mtime and ctime are those recorded at the last
  snapshot on this node keeps its chunks unread (the agent can set mtime, never ctime; the same
  test rsync, git and restic use). Other files are read.
- **Only data.** A file is read by its data regions (``SEEK_DATA``/``SEEK_HOLE``): holes cost
  nothing and come back as holes. A file whose data exceeds its allocated blocks (a sparse file on
  a file system that does not report holes) refuses the snapshot rather than storing its zeros;
  so does a home whose data exceeds ``bound`` (its quota). Nothing is staged on disk: each chunk
  goes from the file to the store through memory (at most one chunk, ``MAX_CHUNK``, per snapshot).
- **Chunks.** FastCDC (``pyfastcdc``: content-defined, so an insertion moves only the chunks around
  it), 1 MiB on average (256 KiB to 4 MiB), named by SHA-256.

``take`` is a generator: it yields after each chunk it uploads and every few files, so a node's
scheduler (``worker.placement.scheduler``) can interleave the snapshots of several agents.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import stat
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generator, Iterator

from pyfastcdc import FastCDC

from worker.placement.entries import DIR, FILE, LINK, Chunk, Entry, check_link, check_path, encode
from worker.placement.signing import Header, SnapshotKey, SnapshotRefused
from worker.placement.snapshots import SnapshotStore

log = logging.getLogger("agent.placement")

AVG_CHUNK, MIN_CHUNK, MAX_CHUNK_SIZE = 1 << 20, 256 << 10, 4 << 20
# Data a file may hold beyond its allocated blocks (inline data, a tail being written back).
SPARSE_SLACK = 64 << 10
MAX_ENTRIES = 1_000_000
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FILES_PER_YIELD = 64


class SnapshotOverBound(Exception):
    """The home cannot be snapshotted within its bound; ``reason`` says why (recorded for operators)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class FileState:
    """What identifies a file's content at a snapshot: inode, size, mtime and ctime (ns)."""

    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @staticmethod
    def of(st: os.stat_result) -> FileState:
        return FileState(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@dataclass
class Taken:
    """A snapshot uploaded (not yet recorded): its manifest's ``object`` key, its ``entries``, the
    home's ``data`` bytes, the bytes ``uploaded`` for it, the ``chunks`` it references, the
    ``files`` state to skip unchanged files next time, and what was ``left_out``."""

    object: str
    entries: int
    data: int
    uploaded: int
    chunks: set[str]
    files: dict[str, tuple[FileState, tuple[Chunk, ...]]]
    left_out: list[str] = field(default_factory=list)


class _Region:
    """A reader of ``fd`` from ``start`` to ``end`` (``readinto``, for the chunker)."""

    def __init__(self, fd: int, start: int, end: int):
        self.fd, self.pos, self.end = fd, start, end

    def readinto(self, buf: memoryview) -> int:
        want = min(len(buf), self.end - self.pos)
        if want <= 0:
            return 0
        n = os.preadv(self.fd, [buf[:want]], self.pos)
        self.pos += n
        return n


def data_regions(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` of each data region of the file ``fd`` (``SEEK_DATA``/``SEEK_HOLE``); the
    whole file where the file system does not say."""
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole is left
                return
            if exc.errno == errno.EINVAL and offset == 0:  # no SEEK_DATA here
                yield 0, size
                return
            raise
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        if end > start:
            yield start, end
        offset = end


def _walk(home_fd: int, left_out: list[str]) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """``(rel path, parent fd, name, lstat)`` of everything in the home, parents before children,
    names sorted; descriptors valid until the next item."""

    def visit(fd: int, rel: str) -> Iterator[tuple[str, int, str, os.stat_result]]:
        with os.scandir(fd) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path = f"{rel}/{name}" if rel else name
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:
                left_out.append(repr(path))
                continue
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield path, fd, name, st
            if stat.S_ISDIR(st.st_mode):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    left_out.append(path)
                    continue
                try:
                    yield from visit(sub, path)
                finally:
                    os.close(sub)

    yield from visit(home_fd, "")


class Taker:
    """Takes snapshots into ``store``, signed with ``key`` (module docstring)."""

    def __init__(self, store: SnapshotStore, key: SnapshotKey):
        self.store = store
        self.key = key

    def take(
        self,
        home: Path,
        agent_id: str,
        epoch: int,
        node: str,
        *,
        known: set[str],
        files: dict[str, tuple[FileState, tuple[Chunk, ...]]],
        bound: int | None,
    ) -> Generator[None, None, Taken]:
        """Snapshot ``home``: read what changed since ``files`` (the last snapshot's file states),
        upload the chunks not in ``known`` (the chunks the store holds for the agent; updated),
        then the signed manifest. ``bound``: the most data bytes the home may hold (its quota).
        Returns ``Taken``. Raises ``SnapshotOverBound`` or ``SnapshotError``."""
        chunker = FastCDC(AVG_CHUNK, min_size=MIN_CHUNK, max_size=MAX_CHUNK_SIZE)
        entries: list[Entry] = []
        new_files: dict[str, tuple[FileState, tuple[Chunk, ...]]] = {}
        left_out: list[str] = []
        used: set[str] = set()
        data = uploaded = 0
        home_fd = os.open(home, _DIR_FLAGS)
        try:
            for n, (path, dir_fd, name, st) in enumerate(_walk(home_fd, left_out)):
                if n >= MAX_ENTRIES:
                    raise SnapshotOverBound(f"the home holds more than {MAX_ENTRIES} entries")
                if n % _FILES_PER_YIELD == 0:
                    yield
                mode = stat.S_IMODE(st.st_mode) & 0o777
                if stat.S_ISDIR(st.st_mode):
                    entries.append(Entry(DIR, check_path(path), mode))
                elif stat.S_ISLNK(st.st_mode):
                    target = os.readlink(name, dir_fd=dir_fd)
                    try:
                        check_link(path, target)
                        entries.append(Entry(LINK, check_path(path), 0o777, target=target))
                    except SnapshotRefused:
                        left_out.append(f"{path} -> {target}")
                elif stat.S_ISREG(st.st_mode):
                    state = FileState.of(st)
                    previous = files.get(path)
                    if previous is not None and previous[0] == state:
                        chunks = previous[1]
                    else:
                        chunks, sent = yield from self._read_file(agent_id, dir_fd, name, path, st, known, chunker)
                        uploaded += sent
                    new_files[path] = (state, chunks)
                    used.update(c.sha256 for c in chunks)
                    data += sum(c.length for c in chunks)
                    if bound is not None and data > bound:
                        raise SnapshotOverBound(
                            f"the home holds more than {bound // 1024**2} MiB of data, more than its quota"
                        )
                    entries.append(Entry(FILE, check_path(path), mode, st.st_size, chunks, mtime_ns=st.st_mtime_ns))
                else:
                    left_out.append(path)
        finally:
            os.close(home_fd)
        key = self.store.new_manifest_key(agent_id, epoch)
        body = zlib.compress(encode(entries), 6)
        header = Header(
            agent=agent_id,
            epoch=epoch,
            object=key,
            node=node,
            taken_at=round(time.time(), 3),
            format="manifest",
            sha256=hashlib.sha256(body).hexdigest(),
            size=len(body),
        )
        uploaded += self.store.put(key, self.key.seal(header, body))
        if left_out:
            log.info("snapshot of %s left out %d entries: %s", agent_id, len(left_out), ", ".join(left_out[:10]))
        return Taken(key, len(entries), data, uploaded, used, new_files, left_out)

    def _read_file(
        self, agent_id: str, dir_fd: int, name: str, path: str, st: os.stat_result, known: set[str], chunker: FastCDC
    ) -> Generator[None, None, tuple[tuple[Chunk, ...], int]]:
        """The chunks of one file (uploading those the store lacks) and the bytes sent."""
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:  # swapped for a FIFO or removed meanwhile: nothing runs in the home, so rare
            raise SnapshotOverBound(f"{path} could not be read ({exc.strerror})") from None
        chunks: list[Chunk] = []
        sent = total = 0
        try:
            fst = os.fstat(fd)
            if not stat.S_ISREG(fst.st_mode) or fst.st_ino != st.st_ino:
                raise SnapshotOverBound(f"{path} changed while the home was snapshotted")
            allocated = fst.st_blocks * 512
            for start, end in data_regions(fd, fst.st_size):
                for piece in chunker.cut_stream(_Region(fd, start, end)):
                    digest = hashlib.sha256(piece.data).hexdigest()
                    chunks.append(Chunk(start + piece.offset, piece.length, digest))
                    total += piece.length
                    if total > allocated + SPARSE_SLACK:
                        raise SnapshotOverBound(
                            f"{path} holds more data than the blocks it uses (a sparse file whose holes this "
                            "file system does not report): it cannot be stored as sparse"
                        )
                    if digest not in known:
                        sent += self.store.put_chunk(agent_id, digest, piece.data)
                        known.add(digest)
                        yield
        finally:
            os.close(fd)
        return tuple(chunks), sent
