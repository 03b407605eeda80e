"""A prefork node's held turn tasks (``tasks.broker.QoS.append``, ``tasks.liveness``), against the
embedded Redis through kombu's real Redis channel: a fetched turn task is recorded as held by the
node in the same pipeline as kombu's own record of the fetch (``unacked``); other tasks, and a
node that keeps its held set in memory, record nothing there."""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import orjson
import pytest
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


def test_the_fetch_record_is_the_popped_text(redis_url):
    """The fetch record (``unacked``) holds the payload as it was popped, spliced in, not the
    decoded payload encoded again: the same value, as kombu's restore reads it."""
    r = redis.Redis.from_url(redis_url)
    app = broker_app(redis_url)
    queue = f"held-test-{uuid.uuid4().hex[:8]}"
    app.send_task("tasks.health.ping", (), queue=queue)
    queued = r.lindex(queue, 0)
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue(queue).get(timeout=5)
        record = r.hget("unacked", message.delivery_tag)
        message.ack()
    assert record.startswith(b"[" + queued + b",")
    info = message.delivery_info
    assert orjson.loads(record) == [orjson.loads(queued), info["exchange"], info["routing_key"]]


def test_other_tasks_and_in_process_nodes_record_nothing(redis_url, held):
    r = redis.Redis.from_url(redis_url)
    with _fetched(redis_url, "tasks.health.ping", ()) as other:
        assert r.hlen(held) == 0 and r.hexists("unacked", other.delivery_tag)
    broker.record_fetched_turns(None)  # a threads or solo node: its held set lives in memory
    with _fetched(redis_url, "tasks.turns.tool_call", ("turn-held", 0, "c1")) as turn:
        assert r.hlen(held) == 0 and r.hexists("unacked", turn.delivery_tag)


def test_an_in_process_node_flushes_only_what_changed(redis_url, monkeypatch):
    # Ten thousand calls in flight were rewritten whole (DEL and HSET of every field) twice a
    # second; a flush now writes the whole set once, then the changes, and the whole set again
    # after a flush that failed.
    from tasks import held, liveness
    from worker.turn import liveness as records_module

    for name, value in (("_held", {}), ("_added", {}), ("_removed", set()), ("_whole", True)):
        monkeypatch.setattr(held, name, value)
    node = f"test-node:{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    records = records_module.Liveness(r, 4.0)
    key = records_module.held_key(node)
    for i in range(10_000):
        held.hold(f"step:t{i}:1", f"t{i}")
    liveness.flush_held(node, records)
    assert r.hlen(key) == 10_000

    held.hold("step:new:1", "new")
    held.release("step:t0:1")
    held.hold("gone-at-once", "t1")
    held.release("gone-at-once")
    whole, added, removed = held.take_changes()
    assert whole is None and added == {"step:new:1": "new"} and removed == ["gone-at-once", "step:t0:1"]
    held.resync()  # those changes were taken, not written: as after a failed flush

    held.release("step:t1:1")
    broken = records_module.Liveness(redis.Redis(port=1, socket_connect_timeout=0.2), 4.0)
    with pytest.raises(redis.ConnectionError):
        liveness.flush_held(node, broken)
    liveness.flush_held(node, records)  # the whole set again
    assert r.hlen(key) == 9_999 and r.hget(key, "step:new:1") == b"new" and not r.hexists(key, "step:t1:1")

    held.release("step:t2:1")
    calls = r.info("commandstats").get("cmdstat_hset", {}).get("calls", 0)
    liveness.flush_held(node, records)
    assert not r.hexists(key, "step:t2:1") and r.hlen(key) == 9_998
    assert r.info("commandstats").get("cmdstat_hset", {}).get("calls", 0) == calls  # a delete only


def test_the_heartbeat_writes_the_whole_held_set_now_and_then(redis_url, monkeypatch):
    # A write the primary acknowledged and lost in a failover (asynchronous replication) is made
    # good: between flushes of changes, the heartbeat writes the whole set every HELD_WHOLE_SECONDS.
    import threading

    from tasks import held, liveness
    from worker.turn import liveness as records_module

    for name, value in (("_held", {}), ("_added", {}), ("_removed", set()), ("_whole", True)):
        monkeypatch.setattr(held, name, value)
    monkeypatch.setattr(held, "_in_process", True)
    monkeypatch.setattr(liveness, "HELD_FLUSH_SECONDS", 0.05)
    monkeypatch.setattr(liveness, "HELD_WHOLE_SECONDS", 0.5)
    monkeypatch.setattr(liveness, "_stop", threading.Event())
    node = f"test-node:{uuid.uuid4().hex[:8]}"
    r = redis.Redis.from_url(redis_url)
    records = records_module.Liveness(r, 4.0)
    key = records_module.held_key(node)
    held.hold("step:a:1", "a")
    beat = threading.Thread(target=liveness._heartbeat, args=(node, records), daemon=True)
    beat.start()
    try:
        deadline = time.monotonic() + 10
        while not r.hexists(key, "step:a:1") and time.monotonic() < deadline:
            time.sleep(0.02)
        r.hdel(key, "step:a:1")  # the failover lost it; no change of the node's own rewrites it
        while not r.hexists(key, "step:a:1") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert r.hget(key, "step:a:1") == b"a"
    finally:
        liveness._stop.set()
        beat.join(5)
