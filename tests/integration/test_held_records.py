"""A prefork node's held turn tasks (``tasks.broker.QoS.append``, ``tasks.liveness``), against the
embedded Redis through kombu's real Redis channel: a fetched turn task is recorded as held by the
node in the same pipeline as kombu's own record of the fetch (``unacked``); other tasks, and a
node that keeps its held set in memory, record nothing there."""

from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

import redis

from tasks import broker
from tests.integration.conftest import broker_app


@contextmanager
def _fetched(redis_url: str, task: str, args: tuple) -> Iterator:
    """Publish ``task(*args)`` on a queue of its own and fetch it as a worker does (acks late);
    the connection stays open meanwhile (closing it gives unacked messages back)."""
    app = broker_app(redis_url)
    queue = f"held-test-{uuid.uuid4().hex[:8]}"
    app.send_task(task, args, queue=queue)
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue(queue).get(timeout=5)
        yield message
        message.ack()


def test_a_fetched_turn_task_is_held_with_the_fetch(redis_url, held):
    r = redis.Redis.from_url(redis_url)
    with _fetched(redis_url, "tasks.turns.tool_call", ("turn-held", 0, "c1")) as message:
        assert r.hget(held, message.headers["id"]) == b"turn-held"
        assert r.hexists("unacked", message.delivery_tag)  # kombu's own record, in the same pipeline
    assert not r.hexists("unacked", message.delivery_tag)


def test_other_tasks_and_in_process_nodes_record_nothing(redis_url, held):
    r = redis.Redis.from_url(redis_url)
    with _fetched(redis_url, "tasks.health.ping", ()) as other:
        assert r.hlen(held) == 0 and r.hexists("unacked", other.delivery_tag)
    broker.record_fetched_turns(None)  # a threads or solo node: its held set lives in memory
    with _fetched(redis_url, "tasks.turns.tool_call", ("turn-held", 0, "c1")) as turn:
        assert r.hlen(held) == 0 and r.hexists("unacked", turn.delivery_tag)
