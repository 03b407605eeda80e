"""Recovery through real workers on a private stack (tests/support/private_stack.py): a killed
worker's turns re-driven in seconds by its expired heartbeat, a long model call left alone
while its owner lives, a paid-for model reply and a destructive call's result kept across a
Redis outage, workers and beat surviving Redis restarts, and ``call_completed`` on every ending.

Each stack sets ``AGENT_PROGRESS_SLACK`` high, so the progress-deadline path cannot be what
recovers a turn here: only liveness can.
"""

from __future__ import annotations

import threading
import time
import uuid

from tests.support.scripts import fc, msg, output_texts, wait_for


def _model_requests(gateway, model: str) -> list[dict]:
    return [r for r in gateway.requests if r.get("model") == model]


def _step_of(body: dict) -> int:
    # The scripted gateway numbers steps by the model items already in the input.
    return sum(1 for i in body.get("input", []) if isinstance(i, dict) and i.get("type") == "function_call")


def _events(control, turn_id: str, kind: str) -> list[dict]:
    return [e for e in control.events(turn_id) if e.get("kind") == kind]


def test_killed_worker_turn_redriven_by_expired_heartbeat(stack, gateway, script_name, homes_root):
    first_call = threading.Event()

    def slow_first(body):
        if not first_call.is_set():
            first_call.set()
            time.sleep(8)  # the worker is killed meanwhile; this answer goes nowhere
        return {"output": [msg("recovered")]}

    gateway.add_script(script_name, [slow_first])
    worker = stack.start_worker()
    stack.start_beat()
    tid = stack.control.enqueue({"agent_id": "rec-a", "input": "hi", "model": script_name})
    assert first_call.wait(30)
    killed_at = time.monotonic()
    stack.kill(worker)
    stack.start_worker()
    view = stack.control.wait(tid, timeout=60)
    recovered_in = time.monotonic() - killed_at
    assert view.status.value == "completed", view
    assert view.final_output == "recovered"
    redriven = _events(stack.control, tid, "turn_redriven")
    assert redriven and "stopped" in redriven[0]["reason"], redriven
    print(f"recovered {recovered_in:.1f}s after SIGKILL of the worker")


def test_long_model_call_not_redriven_while_its_owner_lives(stack, gateway, script_name):
    def slow(body):
        time.sleep(5)  # 2.5x the liveness TTL: the heartbeat, not the deadline, vouches for the owner
        return {"output": [msg("slow but fine")]}

    gateway.add_script(script_name, [slow])
    stack.start_worker()
    stack.start_beat()
    tid = stack.control.enqueue({"agent_id": "rec-b", "input": "hi", "model": script_name})
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed"
    assert not _events(stack.control, tid, "turn_redriven")
    assert len(_model_requests(gateway, script_name)) == 1


def test_model_reply_kept_across_redis_outage_is_not_paid_twice(stack, gateway, script_name):
    answering = threading.Event()

    def answer_while_redis_is_down(body):
        answering.set()
        time.sleep(2)  # Redis is killed meanwhile: the reply arrives with nowhere to be saved
        return {"output": [msg("paid once")]}

    gateway.add_script(script_name, [answer_while_redis_is_down])
    worker = stack.start_worker()
    beat = stack.start_beat()
    tid = stack.control.enqueue({"agent_id": "rec-c", "input": "hi", "model": script_name})
    assert answering.wait(30)
    stack.redis.halt(kill=True)
    time.sleep(5)
    stack.redis.restart()
    view = wait_for(lambda: (v := stack.control.status(tid)).done and v, timeout=90)
    assert view.status.value == "completed" and view.final_output == "paid once"
    assert len(_model_requests(gateway, script_name)) == 1  # the model was paid once
    assert worker.poll() is None and beat.poll() is None  # both rode out the restart


