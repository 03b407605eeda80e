"""How a command is started: its environment, and the process that runs it.

``prepare`` returns a ``Launch`` (argv, environment, descriptors to pass, a
cleanup). With ``AGENT_COMMAND_SANDBOX=bwrap`` (the default) the argv is a
bubblewrap sandbox (``worker.tools.computer.sandbox``), with an egress proxy
when the turn allows network (``worker.tools.computer.egress``); when the
sandbox cannot be created ``prepare`` raises ``SandboxUnavailable`` and the
command does not run. ``AGENT_COMMAND_SANDBOX=off`` (development only, a
WARNING on first use) runs the command under ``_RUNNER`` as the worker user.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from worker.settings import Settings
from worker.tools.computer import sandbox
from worker.tools.computer.cgroups import MemoryCgroup, PidsCgroup, memory_cgroup_root, pids_cgroup_root
from worker.tools.computer.egress import PROXY_PORT, RELAY, SOCKET_IN_SANDBOX, EgressProxy

log = logging.getLogger(__name__)

# Grace between SIGTERM and SIGKILL when stopping an unsandboxed command's tree (see _RUNNER).
KILL_GRACE = 1.0
# Grace between SIGTERM and SIGKILL for background processes left when the shell exits.
LEFTOVER_GRACE = 0.3

# Environment variables copied from the worker into commands: locale and
# terminal only. Everything else (API keys, Redis URLs, cloud credentials) is
# left out by construction; PATH, HOME and the like are set explicitly.
ENV_PASSTHROUGH = ("LANG", "LC_ALL", "LC_CTYPE", "TZ")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


@dataclass(frozen=True)
class NetworkPolicy:
    """A turn's command network: ``mode`` "none" or "egress"; ``allow_hosts`` None = any host the guard allows."""

    mode: str = "none"
    allow_hosts: tuple[str, ...] | None = None


@dataclass
class Launch:
    """What ``Popen`` needs for one command, and what to undo after it (``cleanup``)."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: list[int] = field(default_factory=list)
    sandboxed: bool = True
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    memory: MemoryCgroup | None = None  # the command's memory cgroup (``oom_killed``), when there is one

    def spawned(self) -> None:
        """Close the parent's copies of the passed descriptors (call once ``Popen`` returned or failed)."""
        for fd in self.pass_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.pass_fds = []

    def cleanup(self) -> None:
        """Stop the egress proxy, remove the cgroup; safe to call twice."""
        self.spawned()
        while self.cleanups:
            try:
                self.cleanups.pop()()
            except Exception:
                log.exception("command cleanup failed")


_warned_off = False


def warn_if_unsandboxed(settings: Settings) -> None:
    """Log the WARNING of ``AGENT_COMMAND_SANDBOX=off`` (once per process; also called at worker start)."""
    global _warned_off
    if settings.command_sandbox == "off" and not _warned_off:
        _warned_off = True
        log.warning(
            "AGENT_COMMAND_SANDBOX=off: agent commands run UNSANDBOXED as the worker user; they can read "
            "the worker's secrets (/proc/<pid>/environ), other agents' homes and reach Redis. Development only."
        )


def _inner_script(limits: sandbox.Limits, egress: bool) -> str:
    # $0 = the shell, $1 = the command, $2 = the working directory, $3 = the relay's source. The
    # directory is entered here, as the agent (a root bwrap without capabilities cannot enter a
    # 0700 home of the agent's). Limits first, so they bind the relay too; the command then
    # replaces this shell.
    lines = ['cd -- "$2" || exit 125']
    lines.append(limits.ulimit_line() + ' || { echo "sandbox: cannot apply the resource limits" >&2; exit 125; }')
    if egress:
        python = os.path.realpath(sys.executable)
        lines.append(
            f'exec 3< <("{python}" -I -S -c "$3" {SOCKET_IN_SANDBOX} {PROXY_PORT} 2>/dev/null) && read -r _ <&3; exec 3<&-'
        )
    lines.append('exec "$0" -c "$1"')
    return "\n".join(lines)


def prepare(
    settings: Settings,
    policy: NetworkPolicy,
    home: Path,
    cwd: Path,
    command: str,
    shell: str,
    owner: tuple[int, int] | None = None,
) -> Launch:
    """The launch of ``shell -c command`` with cwd ``cwd`` in ``home`` (both real paths).

    ``owner``: the agent's host ``(uid, gid)`` (``homes.AgentHome``). A root
    worker runs the command as that uid (``sandbox.owner_prefix``: ``setpriv``
    inside the sandbox, once ``bwrap`` has mounted as root), never as root:
    what a command creates is the agent's, a setuid bit grants nothing
    (``nosuid`` mounts, ``no_new_privs``), and RLIMIT_NPROC counts this
    agent's processes (all of them on the host: one agent's budget). Raises ``sandbox.SandboxUnavailable`` (message names the
    cause and ``AGENT_COMMAND_SANDBOX``) when the sandbox is on and cannot be created.
    """
    env = command_env(home, settings)
    if settings.command_sandbox == "off":
        warn_if_unsandboxed(settings)
        return Launch(argv=_runner_argv(shell, command), env=env, cwd=str(cwd), sandboxed=False)
    bwrap = sandbox.find_bwrap(settings)
    probed = sandbox.probe(bwrap, settings)
    limits = sandbox.Limits.from_settings(settings)
    launch = Launch(argv=[], env={}, cwd="/")
    switch = owner if owner is not None and os.geteuid() == 0 else None
    try:
        binds: list[tuple[str, str]] = []
        egress = policy.mode == "egress"
        if egress:
            ports = frozenset(int(p) for p in settings.test_only_egress_loopback_ports.split(",") if p.strip())
            proxy = EgressProxy(policy.allow_hosts, loopback_ports=ports, owner=switch)
            launch.cleanups.append(proxy.close)
            binds.append((proxy.socket_path, SOCKET_IN_SANDBOX))
            url = f"http://127.0.0.1:{PROXY_PORT}"
            env.update({"HTTP_PROXY": url, "HTTPS_PROXY": url, "http_proxy": url, "https_proxy": url})
        script = _inner_script(limits, egress)
        argv = sandbox.build_argv(
            bwrap,
            settings=settings,
            home=home,
            cwd=cwd,
            env=env,
            script=script,
            shell=shell,
            command=command,
            fds=launch.pass_fds,
            extra_binds=binds,
            owner=switch,
        )
        if egress:
            argv.append(RELAY)
        procs: list[str] = []
        memory = _memory_cgroup(settings, limits)
        if memory is not None:
            launch.cleanups.append(memory.remove)
            launch.memory = memory
            procs.append(str(memory.procs_file))
        if probed.process_cap.endswith("cgroup-pids"):
            parent = pids_cgroup_root()
            assert parent is not None
            group = PidsCgroup(parent, limits.processes)
            launch.cleanups.append(group.remove)
            procs.append(str(group.procs_file))
        if procs:
            # Join the cgroups (as the worker) before bwrap starts, so every sandbox process is counted.
            argv = ["/bin/sh", "-c", JOIN_CGROUPS, "sh", *procs, "--", *argv]
        launch.argv = argv
        return launch
    except BaseException:
        launch.cleanup()
        raise


