"""A worker sends each message with its ``task-sent`` event in one Redis round trip, and a group's
messages all in one (``tasks.dispatcher.publish``, a kombu publish batch). Celery alone takes two
round trips per message. Run in a process of its own against a private Redis with no workers, so
the messages stay in their queues to be read back. A worker's next message can instead be
recorded, not sent, for the script that decides it (``tasks.recorded_publish``): the same message.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import pytest
import redis

from tests.support.private_stack import ROOT, PrivateStack

# A process that counts the round trips it sends (``sent``) once its dispatcher is warm.
COUNTING = """
import redis.connection as rc
from tasks.app import app
from tasks.dispatcher import CeleryDispatcher
from worker.turn.dispatch import Batch

with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
d = CeleryDispatcher()
d.enqueue_step("warm", 0, queue="turns")  # connections and declarations made once per process
sent = []
plain = rc.AbstractConnection.send_packed_command
def counted(self, command, check_health=True):
    sent.append(1)
    return plain(self, command, check_health)
rc.AbstractConnection.send_packed_command = counted
"""

COUNT = (
    COUNTING
    + """
d.enqueue_step("rt-turn", 3, queue="turns")
print("step", len(sent), flush=True)
del sent[:]
d.dispatch_batch("rt-turn", 3, 0, Batch(mode="parallel", call_ids=["c1", "c2", "c3"]), queue="tools")
print("group", len(sent), flush=True)
"""
)


@pytest.fixture
def stack():
    s = PrivateStack()
    yield s
    s.close()


@contextmanager
def _task_sent_events(r: redis.Redis) -> Iterator[list[bytes]]:
    """The raw ``task-sent`` events published while inside, as a list that fills in the background."""
    events: list[bytes] = []
    sub = r.pubsub()
    sub.psubscribe("*celeryev/task.sent")
    assert sub.get_message(timeout=5)["type"] == "psubscribe"
    done = threading.Event()

    def listen() -> None:
        while not done.is_set():
            m = sub.get_message(timeout=0.1)
            if m and m["type"] == "pmessage":
                events.append(m["data"])

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    try:
        yield events
    finally:
        done.set()
        listener.join(5)
        sub.close()


def _wait_for_count(items: list, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(items) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def _bodies(r: redis.Redis, queue: str) -> list[list]:
    """The positional args of each task message in ``queue`` (kombu's Redis list, base64 JSON body)."""
    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0] for raw in r.lrange(queue, 0, -1)]


