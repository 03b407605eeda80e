"""Writes that must survive a failover: each is followed by Redis ``WAIT`` for a replica.

Redis replicates asynchronously: a primary answers a write before any replica has it, and a
primary killed in that moment takes the write with it when Sentinel promotes the replica. For
most writes of a turn that loss is recovered (a lost message or transition is re-driven; a
re-sent step or call is fenced and claimed). For three it is not, because they fence something
that cannot be undone (docs/failover.md):

- a destructive tool call's claim, before the tool runs: lost, a re-driven call would find no
  claim and run the tool again;
- a model reply's memo: lost, a re-driven step would pay for the call again;
- the record of a background response's id (the model call's own idempotency): lost, a
  re-driven step would start and pay for a second response.

``ReplicaAck.write`` sends such a write and ``WAIT <replicas> <timeout>`` in one pipeline: one
connection (``WAIT`` counts the replicas that have the writes of the connection it runs on), one
round trip. It answers whether enough replicas acknowledged in time. What a caller does when
they did not is its own decision, written in docs/failover.md: a destructive call does not run
(``required=True``); a memo, already paid for, is kept and the turn goes on (``required=False``).

With no replica configured (``AGENT_REDIS_REPLICA_ACKS=0``, the default without Sentinels) there
is no ``WAIT`` and every write counts as acknowledged: a single Redis has no failover to lose a
write to (its append-only file covers a restart). After a best-effort write was not acknowledged
(no replica connected, e.g. right after a failover until the old primary returns as a replica),
best-effort writes skip their ``WAIT`` for ``SKIP_AFTER_MISS`` timeouts instead of each holding
its thread for the whole timeout; required writes always wait.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Sequence

import redis

from worker.turn import metrics

log = logging.getLogger("agent.durability")

# After a best-effort write was not acknowledged, best-effort writes skip their WAIT for this
# many timeouts (a replica that is gone would otherwise cost each of them the whole timeout).
SKIP_AFTER_MISS = 5


class ReplicaAck:
    """``WAIT`` for ``replicas`` replicas, up to ``timeout`` seconds, after a write (see the module
    docstring); ``replicas=0``: no ``WAIT`` at all."""

    def __init__(self, replicas: int = 0, timeout: float = 1.0):
        self.replicas = replicas
        self.timeout = timeout
        self._skip_until = 0.0
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        """True when fencing writes wait for replicas."""
        return self.replicas > 0

    def write(
        self, client: Any, what: str, build: Callable[[Any], None], *, required: bool, scripts: Sequence[Any] = ()
    ) -> tuple[list[Any], bool]:
        """Run the commands ``build(pipeline)`` queues on ``client`` (a ``redis.Redis``), then
        ``WAIT``, in one pipeline (not a transaction: a script queued there is one atomic write;
        queue it with ``run_script``, and name it in ``scripts``). Returns ``(replies of the
        queued commands, acknowledged)``; ``what`` names the write in the log and in
        ``agent_replica_ack_misses_total{write}``. Raises redis-py's errors as they come (a
        failover in the middle is an outage to the caller: ``worker.turn.outage``)."""
        wait = self.enabled and (required or time.monotonic() >= self._skip_until)
        replies = self._send(client, build, wait, scripts)
        if not self.enabled:
            return replies, True
        if not wait:
            metrics.REPLICA_ACK_MISSES.labels(what).inc()
            return replies, False
        acked = int(replies[-1]) >= self.replicas
        if not acked:
            metrics.REPLICA_ACK_MISSES.labels(what).inc()
            log.warning(
                "%s: %d of %d replicas acknowledged within %.1fs", what, int(replies[-1]), self.replicas, self.timeout
            )
            if not required:
                with self._lock:
                    self._skip_until = time.monotonic() + SKIP_AFTER_MISS * self.timeout
        elif not required and self._skip_until:
            with self._lock:
                self._skip_until = 0.0
        return replies[:-1], acked

    def _send(self, client: Any, build: Callable[[Any], None], wait: bool, scripts: Sequence[Any]) -> list[Any]:
        for attempt in (1, 2):
            with client.pipeline(transaction=False) as pipe:
                build(pipe)
                if wait:
                    pipe.execute_command("WAIT", self.replicas, max(1, int(self.timeout * 1000)))
                try:
                    return list(pipe.execute())
                except redis.exceptions.NoScriptError:
                    # A promoted replica has an empty script cache (scripts are not replicated):
                    # nothing ran; load the pipeline's scripts there and send it again.
                    if attempt == 2:
                        raise
                    for script in scripts:
                        script.sha = client.script_load(script.script)
        raise AssertionError("unreachable")


def run_script(pipe: Any, script: Any, keys: list[Any], args: list[Any]) -> None:
    """Queue ``script`` (a redis-py ``Script``) on ``pipe`` as one ``EVALSHA``, without the
    ``SCRIPT EXISTS`` round trip redis-py's pipelines add for a script (``ReplicaAck.write``
    loads it where the server lacks it, given it in ``scripts``)."""
    pipe.evalsha(script.sha, len(keys), *keys, *args)


class NotDurable(Exception):
    """A required write (a destructive call's claim) was made but no replica acknowledged it in
    time: what it fences must not happen now (docs/failover.md)."""


NO_REPLICAS = ReplicaAck(0)
"""No ``WAIT``: a store on a Redis without replicas (the default without Sentinels)."""
