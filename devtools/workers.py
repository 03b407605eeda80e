"""The worker processes of a node, and a supervisor that keeps them running.

Two pools, because the queues wait on different things (a model call waits on the network,
a tool call uses a core and needs a process of its own to be killed on a time limit):

- ``turns``, ``background``, ``workflow``: steps that wait on the model for seconds. They run
  on an I/O pool that runs tasks in its own process (``--pool solo`` by default: a step's Redis
  work runs on the consumer's own thread, and its model call waits on the process's event loop,
  not a thread), so one node keeps thousands of model calls in flight instead of one per process.
  ``AGENT_IO_POOL=threads`` (with ``AGENT_IO_CONCURRENCY`` threads, 32) runs the steps on a thread
  pool instead: needed for ``AGENT_MODEL_CALLS=inline`` (refused on solo), and about 10% more CPU per turn
  (bench/README.md, "Worker CPU per turn, third pass").
- ``tools``: tool calls, CPU and isolation sensitive, with Celery time limits: ``prefork``,
  one process per core by default.

Both run without gossip and mingle: nothing here uses them, and their bootsteps are where
kombu's reconnect path fails after a Redis restart ("Error on restarting Gossip:
AttributeError"; kombu#582). ``Supervisor`` restarts a process that exits (a Redis restart
that a process did not survive, an OOM kill), with backoff, and stops them all on SIGTERM.

``python -m devtools.workers`` (``make worker``) runs both pools under the supervisor against
``REDIS_URL``; ``make run`` and ``make stack`` use the same commands and supervisor.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Callable, Mapping

from devtools import lifetime

ROOT = Path(__file__).resolve().parent.parent
IO_QUEUES = "turns,background,workflow"
TOOL_QUEUES = "tools"

log = logging.getLogger("agent.supervisor")


def worker_argv(
    queues: str,
    *,
    name: str,
    pool: str | None = None,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    app: str = "tasks.app",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """argv of one ``celery worker`` on ``queues`` (comma-separated) named ``name`` (``x@%h``), without
    gossip and mingle (see the module docstring); ``pool``/``concurrency`` default to Celery's."""
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues, "-n", name, "-l", loglevel]
    if pool:
        argv += ["--pool", pool]
    if concurrency:
        argv += ["-c", str(concurrency)]
    return [*argv, "--without-gossip", "--without-mingle", *extra]


IO_POOLS = ("solo", "threads")
DEFAULT_IO_CONCURRENCY = 32


def pool_size(name: str, env: Mapping[str, str], unit: str) -> int | None:
    """``env[name]`` as a pool's size (``unit``: ``threads``, ``processes``), None when unset or
    empty. Raises ``ValueError``, one line naming the variable, when it is set but not a whole
    number of at least 1 (``0`` used to be replaced by the default in silence, ``abc`` was a
    traceback)."""
    raw = env.get(name)
    if not raw:
        return None
    text = raw.strip()
    size = int(text) if text.isascii() and text.isdigit() else 0
    if size < 1:
        raise ValueError(f"{name} must be a whole number of {unit}, at least 1, not {raw!r}")
    return size


def io_pool_config(
    io_pool: str | None = None, io_concurrency: int | None = None, env: Mapping[str, str] | None = None
) -> tuple[str, int | None]:
    """The node's I/O pool and its size: ``(pool, threads)``, ``threads`` None for solo (one task at
    a time). ``io_pool``, else ``AGENT_IO_POOL``, else ``solo``; a ``threads`` pool has
    ``io_concurrency``, else ``AGENT_IO_CONCURRENCY``, else 32 threads (``env``: default this
    process's environment). Raises ``ValueError``, one line naming the variable, for a pool other
    than ``solo`` or ``threads`` (a prefork child would make its model calls inline, one at a
    time), for an ``AGENT_IO_CONCURRENCY`` that is set but not a whole number of at least 1
    (``pool_size``), and for ``AGENT_MODEL_CALLS=inline`` on a solo pool (an inline call holds the
    only thread that runs steps for as long as the model takes: the whole node would wait on one call)."""
    env = os.environ if env is None else env
    pool = io_pool or env.get("AGENT_IO_POOL") or "solo"
    if pool not in IO_POOLS:
        raise ValueError(f"AGENT_IO_POOL must be solo or threads, not {pool!r}")
    size = io_concurrency
    if size is None:
        size = pool_size("AGENT_IO_CONCURRENCY", env, "threads")
    elif size < 1:
        raise ValueError(f"an I/O pool needs at least 1 thread, not {size}")
    if pool == "solo" and env.get("AGENT_MODEL_CALLS") == "inline":
        raise ValueError(
            "AGENT_MODEL_CALLS=inline needs AGENT_IO_POOL=threads: an inline model call would block "
            "the solo pool's only thread (or unset AGENT_MODEL_CALLS: async, the default)"
        )
    return pool, (size or DEFAULT_IO_CONCURRENCY) if pool == "threads" else None


