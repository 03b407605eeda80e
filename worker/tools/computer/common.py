"""Shared by the computer tools: error results, labels, and opening only regular files."""

from __future__ import annotations

import errno
import functools
import os
import stat
from pathlib import Path
from typing import IO, Callable

from worker.tooling.contract import ToolResult


def fail(message: str, **details: object) -> ToolResult:
    return ToolResult(content=message, details={"error": message, **details}, is_error=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


ERRNO_PHRASES = {
    errno.ENAMETOOLONG: "path too long",
    errno.ELOOP: "too many levels of symbolic links",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a parent of the path is not a directory",
    errno.ENOENT: "no such file or directory",
    errno.EISDIR: "is a directory",
    errno.ENOSPC: "no space left on the device",
    errno.EROFS: "read-only file system",
    errno.EEXIST: "already exists",
    errno.ENXIO: "not a regular file (no such device or address)",
    errno.EINVAL: "invalid path",
}


def os_reason(exc: OSError) -> str:
    """A short, model-facing phrase for an ``OSError`` ("path too long", "permission denied"...)."""
    return ERRNO_PHRASES.get(exc.errno or 0) or exc.strerror or str(exc)


def shown_arg(params: object) -> str:
    for name in ("path", "cwd"):
        value = getattr(params, name, None)
        if isinstance(value, str) and value:
            return value if len(value) <= 80 else value[:77] + "..."
    return ""


def guarded(fn: Callable[..., ToolResult]) -> Callable[..., ToolResult]:
    """Turn an ``OSError`` escaping a tool body (a user's path the OS rejects) into an error result."""

    @functools.wraps(fn)
    def run(params: object, *args: object) -> ToolResult:
        try:
            return fn(params, *args)
        except OSError as exc:
            where = shown_arg(params)
            reason = os_reason(exc)
            return fail(f"{where}: {reason}" if where else reason, errno=exc.errno)

    return run


class NotRegularFile(OSError):
    """The path names a FIFO, device, socket or directory, not a regular file."""


def kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "a special file"


def open_regular(path: Path, mode: str = "r", **kwargs: object) -> IO:
    """Open ``path`` for reading only if it is a regular file; never blocks on a FIFO.

    The file is opened with ``O_NONBLOCK`` (opening a FIFO for reading then
    returns at once instead of waiting for a writer) and ``O_NOFOLLOW`` on the
    final component, and the *opened* file is checked with ``fstat``; anything
    but a regular file raises ``NotRegularFile``. ``mode`` is ``"r"`` or
    ``"rb"``; ``kwargs`` go to ``os.fdopen``.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{kind(st.st_mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def not_regular_reason(path: Path) -> str | None:
    """Why an *existing* ``path`` is not a regular file, or ``None`` (regular, or missing)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    return kind(st.st_mode)


# Bytes sniffed to tell a binary file (one with a NUL byte) from text.
BINARY_SNIFF_BYTES = 8192


def is_binary(path: Path) -> bool:
    """True when the first bytes hold a NUL. Raises ``NotRegularFile`` for special files."""
    with open_regular(path, "rb") as fh:
        return b"\x00" in fh.read(BINARY_SNIFF_BYTES)
