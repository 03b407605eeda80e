"""Model calls off the worker's threads (``worker.turn.async_calls``), through real workers on a
private stack: calls in flight far beyond the pool's threads, the inline mode for contrast, a
duplicate delivery that lands on the thread that started the call, and a warm shutdown that
hands its calls in flight to another node.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from tests.support.scripts import fc, msg, wait_for


class Concurrency:
    """A gateway script step that answers after ``seconds`` and counts the calls in flight."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now = 0
        self.peak = 0
        self.calls = 0

    def __call__(self, body: dict) -> dict:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.seconds)
        finally:
            with self.lock:
                self.now -= 1
        first = not any(isinstance(i, dict) and i.get("type") == "function_call" for i in body.get("input", []))
        if first:
            return {"output": [fc("read_thing", {"label": "x"})]}
        return {"output": [msg("ok")]}


def _run_turns(stack, script_name: str, n: int, prefix: str) -> None:
    ids = [
        stack.control.enqueue({"agent_id": f"{prefix}-{i}", "input": "go", "model": script_name, "toolset": "testing"})
        for i in range(n)
    ]
    for tid in ids:
        assert stack.control.wait(tid, timeout=120).status.value == "completed"


def test_model_calls_hold_no_worker_thread(stack, gateway, script_name):
    """60 turns on a threads pool of 2: the model sees dozens of calls at once (an inline call
    holds a thread, so it would see at most 2)."""
    step = Concurrency(1.0)
    gateway.add_script(script_name, [step, step])
    stack.start_worker(concurrency=2)
    _run_turns(stack, script_name, 60, "async")
    assert step.calls == 120
    assert step.peak >= 30, step.peak


def test_inline_model_calls_hold_a_thread_each(stack, gateway, script_name):
    """``AGENT_MODEL_CALLS=inline``: a call holds its worker thread, so a pool of 2 makes at most
    2 calls at once (the contrast that makes the test above mean something)."""
    step = Concurrency(0.3)
    gateway.add_script(script_name, [step, step])
    stack.start_worker(concurrency=2, env={"AGENT_MODEL_CALLS": "inline"})
    _run_turns(stack, script_name, 6, "inline")
    assert step.calls == 12
    assert step.peak <= 2, step.peak


def test_duplicate_delivery_during_a_call_does_not_pay_twice(stack, gateway, script_name):
    """A second delivery of a step whose call is in flight runs on the very thread that started
    the call (one solo worker): it must see the call as someone else's and drop, not call again."""
    started = threading.Event()

    def slow(body: dict) -> dict:
        started.set()
        time.sleep(3)
        return {"output": [msg("once")]}

    gateway.add_script(script_name, [slow])
    stack.start_worker(pool="solo", concurrency=1)
    tid = stack.control.enqueue({"agent_id": "dup-a", "input": "go", "model": script_name})
    assert started.wait(30)
    stack.control._engine.dispatcher.enqueue_step(tid, 0, queue="turns")  # the duplicate
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "once"
    assert len([r for r in gateway.requests if r.get("model") == script_name]) == 1
    replies = [e for e in stack.control.events(tid) if e.get("kind") == "model_reply"]
    assert len(replies) == 1, replies


def test_warm_shutdown_hands_calls_in_flight_to_another_node(stack, gateway, script_name):
    """SIGTERM during a long call: the worker waits ``AGENT_MODEL_DRAIN_TIMEOUT``, frees the step
    and publishes it again, and exits; another worker makes the call and finishes the turn."""
    first = threading.Event()

    def slow_first(body: dict) -> dict:
        if not first.is_set():
            first.set()
            time.sleep(20)  # this answer reaches nobody: its worker has shut down
            return {"output": [msg("too late")]}
        return {"output": [msg("from the second node")]}

    gateway.add_script(script_name, [slow_first])
    worker = stack.start_worker(env={"AGENT_MODEL_DRAIN_TIMEOUT": "0.5"})
    tid = stack.control.enqueue({"agent_id": "drain-a", "input": "go", "model": script_name})
    assert first.wait(30)
    os.killpg(worker.pid, signal.SIGTERM)
    worker.wait(15)  # raises if the shutdown waited for the call
    stack.start_worker()
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "from the second node"
    replies = [e for e in stack.control.events(tid) if e.get("kind") == "model_reply"]
    assert len(replies) == 1, replies


