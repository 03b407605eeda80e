"""celery beat's scheduler: celery-redbeat, made to wait out a Redis restart.

redbeat's ``tick`` extends its leader lock in Redis on every pass; when Redis restarts, the
``ConnectionError`` ends the beat process (measured: 4 of 4 Redis restarts). Here a pass that
cannot reach Redis is retried a second later, and a lock that expired meanwhile is acquired
again (blocking while another beat replica holds it: that one is the leader now, this one
stands by, as redbeat does at start). A beat started while Redis is down waits for it.

A task that sends no task events (``send_events=False``: the watchdog sweep, once a second) is also
sent without a ``task-sent`` event: the app sends one for every task (``task_send_sent_event``, so
that Flower shows a turn's steps as soon as they are queued), and Flower would otherwise list every
sweep as a PENDING row that never moves on (``apply_async`` below).
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

    def apply_async(self, entry: Any, producer: Any = None, advance: bool = True, **kwargs: Any) -> Any:
        """Send a due entry's task; one whose task sends no events goes without a ``task-sent``
        event either (the module docstring). Beat sends from one thread, so the app's setting is
        switched for this one send."""
        task = self.app.tasks.get(entry.task)
        if task is None or task.send_events:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        conf = self.app.conf
        before = conf.task_send_sent_event
        conf.task_send_sent_event = False
        try:
            return super().apply_async(entry, producer=producer, advance=advance, **kwargs)
        finally:
            conf.task_send_sent_event = before
