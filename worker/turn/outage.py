"""Riding out a Redis outage without losing what was paid for.

A model reply or a tool result exists only in this process until the turn store has it.
If Redis fails at that moment (a restart, a failover), the step keeps the value (``Unsaved``) and
saves it again with backoff (``until_redis_answers``) until Redis answers, bounded by
``Settings.redis_outage_timeout``. The wait happens in the step itself, so it does not depend
on the broker (the same Redis) being up to queue a retry; and a redelivered step or call in
this process finds the value in ``Unsaved`` instead of paying the model or running the tool
again (docs/architecture.md "Redis outages").
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, TypeVar

import redis

log = logging.getLogger("agent.loop")

T = TypeVar("T")


class BrokerUnavailable(ConnectionError):
    """The message broker did not take a message (the Celery edge converts its transport's
    connection errors into this: ``worker/`` knows no broker library)."""


# What counts as "Redis is not answering" (a reply from Redis, even an error, is not an outage),
# and a demoted primary's READONLY (a failover under way: docs/failover.md; a Sentinel-managed
# client turns it into a ConnectionError itself and asks the Sentinels again).
OUTAGE_ERRORS = (redis.ConnectionError, redis.TimeoutError, redis.exceptions.ReadOnlyError, BrokerUnavailable)
# The longest wait between two attempts (seconds): a failover takes 2-5 s, a restart a few.
LONGEST_RETRY = 1.0


class Unsaved:
    """Values paid for but not yet stored, keyed by e.g. ``(turn_id, step)``; bounded, thread-safe."""

    def __init__(self, limit: int = 10_000):
        self._items: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.limit = limit

    def put(self, key: Any, value: Any) -> None:
        """Keep ``value`` until ``drop(key)``; the oldest entry goes when ``limit`` is passed."""
        with self._lock:
            self._items[key] = value
            while len(self._items) > self.limit:
                self._items.popitem(last=False)

    def get(self, key: Any) -> Any:
        """The kept value, or None."""
        with self._lock:
            return self._items.get(key)

    def drop(self, key: Any) -> None:
        """Forget ``key`` (it is stored now)."""
        with self._lock:
            self._items.pop(key, None)


def until_redis_answers(
    run: Callable[[], T], *, what: str, timeout: float, sleep: Callable[[float], None] = time.sleep
) -> T:
    """Call ``run()`` until it returns, retrying Redis outages with backoff (0.2 s doubling to
    ``LONGEST_RETRY``: the step waits in place, so a short wait brings it back soon after Redis).

    Used to store what was paid for (a reply, a result) and, in ``tasks.turns``, to run a whole
    step or call again (fenced and claimed, so safe to repeat). ``what`` names it in the log.
    Returns what ``run`` returns. Raises the last ``redis.ConnectionError``/``TimeoutError`` once
    ``timeout`` seconds have passed; any other error at once.
    """
    deadline = time.monotonic() + timeout
    delay = 0.2
    while True:
        try:
            return run()
        except OUTAGE_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("%s: Redis did not answer (%s); again in %.1fs", what, exc, delay)
            sleep(delay)
            delay = min(delay * 2, LONGEST_RETRY)
