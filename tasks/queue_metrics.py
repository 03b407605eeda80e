"""Metrics read from Redis at scrape time: the broker queues' backlog and the age of their oldest
message, and the approvals waiting for a person and the age of the oldest.

Queue lists are kombu's Redis transport's: one list per queue and priority step (``turns``,
``turns\\x06\\x163``...), pushed on the left and popped on the right, so the oldest message is
at index -1. Its age comes from the ``published_at`` header every task message gets when it is
published (``stamp_published_at``, a ``before_task_publish`` handler, epoch seconds).

Metrics (gauges):

- ``agent_queue_backlog{queue}``: messages waiting (every priority);
- ``agent_queue_oldest_age_seconds{queue}``: age of the oldest waiting message (0 when empty);
- ``agent_approvals_waiting``: tool calls waiting for a person's decision;
- ``agent_approval_oldest_wait_seconds``: how long the oldest of them has waited (0: none).

A scrape during a Redis outage yields none of them (the scrape itself still answers).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterator

import orjson
from celery.signals import before_task_publish

log = logging.getLogger("agent.metrics")

PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: <queue><sep><priority>
PRIORITY_STEPS = (0, 3, 6, 9)  # kombu's default priority steps


@before_task_publish.connect(weak=False)
def stamp_published_at(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """Put ``published_at`` (epoch seconds) in every task message's headers."""
    if headers is not None:
        headers.setdefault("published_at", round(time.time(), 3))


def queue_keys(queue: str) -> list[str]:
    """The Redis lists of ``queue``, one per priority step."""
    return [queue if p == 0 else f"{queue}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def _published_at(raw: bytes | None) -> float | None:
    if not raw:
        return None
    try:
        headers = orjson.loads(raw).get("headers") or {}
        return float(headers["published_at"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return None  # a message from a publisher without the stamp


class QueueBacklog:
    """Collector of ``agent_queue_backlog`` and ``agent_queue_oldest_age_seconds`` for ``queues``."""

    def __init__(self, redis_client: Any, queues: tuple[str, ...]):
        self.r, self.queues = redis_client, queues

    def read(self) -> dict[str, tuple[int, float]]:
        """``{queue: (messages waiting, age of the oldest in seconds)}``; raises ``redis.RedisError``."""
        with self.r.pipeline(transaction=False) as p:
            for q in self.queues:
                for k in queue_keys(q):
                    p.llen(k)
                    p.lindex(k, -1)
            res = p.execute()
        now, out, i = time.time(), {}, 0
        for q in self.queues:
            n, oldest = 0, None
            for _ in PRIORITY_STEPS:
                n += int(res[i])
                at = _published_at(res[i + 1])
                if at is not None:
                    oldest = at if oldest is None else min(oldest, at)
                i += 2
            out[q] = (n, max(0.0, now - oldest) if oldest is not None and n else 0.0)
        return out

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        try:
            read = self.read()
        except Exception:  # a scrape must not fail because Redis did
            log.warning("agent_queue_backlog: Redis unavailable")
            return
        backlog = GaugeMetricFamily("agent_queue_backlog", "Messages waiting in a broker queue.", labels=["queue"])
        age = GaugeMetricFamily(
            "agent_queue_oldest_age_seconds",
            "Age of the oldest message waiting in a queue (0: empty).",
            labels=["queue"],
        )
        for q, (n, a) in read.items():
            backlog.add_metric([q], n)
            age.add_metric([q], round(a, 3))
        yield backlog
        yield age


class ApprovalsWaiting:
    """Collector of ``agent_approvals_waiting`` and ``agent_approval_oldest_wait_seconds``."""

    def __init__(self, redis_client: Any):
        self.r = redis_client

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        from worker.turn.approvals import ApprovalRecords

        try:
            waiting = ApprovalRecords(self.r).pending()
        except Exception:
            log.warning("agent_approvals_waiting: Redis unavailable")
            return
        oldest = min((rec.requested_at for rec in waiting), default=None)
        yield GaugeMetricFamily("agent_approvals_waiting", "Tool calls waiting for a person's decision.", len(waiting))
        yield GaugeMetricFamily(
            "agent_approval_oldest_wait_seconds",
            "How long the oldest call waiting for approval has waited (0: none).",
            round(max(0.0, time.time() - oldest), 3) if oldest is not None else 0.0,
        )
