"""Restoring a snapshot into a home: verified, checked whole, then written member by member as the
agent (``docs/placement.md``, "Restores").

1. **Verified before it is read.** The snapshot's top object must carry a valid MAC of the nodes'
   key and name the agent, epoch and object the placement records expect
   (``worker.placement.signing``); otherwise it is refused, and the model is told "the snapshot was
   refused: it was changed after it was taken".
2. **Checked whole before anything is written.** Every entry against the rules of
   ``worker.placement.entries`` (no absolute path, no ``..``, nothing under a link, no link leading
   out, no hard link, device, FIFO or setuid/setgid bit), and their blocks and count against what the
   home's file system can hold (``capacity``). A refused snapshot leaves the home as it was.
3. **Written by the agent.** The home is emptied and the entries created one by one by a child
   process running as the agent's uid, resolving from the home's descriptor with ``O_NOFOLLOW``
   (``worker.placement.home_writer``). Each chunk is checked (length, SHA-256) before its bytes are
   written. If anything fails on the way the home is emptied again: never half a home.

Formats: ``manifest`` (what nodes write: entries and chunks, ``worker.placement.taker``) and
``tar`` (a whole-home tar.gz, the format of earlier versions; read by ``tarfile`` as a parser only,
member by member, through the same checks and the same writer; never ``extract``). A snapshot
recorded by a version that did not sign snapshots is refused.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tarfile
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator

from worker.placement import entries as ent
from worker.placement.entries import DIR, FILE, LINK, Entry, Limits
from worker.placement.home_writer import HomeWriter, WriteRefused
from worker.placement.signing import CHANGED, MAX_HEADER_BYTES, Header, SnapshotKey, SnapshotRefused
from worker.placement.snapshots import MAX_MANIFEST_JSON, MAX_MANIFEST_OBJECT, SnapshotStore

log = logging.getLogger("agent.placement")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
PREFETCH = 8  # chunks fetched ahead of the writer
_READ = 1 << 20
FALLBACK_MAX_ENTRIES = 1_000_000  # a file system that reports no inode count


@dataclass(frozen=True)
class Wanted:
    """The snapshot the placement records name: its ``object`` key, ``epoch`` and ``format`` ('' when
    recorded by a version that did not sign snapshots)."""

    agent: str
    object: str
    epoch: int
    format: str


def _usage(fd: int) -> tuple[int, int]:
    """Bytes (allocated blocks) and entries under the directory ``fd``, not following links."""
    used = count = 0
    with os.scandir(fd) as it:
        items = [(e.name, e.stat(follow_symlinks=False)) for e in it]
    for name, st in items:
        used += st.st_blocks * 512
        count += 1
        if stat.S_ISDIR(st.st_mode):
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                u, c = _usage(sub)
            finally:
                os.close(sub)
            used, count = used + u, count + c
    return used, count


def capacity(home: Path) -> Limits:
    """What a restore into ``home`` may use: its file system's free blocks and inodes, plus what the
    home holds now (the restore replaces it). For a home with a quota (its own file system), the quota."""
    fd = os.open(home, _DIR_FLAGS)
    try:
        vfs = os.fstatvfs(fd)
        used, count = _usage(fd)
    finally:
        os.close(fd)
    entries = vfs.f_favail + count if vfs.f_files else FALLBACK_MAX_ENTRIES
    return Limits(max_bytes=vfs.f_bavail * vfs.f_frsize + used, max_entries=entries)


def python_has_tarfile_fixes() -> bool:
    """Whether this interpreter has the tarfile extraction fixes of June 2025 (CVE-2025-4517,
    -4138, -4330, -4435, CVE-2024-12718: Python 3.11.13, 3.12.11, 3.13.4 and later), which also
    added ``os.path.ALLOW_MISSING``. The restore never extracts with ``tarfile``; a fixed Python is
    the second wall (``docs/isolation.md``)."""
    return hasattr(os.path, "ALLOW_MISSING")


def empty_home(home: Path, owner: tuple[int, int] | None) -> None:
    """Remove everything in ``home``, as ``owner`` (the agent; None: this process), by descriptors
    (links removed, never followed). What the agent cannot remove (a root-owned ``lost+found`` left
    by ``e2fsck``) is removed by this process, with ``shutil.rmtree``'s descriptor-based walk (it
    never follows a link); no command runs in the home meanwhile (the caller holds its lock)."""
    try:
        with HomeWriter(home, owner, 0, 0) as writer:
            writer.clear()
            writer.finish()
    except WriteRefused as exc:
        if owner is None:
            raise
        log.warning("home %s not emptied as its agent (%s): emptied by the worker", home, exc)
        with os.scandir(home) as it:
            found = [(e.path, e.is_dir(follow_symlinks=False)) for e in it]
        for path, is_dir in found:
            if is_dir:
                shutil.rmtree(path)
            else:
                os.unlink(path)


class _Hashing:
    """A reader of a body after its header: counts and hashes what it gives (``tarfile``'s fileobj)."""

    def __init__(self, raw: Any, skip: bytes):
        self.raw = raw
        self.pending = skip  # bytes read past the header with it
        self.sha = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        if self.pending:
            data, self.pending = (
                (self.pending, b"") if n < 0 or n >= len(self.pending) else (self.pending[:n], self.pending[n:])
            )
        else:
            data = self.raw.read() if n < 0 else self.raw.read(n)
        self.sha.update(data)
        self.count += len(data)
        return data


class Restorer:
    """Restores snapshots of ``store`` signed with ``key`` (module docstring)."""

    def __init__(self, store: SnapshotStore, key: SnapshotKey):
        self.store = store
        self.key = key

    def restore(self, wanted: Wanted, home: Path, owner: tuple[int, int] | None, limits: Limits) -> int:
        """Replace ``home``'s contents with the snapshot ``wanted``, as ``owner`` (the agent's
        ``(uid, gid)``; None: this process's), within ``limits`` (``capacity``). Returns the entries
        written. Raises ``SnapshotRefused`` (the home is untouched when refused before writing, else
        emptied) or ``SnapshotError`` (the store could not be read; the home then is untouched or
        emptied)."""
        expect = {"agent": wanted.agent, "epoch": wanted.epoch, "object": wanted.object}
        if wanted.format == "manifest":
            blob = self.store.get(wanted.object, MAX_MANIFEST_OBJECT, "the snapshot's manifest")
            header, body = self.key.open(blob, expect)
            if header.format != "manifest":
                raise SnapshotRefused(f"{CHANGED} (its format is not the one recorded)")
            listed = ent.decode(_inflate(body))
            ent.check(listed, limits)
            with ThreadPoolExecutor(max_workers=PREFETCH) as pool:
                items = ((e, self._chunks(pool, wanted.agent, e)) for e in listed)
                return self._write(home, owner, limits, items)
        if wanted.format == "tar":
            return self._restore_tar(wanted, expect, home, owner, limits)
        raise SnapshotRefused("it was taken by an earlier version, which did not sign snapshots")

    def chunks_of(self, wanted: Wanted) -> set[str]:
        """The chunks a manifest snapshot references (read back and verified). Raises
        ``SnapshotRefused`` or ``SnapshotError``."""
        expect = {"agent": wanted.agent, "epoch": wanted.epoch, "object": wanted.object}
        blob = self.store.get(wanted.object, MAX_MANIFEST_OBJECT, "the snapshot's manifest")
        _, body = self.key.open(blob, expect)
        return {c.sha256 for e in ent.decode(_inflate(body)) for c in e.chunks}

    # ----- writing -------------------------------------------------------------------------------
    def _write(
        self,
        home: Path,
        owner: tuple[int, int] | None,
        limits: Limits,
        items: Iterator[tuple[Entry, Iterator[tuple[int, bytes]] | None]],
    ) -> int:
        """Empty ``home`` and create each entry of ``items`` in it through a ``HomeWriter``; a file's
        entry comes with an iterator of ``(offset, bytes)``. Empties the home again on any failure."""
        try:
            with HomeWriter(home, owner, limits.max_bytes, limits.max_entries) as writer:
                writer.clear()
                for e, data in items:
                    if e.kind == DIR:
                        writer.mkdir(e.path, e.mode)
                    elif e.kind == LINK:
                        writer.symlink(e.path, e.target)
                    else:
                        writer.open_file(e.path, e.mode, e.size, e.mtime_ns)
                        assert data is not None  # a file's entry comes with its pieces
                        for offset, piece in data:
                            writer.write(offset, piece)
                        writer.close_file()
                report = writer.finish()
            return int(report["entries"])
        except WriteRefused as exc:
            self._empty(home, owner)
            raise SnapshotRefused(f"it could not be written into the home ({exc})") from None
        except BaseException:
            self._empty(home, owner)
            raise

    @staticmethod
    def _empty(home: Path, owner: tuple[int, int] | None) -> None:
        empty_home(home, owner)

    # ----- manifests -----------------------------------------------------------------------------
    def _chunks(self, pool: ThreadPoolExecutor, agent: str, e: Entry) -> Iterator[tuple[int, bytes]]:
        """``(offset, bytes)`` of each chunk of ``e``, fetched ``PREFETCH`` ahead on ``pool``, each checked."""
        window: deque[tuple[int, Future[bytes]]] = deque()
        todo = iter(e.chunks)
        try:
            for c in todo:
                window.append((c.offset, pool.submit(self.store.get_chunk, agent, c)))
                if len(window) >= PREFETCH:
                    break
            while window:
                offset, future = window.popleft()
                nxt = next(todo, None)
                if nxt is not None:
                    window.append((nxt.offset, pool.submit(self.store.get_chunk, agent, nxt)))
                yield offset, future.result()
        finally:
            for _, future in window:
                future.cancel()

    # ----- tar archives --------------------------------------------------------------------------
    def _restore_tar(
        self, wanted: Wanted, expect: dict[str, Any], home: Path, owner: tuple[int, int] | None, limits: Limits
    ) -> int:
        """Two passes over the archive: the first checks the MAC, every member and the body's digest
        (nothing written); the second writes the members the first one listed, in the same order,
        and its digest must match again (else the home is emptied)."""
        header, listed = self._scan_tar(wanted.object, expect, limits)
        raw = self.store.stream(wanted.object, "the snapshot")
        try:
            first = raw.read(MAX_HEADER_BYTES + 200)
            _, offset = self.key.open_header(first, expect)
            body = _Hashing(raw, first[offset:])
            members = _tar_members(body)

            def items() -> Iterator[tuple[Entry, Iterator[tuple[int, bytes]] | None]]:
                for e in listed:
                    if e.kind == DIR and e.whole:  # a directory the archive implied
                        yield e, None
                        continue
                    got, fileobj = next(members, (None, None))
                    if got != e:
                        raise SnapshotRefused(f"{CHANGED} (it changed between two reads)")
                    yield e, _pieces(fileobj) if fileobj is not None else None

            count = self._write(home, owner, limits, items())
            while body.read(_READ):
                pass
            if body.count != header.size or body.sha.hexdigest() != header.sha256:
                self._empty(home, owner)
                raise SnapshotRefused(CHANGED)
            return count
        finally:
            raw.close()

    def _scan_tar(self, key: str, expect: dict[str, Any], limits: Limits) -> tuple[Header, list[Entry]]:
        """The first pass: MAC, every member converted and checked, the body's digest. Nothing written."""
        raw = self.store.stream(key, "the snapshot")
        try:
            first = raw.read(MAX_HEADER_BYTES + 200)
            header, offset = self.key.open_header(first, expect)
            if header.format != "tar":
                raise SnapshotRefused(f"{CHANGED} (its format is not the one recorded)")
            body = _Hashing(raw, first[offset:])
            listed: list[Entry] = []
            totals = ent.Totals()
            for e, _data in _tar_members(body):
                ent.check_path(e.path)  # before its parents are implied: the refusal names the member
                for d in _implicit_parents(e, totals):
                    ent.check([d], limits, totals)
                    listed.append(d)
                ent.check([e], limits, totals)
                listed.append(e)
            while body.read(_READ):
                pass
            if body.count != header.size or body.sha.hexdigest() != header.sha256:
                raise SnapshotRefused(CHANGED)
            return header, listed
        finally:
            raw.close()


_IMPLICIT_MODE = 0o755


def _pieces(fileobj: IO[bytes]) -> Iterator[tuple[int, bytes]]:
    """``(offset, bytes)`` of a tar member's data, a megabyte at a time."""
    offset = 0
    while data := fileobj.read(_READ):
        yield offset, data
        offset += len(data)


def _implicit_parents(e: Entry, totals: ent.Totals) -> list[Entry]:
    """Directories a tar member needs that the archive did not list (``tar`` allows that)."""
    parts = e.path.split("/")[:-1]
    missing: list[Entry] = []
    for i in range(1, len(parts) + 1):
        prefix = "/".join(parts[:i])
        if prefix not in totals.seen and all(m.path != prefix for m in missing):
            missing.append(Entry(DIR, prefix, _IMPLICIT_MODE, whole=True))
    return missing


def _tar_members(body: _Hashing) -> Iterator[tuple[Entry, IO[bytes] | None]]:
    """Each member of a tar.gz stream as an ``Entry`` (and, for a file, its data), in order.
    Refuses (``SnapshotRefused``) hard links, devices, FIFOs, sparse and unknown members; the
    ``Entry`` itself is checked by the caller."""
    try:
        with tarfile.open(fileobj=body, mode="r|gz") as tar:  # type: ignore[call-overload]
            for m in tar:
                name = m.name[2:] if m.name.startswith("./") else m.name
                name = name.rstrip("/") if m.isdir() else name
                if name in ("", ".") and m.isdir():
                    continue
                mode = m.mode & 0o7777
                if m.issym():
                    yield Entry(LINK, name, mode, target=m.linkname), None
                elif m.isdir():
                    yield Entry(DIR, name, mode), None
                elif m.isreg() and not m.issparse():
                    mtime = int(m.mtime * 1e9) if isinstance(m.mtime, (int, float)) and m.mtime >= 0 else 0
                    yield Entry(FILE, name, mode, m.size, whole=True, mtime_ns=mtime), tar.extractfile(m)
                else:
                    what = "a hard link" if m.islnk() else "a device, FIFO or sparse member"
                    raise SnapshotRefused(f"it holds {what} ({m.name[:200]!r}), which a home never restores")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise SnapshotRefused(f"its archive cannot be read ({exc.__class__.__name__}: {str(exc)[:200]})") from None


def _inflate(body: bytes) -> bytes:
    """A manifest's JSON from its deflated body, never more than ``MAX_MANIFEST_JSON`` bytes."""
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(body, MAX_MANIFEST_JSON + 1)
    except zlib.error:
        raise SnapshotRefused(f"{CHANGED} (its manifest is not deflated JSON)") from None
    if len(data) > MAX_MANIFEST_JSON or inflater.unconsumed_tail:
        raise SnapshotRefused("its manifest is larger than any a node writes")
    return data
