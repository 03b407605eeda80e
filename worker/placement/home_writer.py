"""Writes a snapshot's entries into a home, member by member, in a child process that runs as the
agent's own uid (``docs/placement.md``, "Restores").

The parent (a root worker) decodes, verifies and checks the snapshot (``worker.placement.entries``);
this child only creates what it is told, one entry at a time, and cannot do more than the agent
itself could: before it reads anything it becomes the agent's uid and gid with no supplementary
group (``drop_to``: real, effective and saved ids, checked), so the kernel refuses
it every directory the agent cannot write (the homes root, other agents' homes, the node's
metadata) whatever a bug here or in the parent let through. Inside the home it never resolves a
path by name: it receives the home as an open directory descriptor, and opens each component
relative to its parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY``; files are created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` and links with ``symlinkat``, so a link it made (or found) is
never followed. It checks again what the parent checked (components, link targets, permission
bits), and counts what it writes against the byte and entry budgets it was started with.

This file is a program of the standard library only: the parent runs it as
``python -I -S home_writer.py`` (no site, no environment), so nothing of the project's packages or
of the home can be imported into it.

Protocol (stdin): frames of one op byte, a 4-byte big-endian length and a payload. ``C`` empties
the home; ``D`` makes a directory, ``F`` opens a new file, ``L`` makes a link (JSON payloads:
``p`` path, ``m`` mode, ``s`` size, ``t`` a link's target or a file's mtime in ns); ``W`` writes to the open file (an 8-byte offset,
then the bytes); ``E`` ends it (its size, then its mode); ``Z`` finishes (directories get their
modes, deepest first). The child answers once, on stdout, with one JSON line: ``{"ok": true,
"entries": n, "bytes": n}`` or ``{"error": "..."}`` (exit status 1).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_HEAD = struct.Struct(">cI")
_OFFSET = struct.Struct(">Q")
MAX_FRAME = 16 << 20


class WriteRefused(Exception):
    """What the child refused or failed to do (its message)."""


# ----- the child -----------------------------------------------------------------------------


def _parts(path: object) -> list[str]:
    if not isinstance(path, str) or not path or path.startswith("/") or "\x00" in path:
        raise WriteRefused(f"not a path inside the home: {str(path)[:200]!r}")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise WriteRefused(f"not a path inside the home: {path[:200]!r}")
    return parts


def _target_ok(parts: list[str], target: object) -> str:
    if not isinstance(target, str) or not target or target.startswith("/") or "\x00" in target:
        raise WriteRefused(f"a link leading outside the home: {str(target)[:200]!r}")
    depth = len(parts) - 1
    for part in target.split("/"):
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        if depth < 0:
            raise WriteRefused(f"a link leading outside the home: {target[:200]!r}")
    return target


def _clear(dir_fd: int) -> None:
    """Remove everything in the directory ``dir_fd`` (not followed: links are removed, not entered)."""
    with os.scandir(dir_fd) as it:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in names:
        if not is_dir:
            os.unlink(name, dir_fd=dir_fd)
            continue
        sub = os.open(name, _DIR, dir_fd=dir_fd)
        try:
            os.fchmod(sub, 0o700)  # a directory the agent made read-only
            _clear(sub)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=dir_fd)


class _Child:
    def __init__(self, home_fd: int, max_bytes: int, max_entries: int):
        self.home = home_fd
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.written = 0
        self.entries = 0
        self.parent: tuple[tuple[str, ...], int] = ((), home_fd)
        self.file: tuple[int, dict[str, Any]] | None = None
        self.dirs: list[tuple[list[str], int]] = []

    def dir_of(self, parts: list[str]) -> int:
        """The descriptor of the directory holding ``parts[-1]``, opened from the home component by
        component (``O_NOFOLLOW``), the last one kept."""
        key = tuple(parts[:-1])
        if self.parent[0] == key:
            return self.parent[1]
        if self.parent[1] != self.home:
            os.close(self.parent[1])
        self.parent = ((), self.home)
        fd = self.home
        try:
            for part in key:
                nxt = os.open(part, _DIR, dir_fd=fd)
                if fd != self.home:
                    os.close(fd)
                fd = nxt
        except BaseException:
            if fd != self.home:
                os.close(fd)
            raise
        self.parent = (key, fd)
        return fd

    def count(self) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise WriteRefused(f"more than {self.max_entries} entries")

    def op(self, code: bytes, payload: bytes) -> bool:
        if code == b"W":
            if self.file is None:
                raise WriteRefused("data without a file")
            (offset,) = _OFFSET.unpack_from(payload)
            data = memoryview(payload)[_OFFSET.size :]
            fd, meta = self.file
            if offset + len(data) > meta["s"]:
                raise WriteRefused("data past the end of its file")
            self.written += len(data)
            if self.written > self.max_bytes:
                raise WriteRefused(f"more than {self.max_bytes} bytes of data")
            while data:
                n = os.pwrite(fd, data, offset)
                data, offset = data[n:], offset + n
            return True
        if code == b"E":
            if self.file is None:
                raise WriteRefused("the end of no file")
            fd, meta = self.file
            self.file = None
            try:
                os.ftruncate(fd, meta["s"])  # a hole at the end stays a hole
                os.fchmod(fd, meta["m"])
                mtime = meta.get("t", 0)
                if isinstance(mtime, int) and mtime > 0:
                    os.utime(fd, ns=(mtime, mtime))
            finally:
                os.close(fd)
            return True
        if code == b"C":
            _clear(self.home)
            return True
        if code == b"Z":
            for parts, mode in reversed(self.dirs):
                parent = self.dir_of(parts)
                fd = os.open(parts[-1], _DIR, dir_fd=parent)
                try:
                    os.fchmod(fd, mode)
                finally:
                    os.close(fd)
            return False
        meta = json.loads(payload)
        parts = _parts(meta.get("p"))
        mode = meta.get("m", 0o644)
        if not isinstance(mode, int) or mode & ~0o777:
            raise WriteRefused(f"the mode {mode!r} of {meta.get('p')!r}")
        meta["m"] = mode
        parent = self.dir_of(parts)
        self.count()
        if code == b"D":
            os.mkdir(parts[-1], 0o700, dir_fd=parent)
            self.dirs.append((parts, mode))
        elif code == b"L":
            os.symlink(_target_ok(parts, meta.get("t")), parts[-1], dir_fd=parent)
        elif code == b"F":
            if self.file is not None:
                raise WriteRefused("a file inside a file")
            size = meta.get("s")
            if not isinstance(size, int) or not 0 <= size <= 1 << 44:
                raise WriteRefused(f"the size {size!r} of {meta.get('p')!r}")
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self.file = (os.open(parts[-1], flags, 0o600, dir_fd=parent), meta)
        else:
            raise WriteRefused(f"unknown op {code!r}")
        return True


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise WriteRefused("the parent stopped in the middle of a frame")
    return data


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid``:``gid`` with no supplementary group, for good (real, effective and saved ids),
    and check it. Raises ``WriteRefused``."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid) or os.getgroups():
        raise WriteRefused(f"could not become {uid}:{gid}")


def child_main(argv: list[str]) -> int:
    """``home_writer.py HOME_FD MAX_BYTES MAX_ENTRIES [UID GID]``: become the agent (when given), then
    apply the frames on stdin (module docstring)."""
    out = sys.stdout
    try:
        if len(argv) >= 5:
            # First of all: the interpreter started as the worker (it may live where the agent cannot
            # read); from here on, nothing runs with more rights than the agent's.
            drop_to(int(argv[3]), int(argv[4]))
        os.umask(0o077)
        child = _Child(int(argv[0]), int(argv[1]), int(argv[2]))
        stream = sys.stdin.buffer
        going = True
        while going:
            head = stream.read(_HEAD.size)
            if not head:
                raise WriteRefused("the parent stopped before the end")
            if len(head) < _HEAD.size:
                head += _read_exact(stream, _HEAD.size - len(head))
            code, length = _HEAD.unpack(head)
            if length > MAX_FRAME:
                raise WriteRefused("a frame too large")
            going = child.op(code, _read_exact(stream, length) if length else b"")
        out.write(json.dumps({"ok": True, "entries": child.entries, "bytes": child.written}) + "\n")
        return 0
    except BaseException as exc:  # everything the parent should hear about, in one line
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        code = errno.errorcode.get(exc.errno or 0, "") if isinstance(exc, OSError) else ""
        out.write(json.dumps({"error": f"{type(exc).__name__}: {reason}", "errno": code}) + "\n")
        return 1
    finally:
        out.flush()


# ----- the parent's side ------------------------------------------------------------------------


class HomeWriter:
    """A child writing into ``home`` as ``owner`` (``(uid, gid)``; None: this process's own ids),
    within ``max_bytes`` of data and ``max_entries`` entries. Raises ``WriteRefused`` from any
    method once the child has refused or failed (with its reason); ``close()`` always."""

    def __init__(self, home: Path, owner: tuple[int, int] | None, max_bytes: int, max_entries: int):
        fd = os.open(home, _DIR)
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise WriteRefused(f"{home} is not a directory")
            ids = [str(owner[0]), str(owner[1])] if owner is not None and os.geteuid() == 0 else []
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", __file__, str(fd), str(max_bytes), str(max_entries), *ids],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                pass_fds=(fd,),
                env={},
                cwd="/",
            )
        finally:
            os.close(fd)
        assert self.proc.stdin is not None
        self._in = self.proc.stdin
        self._failed: str | None = None

    def _send(self, code: bytes, payload: bytes = b"") -> None:
        if self._failed is not None:
            raise WriteRefused(self._failed)
        try:
            self._in.write(_HEAD.pack(code, len(payload)))
            if payload:
                self._in.write(payload)
        except (BrokenPipeError, ValueError):
            raise WriteRefused(self._answer().get("error", "the writer stopped")) from None

    def _answer(self) -> dict[str, Any]:
        try:
            self._in.close()
        except OSError:
            pass
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        self.proc.wait()
        try:
            answer: dict[str, Any] = json.loads(line) if line else {"error": f"exit status {self.proc.returncode}"}
        except ValueError:
            answer = {"error": f"unreadable answer {line[:200]!r}"}
        if "error" in answer:
            self._failed = str(answer["error"])
        return answer

    def clear(self) -> None:
        """Empty the home."""
        self._send(b"C")

    def mkdir(self, path: str, mode: int) -> None:
        self._send(b"D", json.dumps({"p": path, "m": mode}).encode())

    def symlink(self, path: str, target: str) -> None:
        self._send(b"L", json.dumps({"p": path, "t": target}).encode())

    def open_file(self, path: str, mode: int, size: int, mtime_ns: int = 0) -> None:
        self._send(b"F", json.dumps({"p": path, "m": mode, "s": size, "t": mtime_ns}).encode())

    def write(self, offset: int, data: bytes | memoryview) -> None:
        view = memoryview(data)
        step = MAX_FRAME - _OFFSET.size
        for start in range(0, len(view), step):
            piece = view[start : start + step]
            self._send(b"W", _OFFSET.pack(offset + start) + bytes(piece))

    def close_file(self) -> None:
        self._send(b"E")

    def finish(self) -> dict[str, Any]:
        """Apply the directories' modes and end: the child's report (``entries``, ``bytes``).
        Raises ``WriteRefused``."""
        self._send(b"Z")
        answer = self._answer()
        if "error" in answer:
            raise WriteRefused(str(answer["error"]))
        return answer

    def close(self) -> None:
        """End the child if it still runs (after an error on the parent's side)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass

    def __enter__(self) -> HomeWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
