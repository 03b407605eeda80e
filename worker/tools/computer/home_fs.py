"""Race-free file access inside the agent home: resolution from a descriptor of the home, one component at a time.

Checking a path and then opening it by name can be raced: between the two,
a parent directory is swapped for a symlink to elsewhere and the open follows
it (an attack once got 708 reads outside the home in 3,000 calls: docs/isolation.md, "Files"). Here nothing is
ever opened by a path that the kernel resolves on its own:

- the home is opened once (``O_DIRECTORY | O_NOFOLLOW``); every component is
  then opened relative to the descriptor of its parent with ``O_NOFOLLOW``,
  so the kernel never follows a symlink for us;
- a symlink met on the way (the open fails with ``ELOOP``/``ENOTDIR`` and
  ``readlinkat`` succeeds) is followed *by this module*: its target is
  resolved against the directories already held open (``..`` pops one;
  ``..`` above the home, or an absolute target outside it, raises the
  symlink refusal of ``confine``). Symlinks inside the home that stay inside
  keep working, as before; at most ``MAX_SYMLINK_HOPS`` are followed;
- the caller acts only on the descriptor returned (``fstat`` it, read or
  write through it, ``os.scandir(fd)``, ``walk`` by descriptors, rename with
  ``src_dir_fd``/``dst_dir_fd``).

Rules applied by the callers through ``require_lone_regular``: only regular
files are read or written (FIFOs, sockets and devices are refused; opens are
``O_NONBLOCK`` so a FIFO never blocks) and a regular file with more than one
hard link is refused (a hard link made from outside the home looks like any
other file inside it; ``st_nlink`` is the only tell).

Errors: ``ConfinementError`` (lexical rules and symlink escapes, with the
messages of ``confine``); ``OSError`` subclasses carrying the path relative
to the home as ``filename`` (``FileNotFoundError``, ``IsADirectoryError``,
``NotADirectoryError``, ``NotRegularFile``, ``HardLinkedFile``...).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from worker.tools.computer.common import NotRegularFile, kind
from worker.tools.computer.confine import lexical_parts, symlink_escape

# Symlinks followed in one resolution (Linux's own limit, MAXSYMLINKS).
MAX_SYMLINK_HOPS = 40
# A component that is neither a symlink nor what the open expected, yet changes
# under us (a swap in progress), is tried again this many times.
MAX_RETRIES = 100

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW | _NONBLOCK | _CLOEXEC


_owner = threading.local()


@contextlib.contextmanager
def owned_by(owner: tuple[int, int] | None) -> Iterator[None]:
    """In this thread, what ``HomeDir`` creates (files, directories, temporary files) is given to
    ``owner`` (``(uid, gid)``; the agent's host uid, ``homes.AgentHome.as_owner``) with ``fchown``.
    ``None``: left to the worker's uid. Per thread: concurrent calls in other threads are unaffected."""
    previous = getattr(_owner, "value", None)
    _owner.value = owner
    try:
        yield
    finally:
        _owner.value = previous


def _give(fd: int, name: str | None = None) -> None:
    """Give ``fd`` (or ``name`` in the directory ``fd``, not followed) to the thread's owner, if any."""
    owner = getattr(_owner, "value", None)
    if owner is None:
        return
    if name is None:
        os.fchown(fd, *owner)
    else:
        os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)


class HardLinkedFile(NotRegularFile):
    """A regular file with ``st_nlink > 1``: one of its names may lie outside the home, so it is refused."""


