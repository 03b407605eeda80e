"""Computer tools: a shell command tool and file tools, confined to the agent home.

``create_computer_tools(ctx)`` returns, in this order:

- ``run_command`` (sequential, destructive): ``bash -c <command>`` with cwd
  in the home, a minimal environment (no worker secrets), a timeout capped by
  ``settings.command_timeout`` and output capped by
  ``settings.command_output_cap``. A command's lifetime bounds all of its
  descendants: background processes (``cmd &``, ``nohup``, ``setsid``,
  double forks) are stopped when the command ends, times out or is aborted
  (see ``_RUNNER``).
- ``read_file`` (parallel, read-only): lines ``offset..offset+limit-1``.
  Only regular files are read (a FIFO, device or socket is refused, never
  opened in a blocking way).
- ``write_file`` (sequential, destructive): creates parent directories;
  refuses to write to an existing non-regular file.
- ``edit_file`` (sequential, destructive): exact string replacement.
- ``list_files`` (parallel, read-only): a directory listing, optionally recursive.
- ``search_files`` (parallel, read-only): regex or substring search, with the
  ``regex`` package so that each match attempt has a timeout (a
  catastrophically backtracking pattern ends with "pattern too slow").

Every path goes through ``worker.tools.confine.resolve_in_home``. User errors
(bad paths, missing files, ambiguous edits, special files, names too long
for the file system) come back as ``ToolResult(is_error=True)`` with a message
for the model; ``execute`` does not raise for them (an ``OSError`` escaping a
tool body is turned into such a result by ``_guarded``).
"""

from __future__ import annotations

import errno
import fnmatch
import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import IO, Callable, Iterator

import regex
from pydantic import BaseModel, Field

from worker.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.settings import Settings
from worker.tools.confine import ConfinementError, display_path, home_root, is_inside_home, resolve_in_home
from worker.turn_context import TurnContext

# Reads: default/maximum lines per call, longest line kept, bytes sniffed for binary.
READ_DEFAULT_LINES = 2000
READ_MAX_LINE_CHARS = 2000
BINARY_SNIFF_BYTES = 8192
# Listing and search caps.
LIST_DEFAULT_ENTRIES = 200
LIST_MAX_ENTRIES = 2000
SEARCH_DEFAULT_RESULTS = 100
SEARCH_MAX_RESULTS = 1000
SEARCH_MAX_FILE_BYTES = 2_000_000
SEARCH_MAX_LINE_CHARS = 300
SEARCH_TIME_BUDGET = 20.0  # seconds
# Longest one regex search over one line may take (also bounded by what is left of the budget).
SEARCH_PATTERN_TIMEOUT = 2.0  # seconds
# Directories skipped by recursive listing and search (noise, not secrets).
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"})
# Grace between SIGTERM and SIGKILL when killing a command's process group.
KILL_GRACE = 1.0
# After the shell exits, how long to wait for background children to release the output pipe.
PIPE_DRAIN_GRACE = 0.5
# Grace between SIGTERM and SIGKILL for background processes left when the shell exits.
LEFTOVER_GRACE = 0.3

# Environment variables copied from the worker into commands: locale and
# terminal only. Everything else (API keys, Redis URLs, cloud credentials) is
# left out by construction; PATH, HOME and the like are set explicitly.
ENV_PASSTHROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _fail(message: str, **details: object) -> ToolResult:
    return ToolResult(content=message, details={"error": message, **details}, is_error=True)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _count_lines(text: str) -> int:
    if not text:
        return 0
    return text.count("\n") + (0 if text.endswith("\n") else 1)


