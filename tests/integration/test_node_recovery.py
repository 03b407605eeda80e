"""A dead node recovered by its supervisor, not by its heartbeat expiring, and messages that a
dying process had fetched given back at once (``devtools.node_recovery``, ``tasks.watchdog``).

Every stack here sets a liveness TTL of 30 s and a progress slack of 900 s: the heartbeat path
needs 60 s or more and the progress deadline 15 minutes, so a turn that recovers within the
asserted seconds was recovered by the paths under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import redis

from tasks.watchdog import RUN_SEEN_KEY, redis_run
from tests.support.private_stack import ROOT, PrivateStack
from tests.support.scripts import msg, wait_for

SLOW_LIVENESS = {"AGENT_PROGRESS_SLACK": "900", "AGENT_LIVENESS_TTL": "30"}


@pytest.fixture
def stack():
    s = PrivateStack(**SLOW_LIVENESS)
    yield s
    s.close()


def _redriven(control, turn_id: str) -> list[dict]:
    return [e for e in control.events(turn_id) if e.get("kind") == "turn_redriven"]


def _child_with(parent: int, needle: str) -> int | None:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == parent and needle in cmdline:
            return int(proc.name)
    return None


def test_supervisor_reports_a_killed_worker_and_its_turn_is_redriven_at_once(stack, gateway, script_name):
    first_call = threading.Event()

    def slow_first(body):
        if not first_call.is_set():
            first_call.set()
            time.sleep(20)  # the worker is killed meanwhile; this answer goes nowhere
        return {"output": [msg("recovered by the supervisor")]}

    gateway.add_script(script_name, [slow_first])
    env = {**stack.env, "AGENT_TOOLS_CONCURRENCY": "1", "PYTHONUNBUFFERED": "1"}
    log = Path(tempfile.gettempdir()) / f"node-recovery-{os.getpid()}.log"
    node = subprocess.Popen(
        [sys.executable, "-m", "devtools.workers"], cwd=ROOT, env=env, start_new_session=True,
        stdout=open(log, "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        io = wait_for(lambda: _child_with(node.pid, "io-"), timeout=60)
        from worker.turn.liveness import HOST

        wait_for(lambda: stack.control.redis.exists(f"agent:alive:{HOST}:{io}"), timeout=90)
        stack.start_beat()
        tid = stack.control.enqueue({"agent_id": "sup-a", "input": "hi", "model": script_name})
        assert first_call.wait(60)
        time.sleep(0.3)
        killed_at = time.time()
        os.kill(io, signal.SIGKILL)
        redriven = wait_for(lambda: _redriven(stack.control, tid), timeout=20)
        assert f"worker {HOST}:{io} stopped" in redriven[0]["reason"], redriven
        assert redriven[0]["at"] - killed_at < 3.0, (redriven[0]["at"] - killed_at, log.read_text()[-3000:])
        view = stack.control.wait(tid, timeout=90)
        assert view.final_output == "recovered by the supervisor", view
        assert not stack.control.redis.exists(f"agent:alive:{HOST}:{io}")
    finally:
        os.killpg(node.pid, signal.SIGTERM)
        try:
            node.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait()


THIEF = """
import os, sys
from tasks.app import app
with app.connection_for_read() as conn:
    queue = conn.SimpleQueue("turns")
    message = queue.get(timeout=30)
    print(message.headers["id"], flush=True)
    os._exit(0)  # dies holding the message: no ack, no restore at shutdown
"""

RESTORE = """
import time
from tasks.runtime import get_engine
from tasks.watchdog import restore_orphans
print(restore_orphans(get_engine(), before=time.time()), flush=True)
"""


def _python(stack, code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=stack.env, capture_output=True, text=True, timeout=90
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_a_message_fetched_by_a_process_that_died_is_given_back(stack, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("the lost step ran")]}])
    r = redis.Redis.from_url(stack.url)
    tid = stack.control.enqueue({"agent_id": "sup-b", "input": "hi", "model": script_name})
    task_id = _python(stack, THIEF)  # fetched, then the process died before running or holding it
    assert task_id and r.llen("turns") == 0 and r.hlen("unacked") == 1
    stack.start_worker()
    time.sleep(2)
    assert stack.control.status(tid).status.value == "queued"  # nobody will run it before the visibility timeout
    assert _python(stack, RESTORE) == "1"
    assert stack.control.wait(tid, timeout=60).final_output == "the lost step ran"
    assert not _redriven(stack.control, tid)  # given back, not re-driven
    # Held messages are not taken: a second pass finds nothing to give back.
    assert _python(stack, RESTORE) == "0"


def test_a_message_lost_with_a_redis_crash_is_found_missing_after_the_restart(stack, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("found again")]}])
    r = redis.Redis.from_url(stack.url)
    tid = stack.control.enqueue({"agent_id": "sup-c", "input": "hi", "model": script_name})
    assert r.lpop("turns")  # popped by a consumer whose next command found Redis gone
    stack.redis.halt(kill=True)
    stack.redis.restart()
    stack.start_worker()
    stack.start_beat()
    view = stack.control.wait(tid, timeout=60)
    assert view.final_output == "found again", view
    reasons = [e["reason"] for e in _redriven(stack.control, tid)]
    assert reasons == ["no message after a Redis restart or failover"], reasons


RECONCILE = """
import json
from tasks.runtime import get_engine
from tasks.watchdog import reconcile_after_restart
print(json.dumps(reconcile_after_restart(get_engine())), flush=True)
"""


def test_a_dead_nodes_held_turn_is_left_to_the_dead_node_path_by_the_reconciliation(stack, gateway, script_name):
    """The reconciliation after a Redis restart re-drives a turn no message names and no node holds.
    A node whose heartbeat is gone but which the watchdog has not recovered yet (its grace) still
    holds its turns: the dead-node path re-drives them, with its own reason. Judged unnamed, such a
    turn was re-driven by the reconciliation first, and again by the dead-node path (seen when a
    sweep's first reconciliation fell in that window)."""
    from worker.turn.liveness import NODES_KEY, held_key

    gateway.add_script(script_name, [{"output": [msg("once")]}])
    r = redis.Redis.from_url(stack.url)
    tid = stack.control.enqueue({"agent_id": "sup-d", "input": "hi", "model": script_name})
    assert r.lpop("turns")  # fetched by the node below, which then died
    r.sadd(NODES_KEY, "gone-node:1")  # known, its heartbeat key gone (never written)
    r.hset(held_key("gone-node:1"), "task-of-gone", tid)
    wait_for(lambda: r.info("server")["uptime_in_seconds"] >= 4, timeout=10, poll=0.2)
    r.set(RUN_SEEN_KEY.format(redis_run(r)[0]), 0)  # the watchdog saw this Redis run long ago
    assert _python(stack, RECONCILE) == "{}"
    assert not _redriven(stack.control, tid)
    # Once the dead-node path has taken the node's turns, a turn nobody names is the
    # reconciliation's again (a later Redis run).
    r.delete(held_key("gone-node:1"))
    r.srem(NODES_KEY, "gone-node:1")
    r.delete(*r.scan_iter(match="agent:reconciled:*"))
    assert tid in _python(stack, RECONCILE)
