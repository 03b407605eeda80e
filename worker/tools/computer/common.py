"""Shared by the computer tools: error results, labels, errno phrases, kinds of special files."""

from __future__ import annotations

import errno
import functools
import stat
from typing import Callable

from worker.tooling.contract import ToolResult


def fail(message: str, **details: object) -> ToolResult:
    """A computer tool's own error: the model reads ``message``; ``details.error`` is the class
    ``tool_error`` (``worker.turn.metrics``), ``details.message`` the text."""
    return ToolResult(content=message, details={"error": "tool_error", "message": message, **details}, is_error=True)


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
    errno.ENOSPC: "no space left: the agent home is full (its disk quota, AGENT_HOME_QUOTA_MB, is used up)",
    errno.EDQUOT: "no space left: the agent home is full (its disk quota, AGENT_HOME_QUOTA_MB, is used up)",
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


# Bytes sniffed to tell a binary file (one with a NUL byte) from text.
BINARY_SNIFF_BYTES = 8192


# Directories skipped by recursive listing and search (noise, not secrets).
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"})
