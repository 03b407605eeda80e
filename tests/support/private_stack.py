"""A stack of its own for tests that kill things: a persistent embedded Redis, workers and beat
that point at it, and a control plane on it. The session's shared Redis and workers are never
touched, so killing a worker or restarting Redis here disturbs no other test."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from devtools import lifetime
from devtools.embedded_redis import EmbeddedRedis
from devtools.workers import beat_command, worker_argv

ROOT = Path(__file__).resolve().parent.parent.parent
# Seconds a worker or beat may take to start: a 2-core machine running other suites beside this one
# took over 30 s once (a start imports Celery, kombu, pydantic and the runtime).
START_TIMEOUT = 90


class PrivateStack:
    """``start_worker(...)`` / ``start_beat()`` / ``redis`` (an ``EmbeddedRedis`` with persistence) /
    ``control`` (a ``ControlPlane`` on this Redis). ``env`` holds the extra environment of every process.

    ``redis_set``: the Redis to start and use instead of a plain persistent one: an
    ``EmbeddedRedis`` of the caller's (e.g. TLS), or an ``EmbeddedSentinelSet``, whose primary every
    process then reaches through its Sentinels (``sentinels`` is the set; ``redis`` is None)."""

    def __init__(self, redis_set: Any = None, **env: Any):
        from control.client import ControlPlane

        server = redis_set or EmbeddedRedis(persist=True)
        self.redis: EmbeddedRedis | None = server if isinstance(server, EmbeddedRedis) else None
        self.sentinels = None if self.redis is not None else server
        server.start()
        self.url, control_url = server.url, server.control_url
        extra = {k: v for k, v in server.env.items() if k != "CONTROL_REDIS_URL"}
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "CONTROL_REDIS_URL"},
            "REDIS_URL": self.url,
            "AGENT_LIVENESS_TTL": "2",
            "AGENT_WATCHDOG_INTERVAL": "0.5",
            **extra,
            **{k: str(v) for k, v in env.items()},
        }
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self.control_url = control_url
        self.endpoint = self._endpoint(control_url)
        self.control = ControlPlane(self.endpoint)

    def _endpoint(self, url: str) -> Any:
        """``url`` through this stack's Sentinels and TLS files (the test process's own settings
        name the session's Redis)."""
        from worker.redis_connection import redis_endpoint
        from worker.settings import Settings

        return redis_endpoint(Settings(**{k: v for k, v in self.env.items() if k.startswith("AGENT_REDIS_")}), url=url)

    def client(self, user: str = "worker") -> Any:
        """A redis-py client of this stack's primary (through its Sentinels), as ``user``."""
        url = self.url if user == "worker" else self.control_url
        return self._endpoint(url).client(socket_timeout=10)

    def _spawn(self, kind: str, cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        log = Path(tempfile.gettempdir()) / f"private-{kind}-{uuid.uuid4().hex[:6]}.log"
        self.logs.append(log)
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lifetime.preexec(),
        )
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def start_worker(
        self,
        *extra: str,
        pool: str = "threads",
        concurrency: int = 8,
        queues: str = "turns,tools,background,workflow",
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen:
        """A worker on this Redis (``env``: its own extra environment); returns once its heartbeat
        is in this Redis (RuntimeError after ``START_TIMEOUT`` s).

        (Not a ping: Celery's remote control publishes through the app's default broker.)"""
        name = f"private-{uuid.uuid4().hex[:6]}"
        loglevel = os.environ.get("PRIVATE_STACK_LOGLEVEL", "WARNING")
        argv = worker_argv(
            queues, name=f"{name}@%h", pool=pool, concurrency=concurrency, loglevel=loglevel, extra=extra
        )
        proc = self._spawn("worker", argv, env)
        from worker.turn.liveness import HOST

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited early; see {proc.log}")
            if self.control.redis.exists(f"agent:alive:{HOST}:{proc.pid}"):
                time.sleep(0.5)  # consumers start right after worker_init
                return proc
            time.sleep(0.1)
        raise RuntimeError(
            f"worker did not write its heartbeat within {START_TIMEOUT} s; see {proc.log} "
            "(empty at the WARNING level if nothing went wrong: PRIVATE_STACK_LOGLEVEL=INFO shows its start)"
        )

    def start_beat(self) -> subprocess.Popen:
        """celery beat (the Redis-restart-proof redbeat scheduler) on this Redis."""
        proc = self._spawn("beat", beat_command())
        deadline = time.monotonic() + START_TIMEOUT
        while not self.control.redis.exists("redbeat::lock"):  # taken once its scheduler runs
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"beat did not start; see {proc.log}")
            time.sleep(0.1)
        return proc

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        """SIGKILL the process and its children (a crash, not a shutdown)."""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()

    def close(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after 15 s), then Redis."""
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill(proc)
        if self.redis is not None:
            self.redis.stop()
        if self.sentinels is not None:
            self.sentinels.stop()


# The progress deadline set far out (seconds of slack): a turn a test sees recovered was recovered
# by liveness (a node's death reported or its heartbeat gone), not by its deadline.
SLOW_DEADLINE = {"AGENT_PROGRESS_SLACK": "900"}