def require_lone_regular(st: os.stat_result, rel: str) -> None:
    """Raise unless ``st`` (from ``fstat`` of an opened descriptor) is a regular file with one link.

    ``NotRegularFile`` for a directory, FIFO, socket or device (``strerror``
    reads "a FIFO (named pipe), not a regular file"); ``HardLinkedFile`` for
    ``st_nlink > 1`` (``strerror`` reads "a file with 2 hard links ...").
    Tools render ``f"{rel} is {exc.strerror}; not read"``.
    """
    if not stat.S_ISREG(st.st_mode):
        raise NotRegularFile(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file", rel)
    if st.st_nlink > 1:
        raise HardLinkedFile(
            errno.EPERM, f"a file with {st.st_nlink} hard links (another name may lie outside the agent home)", rel
        )


@dataclass
class Opened:
    """A descriptor opened inside the home. Close it (or use ``with``)."""

    fd: int
    rel: str  # its real path relative to the home ("." for the home), for messages
    st: os.stat_result  # fstat of ``fd``
    created: bool = False  # ``O_CREAT`` made a new file

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Opened:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _directory_again(exc: OSError, dir_fd: int, name: str, missing: str) -> bool:
    """After ``readlink`` failed with ``exc`` on what ``O_NOFOLLOW`` refused: True when ``name`` is a
    directory again (a swap in progress). Raises ``FileNotFoundError`` (``missing``) when it is gone,
    and ``exc`` for any error but EINVAL (not a symlink)."""
    if exc.errno == errno.ENOENT:
        raise FileNotFoundError(errno.ENOENT, "no such file or directory", missing) from None
    if exc.errno != errno.EINVAL:
        raise exc
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return stat.S_ISDIR(st.st_mode)


class HomeDir:
    """The agent home held open by a descriptor; resolves and opens paths inside it.

    ``HomeDir(home)`` creates the home if missing and opens its real path.
    Use as a context manager (closes the descriptor). Not shared between threads.
    """

    def __init__(self, home: Path | str):
        self.home = home
        self.root, _ = lexical_parts(home, ".")
        self.fd = os.open(self.root, DIR_FLAGS)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HomeDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def rel(self, path: str | None) -> str:
        """The lexical form of ``path`` relative to the home ("." for the home); raises like ``lexical_parts``."""
        return "/".join(lexical_parts(self.home, path, root=self.root)[1]) or "."

    def open(
        self, path: str | None, flags: int = os.O_RDONLY, *, mode: int = 0o644, create_dirs: bool = False
    ) -> Opened:
        """Open ``path`` (as given by the model) inside the home, following only symlinks that stay inside.

        ``flags``: ``os.O_RDONLY``, ``O_WRONLY``, ``O_RDWR``, optionally with
        ``O_CREAT`` (a missing file is created with ``O_EXCL`` and ``mode``;
        ``Opened.created`` says so) and ``O_DIRECTORY``. ``O_NOFOLLOW``,
        ``O_NONBLOCK`` and ``O_CLOEXEC`` are always added; the descriptor is
        left non-blocking for directories and made blocking for regular files.
        ``create_dirs`` makes missing parent directories (mode 0755), and the
        target too when ``flags`` has ``O_DIRECTORY``.
        A FIFO, socket or device is refused (``NotRegularFile``) before it is
        opened, and again after (``fstat``) should it have been swapped in.
        Raises ``ConfinementError`` or ``OSError`` (see the module docstring).
        """
        raw = ("." if path is None else str(path)).strip() or "."
        _, parts = lexical_parts(self.home, path, root=self.root)
        stack: list[tuple[int, str]] = []  # directories held open below the home: (fd, name)
        pending = list(reversed(parts))  # components still to resolve, next one last
        hops = retries = 0

        def rel_of(name: str = "", rest: bool = False) -> str:
            names = [n for _, n in stack] + ([name] if name else []) + (list(reversed(pending)) if rest else [])
            return "/".join(n for n in names if n not in ("", ".")) or "."

        try:
            while True:
                cur = stack[-1][0] if stack else self.fd
                if not pending:  # the target is a directory already held (the home, or via a symlink to one)
                    try:
                        fd = os.open(".", (flags & ~os.O_CREAT) | _NONBLOCK | _CLOEXEC, dir_fd=cur)
                    except OSError as exc:
                        raise type(exc)(exc.errno, exc.strerror, rel_of()) from None
                    return self._finish(fd, rel_of())
                name = pending.pop()
                if name in ("", "."):
                    continue
                if name == "..":  # only from a symlink target: the lexical check removed the model's own
                    if not stack:
                        raise symlink_escape(raw)
                    os.close(stack.pop()[0])
                    continue
                last = not pending
                try:
                    if not last:
                        stack.append((os.open(name, DIR_FLAGS, dir_fd=cur), name))
                        continue
                    return self._open_final(cur, name, flags, mode, rel_of(name))
                except (FileNotFoundError, NotADirectoryError) as exc:
                    missing = isinstance(exc, FileNotFoundError)
                    if missing and create_dirs and (not last or flags & os.O_DIRECTORY):
                        try:
                            os.mkdir(name, 0o755, dir_fd=cur)
                            _give(cur, name)
                        except FileExistsError:
                            pass
                        pending.append(name)
                        continue
                    if missing:
                        raise FileNotFoundError(errno.ENOENT, "no such file or directory", rel_of(name, True)) from None
                    failure: OSError = exc
                except OSError as exc:
                    if exc.errno != errno.ELOOP:
                        raise type(exc)(exc.errno, exc.strerror, rel_of(name)) from None
                    failure = exc
                # ELOOP or ENOTDIR with O_NOFOLLOW: a symlink, or not a directory, or a swap in progress.
                try:
                    target = os.readlink(name, dir_fd=cur)
                except OSError as exc:
                    retries += 1
                    if _directory_again(exc, cur, name, rel_of(name, True)) and retries <= MAX_RETRIES:
                        pending.append(name)  # swapped back to a directory meanwhile: try again
                        continue
                    raise type(failure)(failure.errno, failure.strerror, rel_of(name)) from None
                hops += 1
                if hops > MAX_SYMLINK_HOPS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", rel_of(name))
                self._follow(target, raw, stack, pending)
        finally:
            for fd, _ in stack:
                os.close(fd)

    def _follow(self, target: str, raw: str, stack: list[tuple[int, str]], pending: list[str]) -> None:
        """Go on through a symlink's ``target``: an absolute one restarts from the home (confined by
        ``lexical_parts``, else ``symlink_escape``), a relative one resolves where the link stands."""
        if os.path.isabs(target):
            try:
                _, target_parts = lexical_parts(self.home, target, root=self.root)
            except (ValueError, OSError):
                raise symlink_escape(raw) from None
            while stack:
                os.close(stack.pop()[0])
            pending.extend(reversed(target_parts))
        else:
            pending.extend(reversed(target.split("/")))

    def _open_final(self, dir_fd: int, name: str, flags: int, mode: int, rel: str) -> Opened:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise NotRegularFile(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file", rel)
        base = (flags & ~os.O_CREAT & ~os.O_EXCL) | _NOFOLLOW | _NONBLOCK | _CLOEXEC
        created = False
        try:
            fd = os.open(name, base, dir_fd=dir_fd)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
            # O_EXCL: if a symlink or anything else appeared meanwhile, fail rather than follow it.
            fd = os.open(name, base | os.O_CREAT | os.O_EXCL, mode, dir_fd=dir_fd)
            created = True
            try:
                _give(fd)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # a FIFO without a reader, or a socket, swapped in
                raise NotRegularFile(errno.ENXIO, "a FIFO or socket, not a regular file", rel) from None
            raise
        return self._finish(fd, rel, created)

    @staticmethod
    def _finish(fd: int, rel: str, created: bool = False) -> Opened:
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                os.set_blocking(fd, True)
            elif not stat.S_ISDIR(st.st_mode):
                raise NotRegularFile(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file", rel)
        except BaseException:
            os.close(fd)
            raise
        return Opened(fd, rel, st, created)

    def leads_inside(self, path: str) -> bool:
        """True unless resolving ``path`` (e.g. a symlink's own path) leaves the home. Informational only."""
        try:
            self.open(path).close()
        except (ValueError, OSError) as exc:
            return not isinstance(exc, ValueError)
        return True

    def read_bytes(self, path: str, limit: int | None = None) -> tuple[str, bytes]:
        """``(rel, content)`` of a lone regular file (see ``require_lone_regular``), at most ``limit`` bytes."""
        with self.open(path) as f:
            require_lone_regular(f.st, f.rel)
            return f.rel, read_fd(f.fd, limit)

    def write_atomic(self, path: str, data: bytes | Callable[[BinaryIO], object], mode: int = 0o644) -> str:
        """Replace ``path`` with ``data`` atomically; returns the path relative to the home.

        ``data``: the bytes, or a function writing them to the binary file it
        is given (a stream: nothing is held in memory here). The parent
        directory is resolved (and created) as ``open`` does; the content goes
        to a new temporary name in it (``O_EXCL | O_NOFOLLOW``, permission bits
        ``mode & 0o777`` whatever the umask), then ``os.replace`` with both
        ``dir_fd``s renames it over the name. A symlink or hard link at the
        name is replaced, never written through. On any error (``ENOSPC`` at
        the home's quota...) the temporary file is removed and ``path`` is
        left as it was.
        """
        _, parts = lexical_parts(self.home, path, root=self.root)
        if not parts:
            raise IsADirectoryError(errno.EISDIR, "is a directory", ".")
        parent = "/".join(parts[:-1]) or "."
        with self.open(parent, os.O_RDONLY | os.O_DIRECTORY, create_dirs=True) as d:
            if not stat.S_ISDIR(d.st.st_mode):
                raise NotADirectoryError(errno.ENOTDIR, "not a directory", d.rel)
            name = parts[-1]
            tmp = f".{name}.{secrets.token_hex(6)}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode, dir_fd=d.fd)
            try:
                with os.fdopen(fd, "wb") as fh:
                    _give(fd)
                    os.fchmod(fd, mode & 0o777)
                    if callable(data):
                        data(fh)
                    else:
                        fh.write(data)
                os.replace(tmp, name, src_dir_fd=d.fd, dst_dir_fd=d.fd)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=d.fd)
                except OSError:
                    pass
                raise
            return name if d.rel == "." else f"{d.rel}/{name}"


def read_fd(fd: int, limit: int | None = None) -> bytes:
    """Read ``fd`` from offset 0 to its end (or ``limit`` bytes) with ``pread``."""
    chunks: list[bytes] = []
    offset = 0
    while limit is None or offset < limit:
        want = 1 << 16 if limit is None else min(1 << 16, limit - offset)
        chunk = os.pread(fd, want, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def walk(top: Opened) -> Iterator[tuple[str, int, list[str], list[str]]]:
    """Walk the directory ``top`` by descriptors: yields ``(rel_dir, dir_fd, dirnames, othernames)``.

    Like ``os.walk(topdown=True)``: ``rel_dir`` is ``""`` for ``top`` itself
    and ``"a/b"`` below it; both name lists are sorted; ``dirnames`` holds real
    subdirectories only (symlinks, to directories or not, are in
    ``othernames``); prune ``dirnames`` in place to skip some. Each subdirectory is opened relative to
    its parent's descriptor with ``O_NOFOLLOW | O_DIRECTORY``, so a directory
    swapped for a symlink meanwhile is skipped, never followed. ``dir_fd`` is
    valid until the next iteration.
    """

    def visit(fd: int, rel: str) -> Iterator[tuple[str, int, list[str], list[str]]]:
        dirs: list[str] = []
        others: list[str] = []
        with os.scandir(fd) as it:
            for entry in it:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    continue
                (dirs if is_dir else others).append(entry.name)
        dirs.sort()
        others.sort()
        yield rel, fd, dirs, others
        for name in list(dirs):
            try:
                sub = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue
            try:
                yield from visit(sub, f"{rel}/{name}" if rel else name)
            finally:
                os.close(sub)

    yield from visit(top.fd, "")