def tools_pool_config(tools_concurrency: int | None = None, env: Mapping[str, str] | None = None) -> int:
    """The tools pool's processes: ``tools_concurrency``, else ``AGENT_TOOLS_CONCURRENCY``, else
    the number of cores (``env``: default this process's environment). Raises ``ValueError``, one
    line naming the variable, for an ``AGENT_TOOLS_CONCURRENCY`` that is set but not a whole number
    of at least 1 (``pool_size``)."""
    env = os.environ if env is None else env
    if tools_concurrency is not None:
        if tools_concurrency < 1:
            raise ValueError(f"a tools pool needs at least 1 process, not {tools_concurrency}")
        return tools_concurrency
    return pool_size("AGENT_TOOLS_CONCURRENCY", env, "processes") or os.cpu_count() or 2


def check_pool_settings(env: Mapping[str, str] | None = None) -> None:
    """Raise ``ValueError`` (one line) for a pool setting ``worker_commands`` would refuse: for
    ``make run``/``make stack`` to say so before they start anything."""
    io_pool_config(env=env)
    tools_pool_config(env=env)


def describe_io_pool(env: Mapping[str, str] | None = None) -> str:
    """The I/O pool ``worker_commands`` runs with the settings of ``env`` (``io_pool_config``), for a
    console line: ``a solo pool`` or ``a threads pool of N``. Raises ``ValueError`` as
    ``io_pool_config`` does."""
    pool, size = io_pool_config(env=env)
    return f"a threads pool of {size}" if pool == "threads" else f"a {pool} pool"


def worker_commands(
    *,
    io_pool: str | None = None,
    io_concurrency: int | None = None,
    tools_concurrency: int | None = None,
    loglevel: str = "INFO",
    tag: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, list[str]]:
    """``{name: argv}`` of the node's two workers, named ``io-<tag>@<host>`` and ``tools-<tag>@<host>``.
    The I/O pool and its size: ``io_pool_config(io_pool, io_concurrency)``, which raises ``ValueError`` for
    a configuration it refuses. A solo pool gets no ``-c``: Celery then sizes its prefetch by the
    cores (its banner's ``concurrency: N (solo)``), while solo runs one task at a time. The tools
    pool's processes: ``tools_pool_config(tools_concurrency)``, which raises ``ValueError`` the same
    way. The ``AGENT_*`` settings are read from ``env`` (default this process's environment)."""
    pool, io_c = io_pool_config(io_pool, io_concurrency, env=env)
    tools_c = tools_pool_config(tools_concurrency, env=env)
    tag = tag or uuid.uuid4().hex[:4]
    return {
        "worker-io": worker_argv(IO_QUEUES, name=f"io-{tag}@%h", pool=pool, concurrency=io_c, loglevel=loglevel),
        "worker-tools": worker_argv(
            TOOL_QUEUES, name=f"tools-{tag}@%h", pool="prefork", concurrency=tools_c, loglevel=loglevel
        ),
    }