# argv: cgroup.procs files, "--", then the command: the shell writes its pid to each and execs it.
JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'

_warned_no_memory_cgroup = False


def _memory_cgroup(settings: Settings, limits: sandbox.Limits) -> MemoryCgroup | None:
    """The command's memory cgroup (limit ``AGENT_COMMAND_MAX_MEMORY_BYTES`` over all its
    processes). Raises ``SandboxUnavailable`` when the host offers no writable memory cgroup,
    unless ``AGENT_COMMAND_MEMORY_CGROUP`` is off (then ``None`` and a WARNING, once)."""
    global _warned_no_memory_cgroup
    if not settings.command_memory_cgroup:
        if not _warned_no_memory_cgroup:
            _warned_no_memory_cgroup = True
            log.warning(
                "AGENT_COMMAND_MEMORY_CGROUP=0: a command's memory is limited per process only (RLIMIT_AS); "
                "several processes of one command together can use more. Development only."
            )
        return None
    parent = memory_cgroup_root()
    if parent is None:
        raise sandbox.SandboxUnavailable(
            "command sandbox unavailable: no writable memory cgroup (cgroup v1 'memory' hierarchy, or v2 with "
            "the memory controller delegated to the worker) for the per-command memory limit; run the worker as "
            "root or with a delegated cgroup, or for development only set AGENT_COMMAND_MEMORY_CGROUP=0"
        )
    try:
        return MemoryCgroup(parent, limits.address_space_bytes)
    except OSError as exc:
        raise sandbox.SandboxUnavailable(
            f"command sandbox unavailable: cannot create a memory cgroup ({exc})"
        ) from None


def limits_check(settings: Settings) -> dict[str, str]:
    """Check the per-agent limits at a tools node's start (docs/isolation.md "Limits per agent") and
    log each once for the node: a limit turned off is a WARNING, one that cannot work here an ERROR
    naming its setting (every computer tool then refuses the same way). Called in the worker's main
    process before its pool starts, so the pool's processes do not log it again.

    Returns ``{"quota" | "memory" | "uid": status}``; a status that starts with ``unavailable:``
    is a refusal.
    """
    from worker.tools.computer import homes

    status: dict[str, str] = {}
    if settings.home_quota_mb == 0:
        homes.quota_off_warning(settings)
    try:
        status["quota"] = homes.probe_quota(settings)
    except homes.HomeUnavailable as exc:
        log.error("%s", exc)
        status["quota"] = f"unavailable: {exc}"
    try:
        cgroup = _memory_cgroup(settings, sandbox.Limits.from_settings(settings))
    except sandbox.SandboxUnavailable as exc:
        log.error("%s", exc)
        status["memory"] = f"unavailable: {exc}"
    else:
        status["memory"] = (
            "off (AGENT_COMMAND_MEMORY_CGROUP=0)"
            if cgroup is None
            else f"a cgroup per command under {cgroup.path.parent}"
        )
        if cgroup is not None:
            cgroup.remove()
    status["uid"] = (
        f"one per agent from AGENT_UID_BASE={settings.uid_base}"
        if os.geteuid() == 0
        else "the worker's own (not root: a user namespace per command)"
    )
    log.info("per-agent limits: %s", "; ".join(f"{k}: {v}" for k, v in status.items()))
    return status


def startup_check(settings: Settings) -> str:
    """Check the command sandbox at worker start and log the outcome; returns a one-line status.

    ``off``: the WARNING of ``warn_if_unsandboxed``. ``bwrap``: the probe; an
    unavailable sandbox is logged as an ERROR (the worker still starts: every
    ``run_command`` then returns the same error, other tools work).
    """
    if settings.command_sandbox == "off":
        warn_if_unsandboxed(settings)
        return "off"
    try:
        probed = sandbox.probe(sandbox.find_bwrap(settings), settings)
    except sandbox.SandboxUnavailable as exc:
        log.error("%s", exc)
        return f"unavailable: {exc}"
    return (
        f"bwrap {probed.bwrap} ({probed.version}), process cap by {probed.process_cap}, "
        f"a command holds {probed.capabilities}"
    )