def test_destructive_call_result_kept_across_redis_outage(stack, gateway, script_name, homes_root):
    agent = f"rec-d-{uuid.uuid4().hex[:4]}"
    gateway.add_script(
        script_name, [{"output": [fc("append_marker", {"label": "once", "ms": 2500})]}, {"output": [msg("done")]}]
    )
    stack.start_worker()
    tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"})
    wait_for(lambda: _events(stack.control, tid, "call_started"), timeout=30)
    stack.redis.halt(kill=True)  # the tool is running; its result will find Redis down
    time.sleep(5)
    stack.redis.restart()
    view = wait_for(lambda: (v := stack.control.status(tid)).done and v, timeout=90)
    assert view.status.value == "completed"
    assert output_texts(stack.control, tid) == ["appended once"]  # the real result, not "outcome unknown"
    assert (homes_root / agent / "markers.txt").read_text() == "once\n"  # ran exactly once
    completed = _events(stack.control, tid, "call_completed")
    assert len(completed) == 1 and not completed[0]["is_error"]


def test_workers_and_beat_survive_redis_restarts(stack, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("after the restarts")]}])
    worker = stack.start_worker()
    tools = stack.start_worker(pool="prefork", concurrency=2, queues="tools")
    beat = stack.start_beat()
    for _ in range(3):
        stack.redis.halt(kill=True)
        time.sleep(2)
        stack.redis.restart()
        time.sleep(2)
    assert worker.poll() is None, worker.log.read_text()[-2000:]
    assert tools.poll() is None, tools.log.read_text()[-2000:]
    assert beat.poll() is None, beat.log.read_text()[-2000:]
    tid = stack.control.enqueue({"agent_id": "rec-e", "input": "hi", "model": script_name})
    assert stack.control.wait(tid, timeout=60).final_output == "after the restarts"


def test_threads_pool_runs_hundreds_of_model_calls_at_once(stack, gateway, script_name):
    """300 turns against a model that answers in 1 s, on one threads worker: all finish, and the
    model sees far more calls at once than a prefork node has processes."""
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}

    def one_second(body):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        try:
            time.sleep(1.0)
        finally:
            with lock:
                state["now"] -= 1
        if _step_of(body) == 0:
            return {"output": [fc("read_thing", {"label": "x"})]}
        return {"output": [msg("ok")]}

    gateway.add_script(script_name, [one_second, one_second])
    stack.start_worker(concurrency=400)
    ids = [
        stack.control.enqueue({"agent_id": f"many-{i}", "input": "go", "model": script_name, "toolset": "testing"})
        for i in range(300)
    ]
    for tid in ids:
        assert stack.control.wait(tid, timeout=180).status.value == "completed"
    # A prefork node runs one model call per process (8 in compose); CPU on a shared 2-core
    # machine bounds how fast hundreds of steps start, so this asserts the order of magnitude;
    # bench/concurrency.py measures the peak at 1,000 turns.
    assert state["peak"] >= 64, state


def test_every_call_ends_with_call_completed(stack, gateway, script_name):
    """A cancelled turn's calls (interrupted) still end with ``call_completed``."""
    gateway.add_script(
        script_name,
        [
            {"output": [fc("write_thing", {"label": "a", "ms": 3000}), fc("write_thing", {"label": "b", "ms": 0})]},
            {"output": [msg("never")]},
        ],
    )
    stack.start_worker()
    tid = stack.control.enqueue({"agent_id": "rec-f", "input": "go", "model": script_name, "toolset": "testing"})
    wait_for(lambda: _events(stack.control, tid, "call_started"), timeout=30)
    stack.control.cancel(tid)
    stack.control.wait(tid, timeout=60)
    started = {e["call_id"] for e in _events(stack.control, tid, "call_started")}
    completed = {e["call_id"] for e in _events(stack.control, tid, "call_completed")}
    assert started and started <= completed, (started, completed)


def test_persistent_redis_keeps_transactions_across_a_crash():
    """Every turn transition is a MULTI/EXEC: a restart must replay them (Redis 7.0 drops them
    when the ``default`` user is off, which the ACL file therefore avoids)."""
    import redis

    from devtools.embedded_redis import EmbeddedRedis

    srv = EmbeddedRedis(persist=True)
    try:
        srv.start()
        client = redis.Redis.from_url(srv.control_url)
        client.set("plain", "1")
        with client.pipeline() as pipe:
            pipe.set("in-multi", "2")
            pipe.hset("hash", "k", "v")
            pipe.execute()
        srv.halt(kill=True)
        srv.restart()
        client = redis.Redis.from_url(srv.control_url)
        assert (client.get("plain"), client.get("in-multi"), client.hget("hash", "k")) == (b"1", b"2", b"v")
    finally:
        srv.stop()
