"""The ``run_command`` tool: a shell command in the agent home, sandboxed, its output capped, its processes reaped.

How the command is started (the bubblewrap sandbox, or the development-only
unsandboxed runner) is ``worker.tools.computer.launch``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from pydantic import BaseModel, Field

from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.computer.cgroups import MemoryCgroup
from worker.tools.computer.common import fail, short
from worker.tools.computer.confine import ConfinementError, display_path, home_root, resolve_in_home
from worker.tools.computer.homes import AgentHome, full_note
from worker.tools.computer.launch import KILL_GRACE, NetworkPolicy, command_env, prepare
from worker.tools.computer.sandbox import SandboxUnavailable

__all__ = ["RunCommandParams", "command_env"]

# After the shell exits, how long to wait for background children to release the output pipe.
PIPE_DRAIN_GRACE = 0.5


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


def _kill_group(proc: "subprocess.Popen[bytes]", grace: float = KILL_GRACE) -> None:
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


def _stop_runner(proc: "subprocess.Popen[bytes]") -> None:
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


def _run_command(
    params: RunCommandParams,
    ctx: ToolContext,
    settings: Settings,
    policy: NetworkPolicy = NetworkPolicy(),
    agent_home: AgentHome | None = None,
) -> ToolResult:
    """Run ``params.command`` in the sandbox (``launch.prepare``); its lifetime bounds all its descendants.

    Output (stdout and stderr merged) is capped by ``_CappedSink``. Sandboxed,
    the command is its sandbox's PID namespace: when the shell exits, or on
    timeout or abort (bwrap is killed, ``--die-with-parent``), every process
    in it dies. Unsandboxed (``AGENT_COMMAND_SANDBOX=off``), ``_RUNNER`` stops
    the tree (SIGTERM, then SIGKILL). ``policy`` is the turn's network. When
    the sandbox cannot be created the result is an error naming the cause and
    the setting; nothing runs. ``agent_home`` (``homes.provision``): the
    command runs as its uid, and a full home is named in the result.
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
    try:
        owner = (agent_home.uid, agent_home.gid) if agent_home and agent_home.uid is not None else None
        launch = prepare(settings, policy, home, cwd, params.command, shell, owner=owner)  # type: ignore[arg-type]
    except SandboxUnavailable as exc:
        return fail(str(exc), sandbox="unavailable")
    sink = _CappedSink(settings.command_output_cap)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            launch.argv,
            cwd=launch.cwd if launch.sandboxed else str(cwd),
            env=launch.env if launch.sandboxed else command_env(home, settings),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: killpg reaches every child
            close_fds=True,
            pass_fds=launch.pass_fds,
        )
    except OSError as exc:
        launch.cleanup()
        return fail(f"could not start the command: {exc.strerror or exc}")
    launch.spawned()
    try:
        result = _supervise(proc, params, ctx, sink, started, timeout, cwd, launch.memory)
    finally:
        launch.cleanup()
    note = full_note(agent_home) if agent_home is not None else None
    if note:
        result.content += f"\n[{note}]"
        result.details["home_full"] = True
    return result


def _supervise(
    proc: "subprocess.Popen[bytes]",
    params: RunCommandParams,
    ctx: ToolContext,
    sink: _CappedSink,
    started: float,
    timeout: float,
    cwd: Path,
    memory: MemoryCgroup | None = None,
) -> ToolResult:
    """Pump output, enforce the timeout, the abort and the memory limit, and build the result.

    ``memory``: the command's memory cgroup; once the kernel's OOM killer has
    killed one of its processes, the whole command is killed and the result
    says it passed its memory limit (``AGENT_COMMAND_MAX_MEMORY_BYTES``)."""

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
        if memory is not None and memory.oom_killed():
            outcome = "memory_limit"
            memory.kill()
            break
        if reader.is_alive():
            # The output pipe closes when the last process of the command exits: waking on the
            # reader's end answers at once, where Popen.wait polls with growing sleeps.
            reader.join(min(0.05, left))
            continue
        try:
            proc.wait(timeout=min(0.05, left))
        except subprocess.TimeoutExpired:
            pass
    if outcome == "exited" and memory is not None and memory.oom_killed():
        outcome = "memory_limit"  # the kernel killed a process, and the command ended before we looked
    if outcome == "memory_limit":
        memory.kill()  # type: ignore[union-attr]
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
    if outcome == "memory_limit":
        limit = memory.limit_bytes if memory is not None else 0
        return ToolResult(
            content=(
                f"{body}\n[command killed: its processes together passed its memory limit of "
                f"{limit / 1024**2:,.0f} MiB (AGENT_COMMAND_MAX_MEMORY_BYTES); it and its background processes "
                "were killed]"
            ),
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
    if outcome == "memory_limit":
        return f"`{short(p.command)}` passed its memory limit"
    if "exit_code" not in r.details:
        return f"Could not run `{short(p.command)}`"
    return f"Ran `{short(p.command)}` (exit {r.details['exit_code']})"