_ERRNO_PHRASES = {
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


def _os_reason(exc: OSError) -> str:
    """A short, model-facing phrase for an ``OSError`` ("path too long", "permission denied"...)."""
    return _ERRNO_PHRASES.get(exc.errno or 0) or exc.strerror or str(exc)


def _shown_arg(params: object) -> str:
    for name in ("path", "cwd"):
        value = getattr(params, name, None)
        if isinstance(value, str) and value:
            return value if len(value) <= 80 else value[:77] + "..."
    return ""


def _guarded(fn: Callable[..., ToolResult]) -> Callable[..., ToolResult]:
    """Turn an ``OSError`` escaping a tool body (a user's path the OS rejects) into an error result."""

    @functools.wraps(fn)
    def run(params: object, *args: object) -> ToolResult:
        try:
            return fn(params, *args)
        except OSError as exc:
            where = _shown_arg(params)
            reason = _os_reason(exc)
            return _fail(f"{where}: {reason}" if where else reason, errno=exc.errno)

    return run


class NotRegularFile(OSError):
    """The path names a FIFO, device, socket or directory, not a regular file."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device file"
    return "a special file"


def _open_regular(path: Path, mode: str = "r", **kwargs: object) -> IO:
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
            raise NotRegularFile(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def _not_regular_reason(path: Path) -> str | None:
    """Why an *existing* ``path`` is not a regular file, or ``None`` (regular, or missing)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    if stat.S_ISREG(st.st_mode):
        return None
    return _kind(st.st_mode)


# --------------------------------------------------------------------------- run_command


def command_env(home: Path, settings: Settings) -> dict[str, str]:
    """The environment a command runs with: an allowlist, not ``os.environ``.

    ``PATH`` is the worker's ``PATH`` (directories, not secrets) with the
    optional ``settings.command_extra_path`` (``os.pathsep``-separated,
    e.g. where ``mcporter`` is installed) in front; ``HOME`` is the agent
    home; ``LANG``/``LC_*``/``TZ`` are copied; ``TERM=dumb`` and
    ``NO_COLOR=1`` keep output plain.
    """
    path = os.environ.get("PATH") or DEFAULT_PATH
    extra = settings.command_extra_path
    if extra:
        path = os.pathsep.join([p for p in extra.split(os.pathsep) if p] + [path])
    env = {
        "PATH": path,
        "HOME": str(home),
        "USER": "agent",
        "LOGNAME": "agent",
        "SHELL": "/bin/bash",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "LANG": "C.UTF-8",
    }
    for name in ENV_PASSTHROUGH:
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


class _CappedSink:
    """Keeps the first and last ``cap // 2`` bytes of a stream and counts the rest."""

    def __init__(self, cap: int):
        self.head_cap = max(cap // 2, 0)
        self.tail_cap = max(cap - self.head_cap, 0)
        self.head = bytearray()
        self.tail: deque[bytes] = deque()
        self.tail_len = 0
        self.total = 0

    def feed(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not chunk or self.tail_cap == 0:
            return
        self.tail.append(chunk)
        self.tail_len += len(chunk)
        while self.tail_len - len(self.tail[0]) >= self.tail_cap:
            self.tail_len -= len(self.tail.popleft())

    def render(self) -> tuple[str, int]:
        """(text, bytes cut). The marker names how many bytes were left out."""
        tail = b"".join(self.tail)
        if len(tail) > self.tail_cap:
            tail = tail[len(tail) - self.tail_cap :]
        cut = self.total - len(self.head) - len(tail)
        head_text = self.head.decode("utf-8", errors="replace")
        tail_text = tail.decode("utf-8", errors="replace")
        if cut <= 0:
            return head_text + tail_text, 0
        marker = (
            f"\n[... {cut:,} bytes of output cut (output cap {self.head_cap + self.tail_cap:,} bytes; "
            f"showing the first and last part) ...]\n"
        )
        return head_text + marker + tail_text, cut


def _kill_group(proc: subprocess.Popen, grace: float = KILL_GRACE) -> None:
    """SIGTERM the process group, then SIGKILL it after ``grace`` seconds."""
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = proc.pid  # leader already reaped: its group id is its pid (start_new_session)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return
        if wait:
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


# The command runner: a tiny Python program (run as ``python -I -S -c _RUNNER
# <grace> <leftover_grace> <shell> -c <command>``) between the worker and the
# shell. It makes *itself* a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``,
# Linux), so every orphaned descendant of the command (``cmd &`` after the
# shell exits, ``setsid``, ``nohup``, double forks) is reparented to it rather
# than to init and stays findable through ``/proc/*/stat`` ppid chains. When
# the shell exits, the runner SIGTERMs whatever is left, SIGKILLs it after a
# short grace, repeats until it has no descendants, and exits with the shell's
# status. On SIGTERM (the worker's timeout or abort) it does the same to the
# whole tree, shell included. The worker itself never becomes a subreaper.
_RUNNER = r"""
import os, signal, sys, time
grace, leftover_grace, argv = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
me = os.getpid()
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
except Exception:
    pass
class Stop(Exception):
    pass
def on_term(signum, frame):
    raise Stop()
signal.signal(signal.SIGTERM, on_term)
shell_pid, shell_status, stopped = None, None, False
def descendants():
    children = {}
    try:
        names = os.listdir('/proc')
    except OSError:
        return []
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open('/proc/' + name + '/stat', 'rb') as fh:
                data = fh.read()
            fields = data[data.rindex(b')') + 2:].split()
            children.setdefault(int(fields[1]), []).append((int(name), fields[0] == b'Z'))
        except (OSError, ValueError, IndexError):
            continue
    found, todo = [], [me]
    while todo:
        for pid, zombie in children.get(todo.pop(), ()):
            found.append((pid, zombie))
            todo.append(pid)
    return found
def reap():
    global shell_status
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == shell_pid:
            shell_status = status
def live():
    reap()
    return [pid for pid, zombie in descendants() if not zombie]
def signal_all(sig):
    pids = live()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    return pids
def wait_gone(seconds):
    end = time.monotonic() + seconds
    while live() and time.monotonic() < end:
        time.sleep(0.02)
try:
    shell_pid = os.posix_spawn(argv[0], argv, os.environ,
                               setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM))
    while shell_status is None:
        pid, status = os.waitpid(shell_pid, 0)
        if pid == shell_pid:
            shell_status = status
except Stop:
    stopped = True
finally:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if signal_all(signal.SIGTERM):
        wait_gone(grace if stopped else leftover_grace)
    end = time.monotonic() + 10
    while signal_all(signal.SIGKILL) and time.monotonic() < end:
        time.sleep(0.01)
    reap()
if shell_status is None:
    os._exit(128 + signal.SIGTERM)
if os.WIFSIGNALED(shell_status):
    sig = os.WTERMSIG(shell_status)
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    os.kill(me, sig)
    os._exit(128 + sig)
os._exit(os.waitstatus_to_exitcode(shell_status))
"""


def _runner_argv(shell: str, command: str) -> list[str]:
    """``argv`` that runs ``shell -c command`` under ``_RUNNER`` (or directly when it cannot be used)."""
    if sys.platform.startswith("linux") and sys.executable and os.path.exists("/proc/self/stat"):
        return [sys.executable, "-I", "-S", "-c", _RUNNER, str(KILL_GRACE), str(LEFTOVER_GRACE), shell, "-c", command]
    return [shell, "-c", command]


def _stop_runner(proc: subprocess.Popen) -> None:
    """Timeout/abort: SIGTERM the runner (which stops the whole tree), then SIGKILL the group if needed."""
    try:
        os.kill(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=KILL_GRACE + 3.0)
    except subprocess.TimeoutExpired:
        pass
    _kill_group(proc, grace=0.2)


class RunCommandParams(BaseModel):
    """Input of ``run_command``."""

    command: str = Field(..., min_length=1, description="Shell command, run with bash -c in the agent home.")
    timeout_seconds: float | None = Field(
        None, gt=0, description="Time limit in seconds (capped by the worker's limit)."
    )
    cwd: str | None = Field(None, description="Working directory relative to the agent home (default: the home).")


def _run_command(params: RunCommandParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    """Run ``params.command`` under ``_RUNNER``; its lifetime bounds all its descendants.

    Output (stdout and stderr merged) is capped by ``_CappedSink``. When the
    shell exits, background processes it left are stopped (SIGTERM, then
    SIGKILL after ``LEFTOVER_GRACE``); on timeout or abort the whole tree is
    stopped (SIGTERM, then SIGKILL after ``KILL_GRACE``), including processes
    that moved to another session or process group.
    """
    try:
        cwd = resolve_in_home(ctx.home, params.cwd or ".")
    except ConfinementError as exc:
        return _fail(str(exc))
    if not cwd.is_dir():
        return _fail(f"working directory {params.cwd} does not exist or is not a directory")
    limit = settings.command_timeout
    timeout = min(params.timeout_seconds, limit) if params.timeout_seconds else limit
    shell = shutil.which("bash") or "/bin/sh"
    home = home_root(ctx.home)
    sink = _CappedSink(settings.command_output_cap)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            _runner_argv(shell, params.command),
            cwd=str(cwd),
            env=command_env(home, settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: killpg reaches every child
            close_fds=True,
        )
    except OSError as exc:
        return _fail(f"could not start the command: {exc.strerror or exc}")

    def pump() -> None:
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            sink.feed(chunk)

    reader = threading.Thread(target=pump, name="run_command-output", daemon=True)
    reader.start()
    outcome = "exited"
    deadline = started + timeout
    while proc.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            outcome = "timeout"
            break
        if ctx.abort.aborted:
            outcome = "aborted"
            break
        try:
            proc.wait(timeout=min(0.1, left))
        except subprocess.TimeoutExpired:
            pass
    if outcome != "exited":
        _stop_runner(proc)
    reader.join(PIPE_DRAIN_GRACE)
    if reader.is_alive():
        # Background children still hold the pipe: they belong to this command's group.
        _kill_group(proc, grace=0.2)
        reader.join(2.0)
    if proc.stdout is not None:
        try:
            proc.stdout.close()
        except OSError:
            pass
    elapsed = time.monotonic() - started
    output, cut = sink.render()
    exit_code = proc.returncode
    details = {
        "exit_code": exit_code,
        "duration_s": round(elapsed, 3),
        "output_bytes": sink.total,
        "output_cut_bytes": cut,
        "cwd": display_path(ctx.home, cwd),
        "outcome": outcome,
    }
    body = output if output else "(no output)"
    if outcome == "timeout":
        return ToolResult(
            content=f"{body}\n[command timed out after {timeout:g}s; it and its background processes were killed]",
            details=details,
            is_error=True,
        )
    if outcome == "aborted":
        return ToolResult(
            content=f"{body}\n[command cancelled: the turn was aborted; it and its background processes were killed]",
            details=details,
            is_error=True,
        )
    return ToolResult(content=f"{body}\n[exit code {exit_code}]", details=details)


def _describe_command(p: RunCommandParams) -> str:
    return f"Running `{_short(p.command)}`"


def _describe_command_done(p: RunCommandParams, r: ToolResult) -> str:
    outcome = r.details.get("outcome")
    if outcome == "timeout":
        return f"`{_short(p.command)}` timed out"
    if outcome == "aborted":
        return f"Stopped `{_short(p.command)}`"
    if "exit_code" not in r.details:
        return f"Could not run `{_short(p.command)}`"
    return f"Ran `{_short(p.command)}` (exit {r.details['exit_code']})"


# --------------------------------------------------------------------------- read_file


class ReadFileParams(BaseModel):
    """Input of ``read_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    offset: int = Field(1, ge=1, description="First line to read (1-based).")
    limit: int = Field(
        READ_DEFAULT_LINES, ge=1, le=READ_DEFAULT_LINES, description="Maximum number of lines to read."
    )
    line_numbers: bool = Field(True, description="Prefix each line with its number.")


def _is_binary(path: Path) -> bool:
    """True when the first bytes hold a NUL. Raises ``NotRegularFile`` for special files."""
    with _open_regular(path, "rb") as fh:
        return b"\x00" in fh.read(BINARY_SNIFF_BYTES)


def _read_file(params: ReadFileParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    try:
        path = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return _fail(str(exc))
    shown = display_path(ctx.home, path)
    if not path.exists():
        return _fail(f"{shown}: no such file")
    if path.is_dir():
        return _fail(f"{shown} is a directory; use list_files")
    special = _not_regular_reason(path)
    if special:
        return _fail(f"{shown} is {special}, not a regular file; not read")
    try:
        if _is_binary(path):
            return _fail(f"{shown} looks like a binary file; not shown")
        char_cap = settings.max_output_chars
        out: list[str] = []
        size = 0
        last = params.offset - 1
        total = 0
        stopped_at_cap = False
        end = params.offset + params.limit - 1
        with _open_regular(path, "r", encoding="utf-8", errors="replace", newline=None) as fh:
            for n, line in enumerate(fh, start=1):
                total = n
                if n < params.offset or n > end or stopped_at_cap:
                    continue
                text = line.rstrip("\n")
                if len(text) > READ_MAX_LINE_CHARS:
                    text = text[:READ_MAX_LINE_CHARS] + f" [... line cut at {READ_MAX_LINE_CHARS} chars]"
                rendered = f"{n:>6}\t{text}" if params.line_numbers else text
                if size + len(rendered) + 1 > char_cap and out:
                    stopped_at_cap = True
                    continue
                out.append(rendered)
                size += len(rendered) + 1
                last = n
    except NotRegularFile as exc:
        return _fail(f"{shown} is {exc.strerror}; not read")
    except OSError as exc:
        return _fail(f"{shown}: cannot read ({_os_reason(exc)})")
    lines_read = len(out)
    details = {"path": shown, "lines_read": lines_read, "total_lines": total, "first_line": params.offset}
    if total == 0:
        return ToolResult(content=f"{shown} is empty", details=details)
    if params.offset > total:
        return _fail(f"{shown} has {_plural(total, 'line')}; offset {params.offset} is past the end", **details)
    text = "\n".join(out)
    if last < total:
        why = "output size cap" if stopped_at_cap else "line limit"
        text += f"\n[... showed lines {params.offset}-{last} of {total} ({why}); read on with offset={last + 1}]"
    return ToolResult(content=text, details=details)


def _describe_read(p: ReadFileParams) -> str:
    return f"Reading {p.path}"


def _describe_read_done(p: ReadFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not read {p.path}"
    return f"Read {_plural(r.details.get('lines_read', 0), 'line')} of {r.details.get('path', p.path)}"


# --------------------------------------------------------------------------- write_file / edit_file


def _write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` without following a symlink at the final component.

    Only a regular file (new or existing) is written: the open is
    non-blocking (a FIFO without a reader fails at once instead of hanging)
    and the opened file is checked with ``fstat`` before anything is written;
    otherwise ``NotRegularFile`` is raised. ``O_TRUNC`` is applied only after
    that check, so a special file is never truncated.
    """
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO with no reader
            raise NotRegularFile(errno.ENXIO, "a FIFO (named pipe), not a regular file") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, f"{_kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
        os.ftruncate(fd, 0)
        fh = os.fdopen(fd, "w", encoding="utf-8", newline="")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        fh.write(text)


class WriteFileParams(BaseModel):
    """Input of ``write_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    content: str = Field(..., description="The full new content of the file (UTF-8 text).")


def _write_file(params: WriteFileParams, ctx: ToolContext) -> ToolResult:
    try:
        path = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return _fail(str(exc))
    shown = display_path(ctx.home, path)
    if path.is_dir():
        return _fail(f"{shown} is a directory")
    special = _not_regular_reason(path)
    if special:
        return _fail(f"{shown} is {special}, not a regular file; not written")
    try:
        existed = path.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        # mkdir followed no symlink out (the resolved parent is real), but re-check the result.
        if not is_inside_home(ctx.home, path.parent):
            return _fail(f"{params.path} resolves outside the agent home; refused")
        _write_text(path, params.content)
    except NotRegularFile as exc:
        return _fail(f"{shown} is {exc.strerror}; not written")
    except OSError as exc:
        return _fail(f"{shown}: cannot write ({_os_reason(exc)})")
    lines = _count_lines(params.content)
    size = len(params.content.encode("utf-8"))
    verb = "Overwrote" if existed else "Created"
    return ToolResult(
        content=f"{verb} {shown} ({_plural(lines, 'line')}, {size:,} bytes)",
        details={"path": shown, "lines": lines, "bytes": size, "created": not existed},
    )


def _describe_write(p: WriteFileParams) -> str:
    return f"Writing {p.path}"


def _describe_write_done(p: WriteFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not write {p.path}"
    return f"Wrote {_plural(r.details.get('lines', 0), 'line')} to {r.details.get('path', p.path)}"


class EditFileParams(BaseModel):
    """Input of ``edit_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    old_string: str = Field(..., min_length=1, description="Exact text to replace (must occur exactly once).")
    new_string: str = Field(..., description="Replacement text.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of requiring exactly one.")


def _edit_file(params: EditFileParams, ctx: ToolContext) -> ToolResult:
    try:
        path = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return _fail(str(exc))
    shown = display_path(ctx.home, path)
    if not path.is_file():
        if not path.exists():
            return _fail(f"{shown}: no such file")
        return _fail(f"{shown} is {_not_regular_reason(path) or 'a special file'}, not a regular file; not edited")
    if params.old_string == params.new_string:
        return _fail("old_string and new_string are identical; nothing to change")
    try:
        if _is_binary(path):
            return _fail(f"{shown} looks like a binary file; not edited")
        with _open_regular(path, "r", encoding="utf-8", newline="") as fh:  # newline="": keep CRLF as is
            text = fh.read()
    except UnicodeDecodeError:
        return _fail(f"{shown} is not valid UTF-8 text; not edited")
    except NotRegularFile as exc:
        return _fail(f"{shown} is {exc.strerror}; not edited")
    except OSError as exc:
        return _fail(f"{shown}: cannot read ({_os_reason(exc)})")
    count = text.count(params.old_string)
    if count == 0:
        return _fail(f"old_string was not found in {shown}; read the file and copy the text exactly")
    if count > 1 and not params.replace_all:
        return _fail(
            f"old_string occurs {count} times in {shown}; include more surrounding text to make it "
            f"unique, or set replace_all=true"
        )
    new_text = text.replace(params.old_string, params.new_string) if params.replace_all else text.replace(
        params.old_string, params.new_string, 1
    )
    try:
        _write_text(path, new_text)
    except NotRegularFile as exc:
        return _fail(f"{shown} is {exc.strerror}; not edited")
    except OSError as exc:
        return _fail(f"{shown}: cannot write ({_os_reason(exc)})")
    replaced = count if params.replace_all else 1
    return ToolResult(
        content=f"Edited {shown}: {_plural(replaced, 'replacement')}",
        details={"path": shown, "replacements": replaced},
    )


def _describe_edit(p: EditFileParams) -> str:
    return f"Editing {p.path}"


def _describe_edit_done(p: EditFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not edit {p.path}"
    return f"Edited {r.details.get('path', p.path)} ({_plural(r.details.get('replacements', 0), 'replacement')})"


# --------------------------------------------------------------------------- list_files


class ListFilesParams(BaseModel):
    """Input of ``list_files``."""

    path: str = Field(".", description="Directory relative to the agent home (default: the home).")
    recursive: bool = Field(False, description="List subdirectories too (skips .git, node_modules and the like).")
    include_hidden: bool = Field(False, description="Include names starting with a dot.")
    max_entries: int = Field(
        LIST_DEFAULT_ENTRIES, ge=1, le=LIST_MAX_ENTRIES, description="Stop after this many entries."
    )


def _entry_line(home: Path, full: Path, rel: str) -> str:
    try:
        if full.is_symlink():
            target = os.readlink(full)
            where = "" if is_inside_home(home, full) else " (outside the home: not accessible)"
            return f"{rel} -> {target}{where}"
        if full.is_dir():
            return rel + "/"
        return f"{rel}  ({full.stat().st_size:,} bytes)"
    except OSError:
        return rel


def _list_files(params: ListFilesParams, ctx: ToolContext) -> ToolResult:
    try:
        root = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return _fail(str(exc))
    shown = display_path(ctx.home, root)
    if not root.exists():
        return _fail(f"{shown}: no such directory")
    if not root.is_dir():
        return _fail(f"{shown} is a file, not a directory; use read_file")
    lines: list[str] = []
    truncated = False

    def visible(name: str) -> bool:
        return params.include_hidden or not name.startswith(".")

    try:
        if params.recursive:
            for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
                dirnames[:] = sorted(d for d in dirnames if visible(d) and d not in SKIP_DIRS)
                base = Path(dirpath)
                for name in sorted(dirnames + [f for f in filenames if visible(f)]):
                    if len(lines) >= params.max_entries:
                        truncated = True
                        break
                    full = base / name
                    lines.append(_entry_line(ctx.home, full, str(full.relative_to(root))))
                if truncated:
                    break
        else:
            with os.scandir(root) as it:
                names = sorted(e.name for e in it if visible(e.name))
            for name in names:
                if len(lines) >= params.max_entries:
                    truncated = True
                    break
                lines.append(_entry_line(ctx.home, root / name, name))
    except OSError as exc:
        return _fail(f"{shown}: cannot list ({_os_reason(exc)})")
    header = f"{shown}/" if shown != "." else "./ (agent home)"
    body = "\n".join(lines) if lines else "(empty)"
    if truncated:
        body += f"\n[... listing stopped at {params.max_entries} entries; narrow the path or raise max_entries]"
    return ToolResult(
        content=f"{header}\n{body}",
        details={"path": shown, "entries": len(lines), "truncated": truncated},
    )


def _describe_list(p: ListFilesParams) -> str:
    return f"Listing {p.path}" + (" recursively" if p.recursive else "")


def _describe_list_done(p: ListFilesParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not list {p.path}"
    more = "+" if r.details.get("truncated") else ""
    return f"Listed {r.details.get('entries', 0)}{more} entries in {r.details.get('path', p.path)}"


# --------------------------------------------------------------------------- search_files


class SearchFilesParams(BaseModel):
    """Input of ``search_files``."""

    pattern: str = Field(..., min_length=1, description="Python regular expression, or plain text when literal=true.")
    path: str = Field(".", description="File or directory to search, relative to the agent home.")
    literal: bool = Field(False, description="Treat pattern as plain text rather than a regex.")
    case_sensitive: bool = Field(True, description="Match case exactly.")
    glob: str | None = Field(None, description="Only search files whose name or relative path matches, e.g. '*.py'.")
    max_results: int = Field(
        SEARCH_DEFAULT_RESULTS, ge=1, le=SEARCH_MAX_RESULTS, description="Stop after this many matching lines."
    )


def _iter_search_files(root: Path, glob: str | None) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if glob:
                rel = str(full.relative_to(root))
                if not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(rel, glob)):
                    continue
            yield full


def _search_files(params: SearchFilesParams, ctx: ToolContext) -> ToolResult:
    try:
        root = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return _fail(str(exc))
    shown = display_path(ctx.home, root)
    if not root.exists():
        return _fail(f"{shown}: no such file or directory")
    flags = regex.VERSION0 if params.case_sensitive else regex.VERSION0 | regex.IGNORECASE
    source = regex.escape(params.pattern) if params.literal else params.pattern
    try:
        rx = regex.compile(source, flags)
    except (regex.error, ValueError, TypeError, OverflowError, RecursionError) as exc:
        return _fail(f"invalid regular expression {params.pattern!r}: {exc}; set literal=true for plain text")
    results: list[str] = []
    files_with_matches = 0
    files_searched = 0
    truncated = False
    timed_out = False
    deadline = time.monotonic() + SEARCH_TIME_BUDGET
    for full in _iter_search_files(root, params.glob):
        if truncated or timed_out:
            break
        if ctx.abort.aborted:
            return _fail("search cancelled: the turn was aborted")
        if time.monotonic() > deadline:
            timed_out = True
            break
        try:
            if full.is_symlink() and not is_inside_home(ctx.home, full):
                continue  # never read through a symlink that leaves the home
            if not full.is_file() or full.stat().st_size > SEARCH_MAX_FILE_BYTES or _is_binary(full):
                continue
            files_searched += 1
            matched_here = False
            rel = str(full.relative_to(root)) if root.is_dir() else display_path(ctx.home, full)
            if root.is_dir() and shown != ".":
                rel = f"{shown}/{rel}"
            with _open_regular(full, "r", encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, start=1):
                    if ctx.abort.aborted:
                        return _fail("search cancelled: the turn was aborted")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    per_search = min(left, SEARCH_PATTERN_TIMEOUT)
                    try:
                        found = rx.search(line, timeout=per_search)
                    except TimeoutError:
                        if ctx.abort.aborted:
                            return _fail("search cancelled: the turn was aborted")
                        if per_search < SEARCH_PATTERN_TIMEOUT:  # the overall budget ran out
                            timed_out = True
                            break
                        return _fail(
                            f"pattern too slow; simplify it: {params.pattern!r} took more than "
                            f"{SEARCH_PATTERN_TIMEOUT:g}s on one line ({rel}:{n}); avoid nested "
                            f"repetition like (a+)+ or use literal=true",
                            path=shown,
                            pattern_timeout=True,
                        )
                    if found:
                        matched_here = True
                        text = line.rstrip("\n")
                        if len(text) > SEARCH_MAX_LINE_CHARS:
                            text = text[:SEARCH_MAX_LINE_CHARS] + " […]"
                        results.append(f"{rel}:{n}: {text}")
                        if len(results) >= params.max_results:
                            truncated = True
                            break
            files_with_matches += matched_here
            if timed_out:
                break
        except OSError:
            continue
    details = {
        "path": shown,
        "matches": len(results),
        "files_with_matches": files_with_matches,
        "files_searched": files_searched,
        "truncated": truncated,
        "timed_out": timed_out,
    }
    if not results:
        note = " (search time budget ran out)" if timed_out else ""
        return ToolResult(content=f"No matches for {params.pattern!r} in {shown}{note}", details=details)
    body = "\n".join(results)
    if truncated:
        body += f"\n[... stopped at {params.max_results} matches; narrow the pattern, path or glob]"
    if timed_out:
        body += f"\n[... search stopped after {SEARCH_TIME_BUDGET:g}s; narrow the path or glob]"
    return ToolResult(content=body, details=details)


def _describe_search(p: SearchFilesParams) -> str:
    where = "" if p.path in (".", "") else f" in {p.path}"
    return f"Searching for '{_short(p.pattern, 40)}'{where}"


def _describe_search_done(p: SearchFilesParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not search for '{_short(p.pattern, 40)}'"
    n = r.details.get("matches", 0)
    where = "" if p.path in (".", "") else f" in {p.path}"
    more = "+" if r.details.get("truncated") else ""
    return f"Found {n}{more} {'match' if n == 1 else 'matches'} for '{_short(p.pattern, 40)}'{where}"


# --------------------------------------------------------------------------- creator


def _bind(fn: Callable[..., ToolResult], settings: Settings) -> Callable[[object, ToolContext], ToolResult]:
    guarded = _guarded(fn)
    return lambda params, ctx: guarded(params, ctx, settings)


def create_computer_tools(ctx: TurnContext) -> list[WorkerTool]:
    """The computer tools for one turn, confined to ``ctx.home``.

    Order: run_command, read_file, write_file, edit_file, list_files,
    search_files. Limits come from ``ctx.settings``: ``command_timeout``
    (seconds, the ceiling of a command's own timeout), ``command_output_cap``
    (bytes of command output kept) and ``max_output_chars`` (characters of a
    file read).
    """
    settings = ctx.settings
    cap_s = f"{settings.command_timeout:g}"
    return [
        define_worker_tool(
            name="run_command",
            description=(
                "Run a shell command (bash -c) in the agent's home directory and return its combined "
                f"stdout/stderr and exit code. Time limit: at most {cap_s}s. Long output is cut in the "
                "middle. The environment is minimal (no credentials); HOME is the agent home. Background "
                "processes are stopped when the command ends (nothing started with & outlives it)."
            ),
            input_model=RunCommandParams,
            execute=_bind(_run_command, settings),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=_describe_command,
            describe_completed_activity=_describe_command_done,
        ),
        define_worker_tool(
            name="read_file",
            description=(
                "Read a text file in the agent home. Returns lines offset..offset+limit-1, numbered "
                "like `cat -n` unless line_numbers=false."
            ),
            input_model=ReadFileParams,
            execute=_bind(_read_file, settings),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_read,
            describe_completed_activity=_describe_read_done,
        ),
        define_worker_tool(
            name="write_file",
            description="Create or overwrite a text file in the agent home (parent directories are created).",
            input_model=WriteFileParams,
            execute=_guarded(_write_file),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=_describe_write,
            describe_completed_activity=_describe_write_done,
        ),
        define_worker_tool(
            name="edit_file",
            description=(
                "Replace an exact string in a text file in the agent home. old_string must occur exactly "
                "once (include surrounding lines to make it unique) unless replace_all=true."
            ),
            input_model=EditFileParams,
            execute=_guarded(_edit_file),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=_describe_edit,
            describe_completed_activity=_describe_edit_done,
        ),
        define_worker_tool(
            name="list_files",
            description="List a directory in the agent home, optionally recursively (with an entry cap).",
            input_model=ListFilesParams,
            execute=_guarded(_list_files),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_list,
            describe_completed_activity=_describe_list_done,
        ),
        define_worker_tool(
            name="search_files",
            description=(
                "Search text files under a path in the agent home for a regex (or plain text with "
                "literal=true). Returns path:line: text for each matching line, up to max_results."
            ),
            input_model=SearchFilesParams,
            execute=_guarded(_search_files),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_search,
            describe_completed_activity=_describe_search_done,
        ),
    ]


__all__ = ["create_computer_tools", "command_env"]
