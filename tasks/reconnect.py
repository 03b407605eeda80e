"""The worker's consumer, reconnecting to the broker within a second or two of Redis being back.

Celery's consumer reconnects through kombu's ``ensure_connection`` with kombu's default intervals,
which Celery's settings do not reach: 2 s, then 4, 6... up to 30 s between attempts. A Redis
restart or a failover (a replica promoted within 2-3 s of the primary's death: docs/failover.md)
then left every worker idle for 4-6 s after the new primary took writes, and up to 30 s after a
longer outage. Here the attempts come every 0.5 s, then 1, 1.5 and 2 s at most; each is one
connection (through each Sentinel in turn when there are Sentinels), cheap against a Redis that
does not answer.

It also sends the worker's task events (``task-received``, ``task-started``, ``task-succeeded``...,
which Flower reads) in batches: Celery buffers them and publishes what the buffer holds at the
event loop's next turn, which under load is one ``PUBLISH`` for one or two events (about five
Redis commands per turn of two model calls and a tool call). Here the buffer is published
``EVENT_FLUSH_DELAY`` s after its first event, or at once when it holds Celery's ``buffer_limit``
(24): Flower sees an event at most that much later, and a worker that is killed loses the events
of its last ``EVENT_FLUSH_DELAY`` s (a warm shutdown publishes them). Flower's task list is the
same (docs/operations.md, "Flower").
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

# Seconds between reconnection attempts: the first, the step added after each, the longest.
RECONNECT_START, RECONNECT_STEP, RECONNECT_MAX = 0.5, 0.5, 2.0
# Seconds a buffered task event waits for others before its batch is published.
EVENT_FLUSH_DELAY = 0.2


class Consumer(CeleryConsumer):
    """Celery's consumer (``worker_consumer``) whose broker reconnection uses ``RECONNECT_*`` and
    whose task events go in batches (``EVENT_FLUSH_DELAY``)."""

    _flush_pending = False

    def on_send_event_buffered(self) -> Any:
        """A task event was buffered (called by the event dispatcher, from any thread): publish the
        buffer in ``EVENT_FLUSH_DELAY`` s unless a publish is already due (Celery: at the loop's
        next turn). The flag is a plain attribute: a race only schedules one publish more."""
        hub = getattr(self, "hub", None)  # Celery's event loop (not in its stubs)
        if hub is not None and not self._flush_pending:
            self._flush_pending = True
            hub.call_later(EVENT_FLUSH_DELAY, self._flush_batch)

    def _flush_batch(self) -> None:
        self._flush_pending = False
        self._flush_events()  # type: ignore[attr-defined]  # Celery's Consumer (not in its stubs)

    def shutdown(self) -> None:
        """Publish the buffered events, then Celery's shutdown."""
        self._flush_events()  # type: ignore[attr-defined]  # as above
        super().shutdown()

    def ensure_connected(self, conn: Any) -> Any:
        """Celery's ``ensure_connected`` (its error reporting, retry settings and shutdown check),
        with this module's intervals given to the connection's ``ensure_connection``."""
        conn.ensure_connection = functools.partial(
            conn.ensure_connection,
            interval_start=RECONNECT_START,
            interval_step=RECONNECT_STEP,
            interval_max=RECONNECT_MAX,
        )
        return super().ensure_connected(conn)
