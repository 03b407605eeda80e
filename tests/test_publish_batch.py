"""A worker sends each message with its ``task-sent`` event in one Redis round trip, and a group's
messages all in one (``tasks.dispatcher.publish``, a kombu publish batch). Celery alone takes two
round trips per message. Run in a process of its own against a private Redis with no workers, so
the messages stay in their queues to be read back.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading

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


def _bodies(r: redis.Redis, queue: str) -> list[list]:
    """The positional args of each task message in ``queue`` (kombu's Redis list, base64 JSON body)."""
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


CAPTURE = """
import json
import os
from tasks.app import app
from tasks.dispatcher import CeleryDispatcher
from worker.turn.dispatch import Batch

with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
d = CeleryDispatcher()
step = d.step_message("cap-turn", 4, queue="turns", label="step 4")
batch = d.batch_message("cap-turn", 4, Batch(mode="parallel", call_ids=["c1", "c2"]), queue="tools")
control = CeleryDispatcher(broker_url=app.conf.broker_url)  # a control plane's: it publishes itself
print(json.dumps({
    "step": [[n, k, p.decode()] for n, k, p in step],
    "batch": [[n, k, p.decode()] for n, k, p in batch],
    "control": control.step_message("cap-turn", 4, queue="turns"),
}), flush=True)
"""


def test_a_captured_message_is_what_the_publish_would_send_and_nothing_is_sent(stack):
    """``step_message``/``batch_message`` give the commands of the real publish (the queue's list
    and its ``task-sent`` event), send nothing, and a control plane's dispatcher gives none."""
    r = redis.Redis.from_url(stack.url)
    run = subprocess.run(
        [sys.executable, "-c", CAPTURE], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert r.llen("turns") == 0 and r.llen("tools") == 0  # nothing was sent
    assert out["control"] is None
    assert [(n, k) for n, k, _ in out["step"]] == [("LPUSH", "turns"), ("PUBLISH", "/0.celeryev/task.sent")]
    assert [n for n, _, _ in out["batch"]] == ["LPUSH", "PUBLISH", "LPUSH", "PUBLISH"]
    # Applied as the script applies them, they are a real Celery message and its event.
    for name, target, payload in out["step"] + out["batch"]:
        getattr(r, name.lower())(target, payload)
    assert _bodies(r, "turns") == [["cap-turn", 4]]
    assert sorted(map(tuple, _bodies(r, "tools"))) == [("cap-turn", 4, "c1"), ("cap-turn", 4, "c2")]
    message = json.loads(r.lindex("turns", 0))
    assert message["headers"]["task"] == "tasks.turns.turn_step" and message["headers"]["argsrepr"] == "step 4"
    event = json.loads(base64.b64decode(json.loads(out["step"][1][2])["body"]))
    assert event["type"] == "task-sent" and event["uuid"] == message["headers"]["id"]


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