def test_a_message_and_its_sent_event_take_one_round_trip_and_a_group_one_in_all(stack):
    r = redis.Redis.from_url(stack.url)
    with _task_sent_events(r) as events:
        run = subprocess.run(
            [sys.executable, "-c", COUNT], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.split("\n")[:2] == ["step 1", "group 1"], run.stdout  # Celery alone: 2 and 6
        assert sorted(map(tuple, _bodies(r, "turns"))) == [("rt-turn", 3), ("warm", 0)]
        assert sorted(map(tuple, _bodies(r, "tools"))) == [("rt-turn", 3, c) for c in ("c1", "c2", "c3")]
        _wait_for_count(events, 5)
    sent = [json.loads(base64.b64decode(json.loads(e)["body"])) for e in events]
    assert sorted(e["name"] for e in sent) == ["tasks.turns.tool_call"] * 3 + ["tasks.turns.turn_step"] * 2
    # The parallel calls are still one group to Flower: one group id, their indexes in order.
    headers = [json.loads(raw)["headers"] for raw in reversed(r.lrange("tools", 0, -1))]
    assert len({h["group"] for h in headers}) == 1 and headers[0]["group"]
    assert [h["group_index"] for h in headers] == [0, 1, 2]


RECORD = """
import json
from tasks.app import app
from tasks.dispatcher import CeleryDispatcher
from worker.turn.dispatch import Batch

with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
d = CeleryDispatcher()
group = Batch(mode="parallel", call_ids=["c1", "c2"])
chain = Batch(mode="sequential", call_ids=["c1", "c2", "c3"])
recorded = [
    d.step_message("cap-turn", 4, queue="turns", label="step 4"),
    d.batch_message("cap-turn", 4, group, queue="tools"),
    d.batch_message("cap-turn", 5, chain, queue="tools"),
]
from worker.redis_connection import redis_endpoint
control = CeleryDispatcher(broker=redis_endpoint())  # a control plane's: it publishes itself
print(json.dumps({
    "recorded": [[n, k, p.decode()] for commands in recorded for n, k, p in commands],
    "control": control.step_message("cap-turn", 4, queue="turns"),
}), flush=True)
# The same messages the long way, through Celery's and kombu's own publish.
d.enqueue_step("cap-turn", 4, queue="turns", label="step 4")
d.dispatch_batch("cap-turn", 4, 0, group, queue="tools")
d.dispatch_batch("cap-turn", 5, 0, chain, queue="tools")
"""

# What differs between two sends of the same message: ids, delivery tags, clocks and times.
_VOLATILE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMES = ("published_at", "timestamp", "clock", "traceparent")


def _normal(raw: str | bytes) -> dict:
    """A queue or event payload with its body decoded and what differs per send replaced."""
    message = json.loads(raw)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    for part in (message["headers"], message["body"] if isinstance(message["body"], dict) else {}):
        for name in _TIMES:
            if name in part:
                part[name] = "<t>"
    return json.loads(_VOLATILE.sub("<id>", json.dumps(message, sort_keys=True)))


def test_a_recorded_message_is_what_the_publish_sends_and_nothing_is_sent(stack):
    """``step_message``/``batch_message`` record the commands of the real publish (the queue's list
    and the ``task-sent`` event): the same envelope, headers, properties, body and event as Celery
    and kombu's own publish writes for the same step, group and chain (ids, tags and times aside);
    nothing is sent; a control plane's dispatcher records nothing."""
    r = redis.Redis.from_url(stack.url)
    with _task_sent_events(r) as events:
        run = subprocess.run(
            [sys.executable, "-c", RECORD], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
        )
        assert run.returncode == 0, run.stderr[-3000:]
        out = json.loads(run.stdout.strip().splitlines()[-1])
        assert out["control"] is None
        recorded = out["recorded"]
        assert [(n, k) for n, k, _ in recorded] == [("LPUSH", "turns"), ("PUBLISH", "/0.celeryev/task.sent")] + [
            ("LPUSH", "tools"),
            ("PUBLISH", "/0.celeryev/task.sent"),
        ] * 3
        _wait_for_count(events, 4)
    # Only the long way's four messages were sent: recording sent nothing.
    sent = [*reversed(r.lrange("turns", 0, -1)), *reversed(r.lrange("tools", 0, -1))]
    assert len(sent) == 4 and len(events) == 4
    assert [_normal(p) for n, _, p in recorded if n == "LPUSH"] == [_normal(raw) for raw in sent]
    assert [_normal(p) for n, _, p in recorded if n == "PUBLISH"] == [_normal(raw) for raw in events]
    # Applied as the script applies them, they are consumed like any message (one body checked).
    for name, target, payload in recorded[:2]:
        getattr(r, name.lower())(target, payload)
    assert _bodies(r, "turns")[0] == ["cap-turn", 4]


CHAIN = (
    COUNTING
    + """
d.dispatch_batch("ch-turn", 5, 0, Batch(mode="sequential", call_ids=["c1", "c2", "c3"]), queue="tools")
print("chain", len(sent), flush=True)
"""
)


def test_a_sequential_batch_is_one_chain_message_sent_in_one_round_trip(stack):
    """A sequential batch is Celery's chain: one message, for its first call, carrying the others
    (last first), which the worker sends one after another; sent with its event in one round trip
    like any other message (Celery's ``chain.run`` does not pass the batch's producer on)."""
    r = redis.Redis.from_url(stack.url)
    run = subprocess.run(
        [sys.executable, "-c", CHAIN], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[0] == "chain 1", run.stdout
    (raw,) = r.lrange("tools", 0, -1)
    message = json.loads(raw)
    args, _, embed = json.loads(base64.b64decode(message["body"]))
    assert args == ["ch-turn", 5, "c1"] and message["headers"]["argsrepr"] == "turn=ch-turn step=5 call=c1"
    rest = embed["chain"]
    assert [link["args"] for link in rest] == [["ch-turn", 5, "c3"], ["ch-turn", 5, "c2"]]
    assert all(link["immutable"] and link["options"]["queue"] == "tools" for link in rest)
    assert all(link["options"]["task_id"] for link in rest)


AWAY = """
from tasks.dispatcher import CeleryDispatcher
from worker.turn.dispatch import Batch

d = CeleryDispatcher()
print(d.step_message("away-turn", 2, queue="turns"), flush=True)
print(d.batch_message("away-turn", 2, Batch(mode="parallel", call_ids=["c1", "c2"]), queue="tools"), flush=True)
"""


def test_a_message_that_cannot_be_captured_while_the_broker_is_away_is_left_to_the_long_way():
    """A capture needs the producer's channel; with Redis away (a new producer connects first) it
    gives None, so the caller stores its state and sends the message itself, through ``publish``,
    which waits the outage out, instead of raising kombu's ``OperationalError``, which no outage
    wait catches (a tool call's result would be left unsaved, its turn to the watchdog)."""
    from devtools.ports import free_port

    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    run = subprocess.run([sys.executable, "-c", AWAY], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:2] == ["None", "None"], run.stdout
