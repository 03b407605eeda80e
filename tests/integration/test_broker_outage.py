"""Broker outages at the Celery edge: a publish that fails while Redis restarts is waited out
(``tasks.dispatcher``), and an ack that fails is retried once Redis is back (``tasks.broker.QoS``),
instead of crashing the step or leaving the message in ``unacked`` for the visibility timeout.

Each test runs the edge in a process of its own against a private Redis that it kills and restarts.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis

from tests.support.private_stack import ROOT, PrivateStack


@pytest.fixture
def stack():
    s = PrivateStack()
    yield s
    s.close()


def _start(stack, code: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, env=stack.env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


def _line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline().strip()
    assert line, proc.stderr.read()[-3000:]
    return line


PUBLISH = """
import sys
from tasks.dispatcher import CeleryDispatcher
from tasks.app import app
with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=3)
print("ready", flush=True)
sys.stdin.readline()  # Redis is down now
CeleryDispatcher().enqueue_step("outage-turn", 3, queue="turns")
print("published", flush=True)
"""


def test_a_publish_during_a_redis_restart_is_waited_out(stack):
    r = redis.Redis.from_url(stack.url)
    proc = _start(stack, PUBLISH)
    assert _line(proc) == "ready"
    stack.redis.halt(kill=True)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    time.sleep(3)  # past Celery's own publish retries (about 0.6 s)
    assert proc.poll() is None, proc.stderr.read()[-3000:]  # still waiting, not crashed
    stack.redis.restart()
    assert _line(proc) == "published"
    assert proc.wait(30) == 0
    assert r.llen("turns") == 1


ACK = """
import sys, time
from tasks.app import app
from tasks.broker import ACKS, LATE_ACKS
with app.connection_for_read() as conn:
    queue = conn.SimpleQueue("turns")
    message = queue.get(timeout=30)
    print("fetched", flush=True)
    sys.stdin.readline()  # Redis is down now
    message.ack()
    ACKS.flush()  # what the batch thread does within ACK_BATCH_DELAY
    print("acked", LATE_ACKS.pending(), flush=True)
    sys.stdin.readline()  # Redis is back
    deadline = time.monotonic() + 20
    while LATE_ACKS.pending() and time.monotonic() < deadline:
        time.sleep(0.2)
    print("pending", LATE_ACKS.pending(), flush=True)
    import os
    os._exit(0)  # no restore at shutdown: what is left in unacked stays there
"""


def test_an_ack_that_fails_during_a_redis_restart_is_retried(stack):
    r = redis.Redis.from_url(stack.url)
    stack.control.enqueue({"agent_id": "ack-a", "input": "hi", "model": "nobody"})
    proc = _start(stack, ACK)
    assert _line(proc) == "fetched"
    assert r.hlen("unacked") == 1
    stack.redis.halt(kill=True)
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert _line(proc) == "acked 1"  # deferred, not raised
    stack.redis.restart()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    assert _line(proc) == "pending 0"
    proc.wait(30)
    r = redis.Redis.from_url(stack.url)
    assert r.hlen("unacked") == 0 and r.zcard("unacked_index") == 0
