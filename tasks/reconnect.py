"""The worker's consumer, reconnecting to the broker within a second or two of Redis being back.

Celery's consumer reconnects through kombu's ``ensure_connection`` with kombu's default intervals,
which Celery's settings do not reach: 2 s, then 4, 6... up to 30 s between attempts. A Redis
restart or a failover (a replica promoted within 2-3 s of the primary's death: docs/failover.md)
then left every worker idle for 4-6 s after the new primary took writes, and up to 30 s after a
longer outage. Here the attempts come every 0.5 s, then 1, 1.5 and 2 s at most; each is one
connection (through each Sentinel in turn when there are Sentinels), cheap against a Redis that
does not answer.
"""

from __future__ import annotations

import functools
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

# Seconds between reconnection attempts: the first, the step added after each, the longest.
RECONNECT_START, RECONNECT_STEP, RECONNECT_MAX = 0.5, 0.5, 2.0


class Consumer(CeleryConsumer):
    """Celery's consumer (``worker_consumer``) whose broker reconnection uses ``RECONNECT_*``."""

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