def test_a_turn_stays_one_trace_when_its_calls_are_asynchronous(stack, gateway, script_name, tmp_path):
    """The reply is handled on a finisher thread, after the step's task ended: its ``model_reply``
    span hangs off the task's span, carries the plan's events, and the tool calls it sends are in
    the turn's trace under it (they were lost from the trace when the finisher had no context)."""
    import json

    from worker.turn.telemetry import parse_traceparent

    spans_file = tmp_path / "spans.jsonl"
    gateway.add_script(
        script_name,
        [{"output": [fc("read_thing", {"label": "a"}), fc("read_thing", {"label": "b"})]}, {"output": [msg("done")]}],
    )
    stack.start_worker(env={"AGENT_OTEL_FILE": str(spans_file), "OTEL_BSP_SCHEDULE_DELAY": "100"})
    tid = stack.control.enqueue({"agent_id": "tracer", "input": "go", "model": script_name, "toolset": "testing"})
    assert stack.control.wait(tid, timeout=60).status.value == "completed"
    root_ctx = parse_traceparent(stack.control.store.load(tid).traceparent)
    trace_id, root_id = f"0x{root_ctx.trace_id:032x}", f"0x{root_ctx.span_id:016x}"

    def whole():
        if not spans_file.exists():
            return None
        spans = [json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()]
        mine = [s for s in spans if s["context"]["trace_id"] == trace_id]
        names = [s["name"] for s in mine]
        return mine if names.count("tool_call") == 2 and "invoke_agent tracer" in names else None

    spans = wait_for(whole, timeout=30)
    by_id = {s["context"]["span_id"]: s for s in spans}
    for s in spans:  # every span hangs off the turn's root
        node = s
        while node["parent_id"] is not None:
            assert node["parent_id"] in by_id, f"{s['name']} has a parent outside the trace"
            node = by_id[node["parent_id"]]
        assert node["context"]["span_id"] == root_id
    (step0,) = [s for s in spans if s["name"] == "turn_step" and s["attributes"]["agent.turn.step"] == 0]
    replies = [s for s in spans if s["name"] == "model_reply" and s["parent_id"] == step0["context"]["span_id"]]
    assert len(replies) == 1
    planned = [e for e in replies[0]["events"] if e["name"] == "agent.call_planned"]
    assert len(planned) == 2
    calls = [s for s in spans if s["name"] == "tool_call"]
    assert all(c["parent_id"] == replies[0]["context"]["span_id"] for c in calls)
    chats = [s for s in spans if s["name"] == f"chat {script_name}"]
    assert len(chats) == 2 and step0["context"]["span_id"] in {c["parent_id"] for c in chats}


def test_a_waiting_call_holds_no_tools_and_a_handled_call_leaves_nothing_behind(stack, gateway, script_name):
    """While the model answers, the step holds none of the turn's tools: they were built for the
    request and let go, and the reply's handling builds them again to plan its call (the turn
    completes). Once a call is handled, nothing of it stays in a reference cycle: the worker's
    cyclic collector is off and every tool set it built is freed (``tests.support.toolkits``)."""
    asked = [threading.Event(), threading.Event()]
    answer = [threading.Event(), threading.Event()]

    def held_until_answered(n: int, reply: dict):
        def respond(body: dict) -> dict:
            asked[n].set()
            assert answer[n].wait(60)
            return reply

        return respond

    gateway.add_script(
        script_name,
        [
            held_until_answered(0, {"output": [fc("read_thing", {"label": "x"})]}),
            held_until_answered(1, {"output": [msg("done")]}),
        ],
    )
    warm = f"{script_name}-warm-up"
    gateway.add_script(warm, [{"output": [fc("read_thing", {"label": "x"})]}, {"output": [msg("warm")]}])
    stack.start_worker(env={"AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolkits:counted_testing_tools"})
    # A first turn loads the Redis scripts: a process's first script call fails with NOSCRIPT once,
    # and that exception's traceback, a cycle, holds the frames above it (their step included).
    turn = {"agent_id": "lean", "input": "go", "model": warm, "toolset": "testing"}
    assert stack.control.wait(stack.control.enqueue(turn), timeout=60).status.value == "completed"
    tid = stack.control.enqueue({**turn, "model": script_name})
    redis = stack.client()

    def counts() -> dict[str, int]:
        return {k.decode(): int(v) for k, v in redis.hgetall(f"test:toolkits:{tid}").items()}

    def all_freed(least: int):
        return lambda: (c := counts()).get("built", 0) >= least and c.get("freed") == c["built"]

    try:
        assert asked[0].wait(30)
        wait_for(all_freed(1), timeout=10)  # the first call waits, holding no tools
        answer[0].set()
        assert asked[1].wait(30)
        # Built again to plan the reply's call, then for the tool call and the second request;
        # the first call, handled, holds none of them (its cycle would keep them for good).
        wait_for(all_freed(3), timeout=10)
    finally:
        answer[0].set()
        answer[1].set()
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "done"
    wait_for(all_freed(3), timeout=10)
    # Step 0's request, its reply's plan, the tool call, step 1's request: the final answer,
    # with no call in its text, builds none.
    assert counts() == {"built": 4, "freed": 4}
