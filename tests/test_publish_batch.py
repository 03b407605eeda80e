"""A worker sends each message with its ``task-sent`` event in one Redis round trip, and a group's
messages all in one (``tasks.dispatcher.publish``, a kombu publish batch). Celery alone takes two
round trips per message. Run in a process of its own against a private Redis with no workers, so
the messages stay in their queues to be read back.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import redis

from tests.support.private_stack import ROOT, PrivateStack

COUNT = """
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
d.enqueue_step("rt-turn", 3, queue="turns")
print("step", len(sent), flush=True)
del sent[:]
d.dispatch_batch("rt-turn", 3, 0, Batch(mode="parallel", call_ids=["c1", "c2", "c3"]), queue="tools")
print("group", len(sent), flush=True)
"""


@pytest.fixture
def stack():
    s = PrivateStack()
    yield s
    s.close()


def _bodies(r: redis.Redis, queue: str) -> list[list]:
    """The positional args of each task message in ``queue`` (kombu's Redis list, base64 JSON body)."""
    import base64

    return [json.loads(base64.b64decode(json.loads(raw)["body"]))[0] for raw in r.lrange(queue, 0, -1)]


def test_a_message_and_its_sent_event_take_one_round_trip_and_a_group_one_in_all(stack):
    r = redis.Redis.from_url(stack.url)
    events: list[dict] = []
    sub = r.pubsub()
    sub.psubscribe("*celeryev/task.sent")
    assert sub.get_message(timeout=5)["type"] == "psubscribe"

    done = threading.Event()

    def listen() -> None:
        while not done.is_set():
            m = sub.get_message(timeout=0.1)
            if m and m["type"] == "pmessage":
                events.append(json.loads(m["data"]))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    run = subprocess.run(
        [sys.executable, "-c", COUNT], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split("\n")[:2] == ["step 1", "group 1"], run.stdout  # Celery alone: 2 and 6
    assert sorted(map(tuple, _bodies(r, "turns"))) == [("rt-turn", 3), ("warm", 0)]
    assert sorted(map(tuple, _bodies(r, "tools"))) == [("rt-turn", 3, c) for c in ("c1", "c2", "c3")]
    import base64
    import time

    deadline = time.monotonic() + 10
    while len(events) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    sent = [json.loads(base64.b64decode(e["body"])) for e in events]
    done.set()
    listener.join(5)
    sub.close()
    assert sorted(e["name"] for e in sent) == ["tasks.turns.tool_call"] * 3 + ["tasks.turns.turn_step"] * 2
    # The parallel calls are still one group to Flower: one group id, their indexes in order.
    headers = [json.loads(raw)["headers"] for raw in reversed(r.lrange("tools", 0, -1))]
    assert len({h["group"] for h in headers}) == 1 and headers[0]["group"]
    assert [h["group_index"] for h in headers] == [0, 1, 2]