def pool_env(name: str, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the node's pool ``name`` (a key of ``worker_commands``), from ``env``
    (default this process's). Each pool serves its own metrics: with ``AGENT_METRICS_PORT=N``
    the I/O pool listens on N and the tools pool on N+1 (two servers on one port left the tools
    pool's ``agent_tool_call_seconds`` unserved), each with its own multiprocess directory.
    Raises ``ValueError`` naming the variable when it is malformed."""
    from tasks.metrics import metrics_port

    out = dict(os.environ if env is None else env)
    port = metrics_port(out)
    if port and name == "worker-tools":
        if port == 65535:
            raise ValueError("AGENT_METRICS_PORT must leave the next port for the tools pool (at most 65534)")
        out["AGENT_METRICS_PORT"] = str(port + 1)
    out.pop("PROMETHEUS_MULTIPROC_DIR", None)  # each pool's main process creates its own
    return out


def beat_command(loglevel: str = "INFO") -> list[str]:
    """argv of celery beat with the Redis-restart-proof redbeat scheduler (``tasks.beat``)."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tasks.app",
        "beat",
        "-S",
        "tasks.beat:ResilientRedBeatScheduler",
        "--max-interval",
        "1",
        "-l",
        loglevel,
    ]


# Restart backoff: 1 s, doubling to MAX_BACKOFF while a process keeps exiting within STABLE_AFTER
# seconds of its start (a crash loop), back to 1 s once it has run that long.
MAX_BACKOFF = 8.0
STABLE_AFTER = 10.0


class Supervisor:
    """Starts named processes, restarts any that exits (backoff below), stops all.

    ``logdir``: each process appends its output to ``<logdir>/<name>.log`` (None: inherit).
    ``on_restart(name, returncode)`` is called before each restart (for a console line).
    ``on_exit(name, pid, returncode)`` is called as soon as an exit is seen, before the backoff
    (``devtools.node_recovery.NodeRecovery`` re-drives a dead worker's turns from there).
    """

    def __init__(
        self,
        logdir: Path | None = None,
        on_restart: Callable[[str, int | None], None] | None = None,
        on_exit: Callable[[str, int, int | None], None] | None = None,
    ):
        self.logdir = logdir
        self.on_restart = on_restart or (lambda name, code: log.warning("%s exited (%s); restarting", name, code))
        self.on_exit = on_exit
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.commands: dict[str, list[str]] = {}
        self.envs: dict[str, dict[str, str] | None] = {}
        self.restarts: dict[str, int] = {}
        self._logs: dict[str, IO[str]] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._started_at: dict[str, float] = {}

    def _popen(self, name: str) -> "subprocess.Popen[bytes]":
        self._started_at[name] = time.monotonic()
        out: IO[str] | None = None
        if self.logdir is not None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            out = self._logs.get(name) or open(self.logdir / f"{name}.log", "a")
            self._logs[name] = out
        return subprocess.Popen(
            self.commands[name],
            cwd=ROOT,
            env=self.envs.get(name) or os.environ.copy(),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            start_new_session=True,  # a Ctrl-C meant for the supervisor reaches it first
            preexec_fn=lifetime.preexec(),  # a supervisor killed outright takes its workers along
        )

    def start(self, name: str, cmd: list[str], env: dict[str, str] | None = None) -> "subprocess.Popen[bytes]":
        """Start ``cmd`` as ``name`` (environment ``env``, default this one) and keep it running until ``stop()``."""
        with self._lock:
            self.commands[name] = cmd
            self.envs[name] = env
            self.procs[name] = self._popen(name)
            self.restarts.setdefault(name, 0)
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="supervisor", daemon=True)
            self._thread.start()
        return self.procs[name]

    def _watch(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stopping.wait(0.1):  # a poll() per process: an exit is seen within 0.1 s
            with self._lock:
                items = list(self.procs.items())
            for name, proc in items:
                code = proc.poll()
                if code is None or self._stopping.is_set():
                    continue
                if time.monotonic() - self._started_at.get(name, 0.0) >= STABLE_AFTER:
                    backoff[name] = 1.0  # it had been running fine: not a crash loop
                delay = backoff.get(name, 1.0)
                if self.on_exit is not None:
                    self.on_exit(name, proc.pid, code)
                self.on_restart(name, code)
                if self._stopping.wait(delay):
                    return
                with self._lock:
                    self.procs[name] = self._popen(name)
                    self.restarts[name] += 1
                backoff[name] = min(delay * 2, MAX_BACKOFF)

    def stop(self, grace: float = 20.0) -> None:
        """Stop every process: SIGTERM to its group, SIGKILL after ``grace`` seconds."""
        self._stopping.set()
        with self._lock:
            procs = list(self.procs.values())
        for proc in procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for proc in procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        for out in self._logs.values():
            out.close()


def main() -> None:
    """``python -m devtools.workers [--beat]``: the node's workers (and beat) under the supervisor."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--beat", action="store_true", help="also run celery beat (one per deployment)")
    args = parser.parse_args()
    if not os.environ.get("REDIS_URL"):
        raise SystemExit("set REDIS_URL to the Redis of your stack (make redis starts one)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s supervisor: %(message)s")
    from devtools.node_recovery import NodeRecovery

    try:
        envs = {name: pool_env(name) for name in worker_commands(tag="x")}
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    commands = worker_commands()
    sup = Supervisor(on_exit=NodeRecovery(set(commands)))
    for name, cmd in commands.items():
        sup.start(name, cmd, env=envs[name])
    if args.beat:
        sup.start("beat", beat_command())
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    sup.stop()


if __name__ == "__main__":
    main()
