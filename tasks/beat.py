"""celery beat's scheduler: celery-redbeat, made to wait out a Redis restart.

redbeat's ``tick`` extends its leader lock in Redis on every pass; when Redis restarts, the
``ConnectionError`` ends the beat process (measured: 4 of 4 Redis restarts). Here a pass that
cannot reach Redis is retried a second later, and a lock that expired meanwhile is acquired
again (blocking while another beat replica holds it: that one is the leader now, this one
stands by, as redbeat does at start). A beat started while Redis is down waits for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis
from redbeat import RedBeatScheduler

log = logging.getLogger("agent.beat")

RETRY_SECONDS = 1.0


class ResilientRedBeatScheduler(RedBeatScheduler):  # type: ignore[misc]  # redbeat is untyped (Any)
    """``RedBeatScheduler`` whose ``tick`` survives a Redis restart (see the module docstring)."""

    def setup_schedule(self) -> Any:
        """redbeat reads its entries from Redis at start: wait for Redis instead of exiting."""
        delay = RETRY_SECONDS
        while True:
            try:
                return super().setup_schedule()
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("beat: Redis did not answer at start (%s); retrying in %.0fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def tick(self, *args: Any, **kwargs: Any) -> Any:
        """One scheduler pass; returns seconds until the next. Never raises for a Redis outage."""
        try:
            return super().tick(*args, **kwargs)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("beat: Redis did not answer (%s); retrying in %.0fs", exc, RETRY_SECONDS)
            return RETRY_SECONDS
        except redis.exceptions.LockError as exc:  # the leader lock expired while Redis was away
            log.warning("beat: lost the leader lock (%s); acquiring it again", exc)
            try:
                self.lock.acquire()
            except (redis.ConnectionError, redis.TimeoutError):
                return RETRY_SECONDS
            log.info("beat: acquired the leader lock again")
            return 0.0
