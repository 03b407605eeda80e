"""The ``run_command`` tool: a shell command in the agent home, its output capped, its processes reaped."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from pydantic import BaseModel, Field

from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.computer.common import fail, short
from worker.tools.computer.confine import ConfinementError, display_path, home_root, resolve_in_home

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
        return fail(str(exc))
    if not cwd.is_dir():
        return fail(f"working directory {params.cwd} does not exist or is not a directory")
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
        return fail(f"could not start the command: {exc.strerror or exc}")

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
    return f"Running `{short(p.command)}`"


def _describe_command_done(p: RunCommandParams, r: ToolResult) -> str:
    outcome = r.details.get("outcome")
    if outcome == "timeout":
        return f"`{short(p.command)}` timed out"
    if outcome == "aborted":
        return f"Stopped `{short(p.command)}`"
    if "exit_code" not in r.details:
        return f"Could not run `{short(p.command)}`"
    return f"Ran `{short(p.command)}` (exit {r.details['exit_code']})"
