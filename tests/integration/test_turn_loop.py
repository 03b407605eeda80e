"""The turn loop through a real Celery worker and a real Redis."""

from __future__ import annotations

import orjson
import pytest

from tests.conftest import session_api_style
from tests.support.scripts import fc, msg
from worker.turn.request import TurnStatus


@pytest.fixture
def control(styled_control):
    """The end-to-end tests here run in both wire styles (``styled_control``, tests/conftest.py)."""
    return styled_control


def run(control, gateway, script_name, steps, *, toolset="testing", timeout=60, **extra):
    gateway.add_script(script_name, steps)
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": toolset, **extra})
    view = control.wait(turn_id, timeout=timeout)
    return turn_id, view


def outputs(control, turn_id):
    return [i for i in control.items(turn_id) if i["type"] == "function_call_output"]


def calls(control, turn_id):
    return [i for i in control.items(turn_id) if i["type"] == "function_call"]


def log_entries(control, turn_id):
    return [orjson.loads(x) for x in control.redis.lrange(f"test:log:{turn_id}", 0, -1)]


def test_multi_step_turn_runs_on_one_solo_worker(control, gateway, script_name):
    """--pool solo -c 1 serving every queue finishes a multi-step turn: nothing waits on another task."""
    steps = [
        {"output": [fc("read_thing", '{"label": "a", "ms": 30}'), fc("read_thing", '{"label": "b", "ms": 5}')]},
        {"output": [fc("write_thing", '{"label": "w"}')]},
        {"output": [fc("read_thing", '{"label": "c"}')]},
        {"output": [msg("all done")]},
    ]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    assert view.final_output == "all done"
    assert view.model_calls == 4
    outs = outputs(control, turn_id)
    assert [orjson.loads(o["output"])["label"] for o in outs] == ["a", "b", "w", "c"]
    # every function_call has exactly one output
    assert sorted(c["call_id"] for c in calls(control, turn_id)) == sorted(o["call_id"] for o in outs)


def test_outputs_keep_emitted_order_and_sequential_call_is_a_barrier(control, gateway, script_name):
    steps = [
        {
            "output": [
                fc("read_thing", '{"label": "slow", "ms": 120}'),
                fc("read_thing", '{"label": "fast", "ms": 1}'),
                fc("write_thing", '{"label": "barrier", "ms": 1}'),
                fc("read_thing", '{"label": "after", "ms": 1}'),
            ]
        },
        {"output": [msg("ok")]},
    ]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    outs = [orjson.loads(o["output"])["label"] for o in outputs(control, turn_id)]
    assert outs == ["slow", "fast", "barrier", "after"]
    log = {e[4]: e for e in log_entries(control, turn_id)}
    # the write starts after both earlier reads ended; the later read starts after the write ended
    assert log["barrier"][2] >= max(log["slow"][3], log["fast"][3])
    assert log["after"][2] >= log["barrier"][3]
    events = control.events(turn_id)
    planned = [e for e in events if e["kind"] == "call_planned"]
    assert [e["mode"] for e in planned] == ["parallel", "parallel", "sequential", "parallel"]
    assert [e["batch"] for e in planned] == [0, 0, 1, 2]


def test_tool_exception_becomes_error_output_and_turn_goes_on(control, gateway, script_name):
    steps = [{"output": [fc("boom", "{}"), fc("read_thing", '{"label": "x"}')]}, {"output": [msg("recovered")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    outs = outputs(control, turn_id)
    assert "boom failed" in outs[0]["output"] and "disk on fire" in outs[0]["output"]
    assert orjson.loads(outs[1]["output"])["label"] == "x"


def test_unknown_tool_output_names_available_tools(control, gateway, script_name):
    steps = [{"output": [fc("multi_tool_use.parallel", '{"tool_uses": []}')]}, {"output": [msg("fine")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    out = outputs(control, turn_id)[0]["output"]
    assert "unknown tool 'multi_tool_use.parallel'" in out
    for name in ("read_thing", "write_thing", "boom", "finish"):
        assert name in out


def test_terminate_flag_ends_turn_without_another_model_call(control, gateway, script_name):
    steps = [
        {"output": [fc("finish", '{"reason": "done"}'), fc("read_thing", '{"label": "later"}')]},
        {"output": [msg("must never be requested")]},
    ]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.terminated
    assert view.model_calls == 1
    assert sum(1 for r in gateway.requests if r["model"] == script_name) == 1
    outs = outputs(control, turn_id)
    assert outs[0]["output"] == "finished: done"
    assert outs[1]["output"].startswith("Interrupted")  # still answered: history stays valid


def test_max_model_calls_stops_a_runaway_turn(control, gateway, script_name):
    steps = [{"output": [fc("read_thing", '{"label": "again"}')]}] * 10
    turn_id, view = run(control, gateway, script_name, steps, max_model_calls=3)
    assert view.status == TurnStatus.max_model_calls
    assert view.model_calls == 3
    assert "max_model_calls=3" in view.error


def test_invalid_arguments_are_fed_back_then_budget_ends_turn(control, gateway, script_name):
    bad = fc("read_thing", '{"label": 5, "ms": -1}')
    steps = [{"output": [bad]}, {"output": [bad]}, {"output": [bad]}, {"output": [msg("never")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    out = outputs(control, turn_id)[0]["output"]
    assert "label" in out and "ms" in out and "corrected call" in out
    assert view.status == TurnStatus.invalid_arguments
    assert "read_thing" in view.error
    assert len(outputs(control, turn_id)) == 3


def test_repaired_arguments_run_and_are_marked(control, gateway, script_name):
    steps = [{"output": [fc("read_thing", '```json\n{"label": "fenced"}\n```')]}, {"output": [msg("ok")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    assert orjson.loads(outputs(control, turn_id)[0]["output"])["label"] == "fenced"
    planned = [e for e in control.events(turn_id) if e["kind"] == "call_planned"]
    assert planned[0]["repairs"]


def test_oversized_output_is_capped_with_marker(control, gateway, script_name):
    steps = [{"output": [fc("big_output", "{}")]}, {"output": [msg("ok")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    out = outputs(control, turn_id)[0]["output"]
    assert len(out) <= 32_000
    assert "output truncated" in out and "of 100000 characters cut" in out


@pytest.mark.parametrize("api_style", [session_api_style()])  # sends to the session's broker and worker
def test_stale_step_message_is_dropped(control, gateway, script_name):
    from tasks.turns import turn_step

    steps = [{"output": [fc("read_thing", '{"label": "x"}')]}, {"output": [msg("ok")]}]
    turn_id, view = run(control, gateway, script_name, steps)
    before = control.items(turn_id)
    n_requests = len(gateway.requests)
    turn_step.apply_async((turn_id, 0), queue="turns")
    turn_step.apply_async((turn_id, 1), queue="turns")
    # a fresh turn acts as a sentinel: once it finishes, the stale messages were consumed
    _, sentinel = run(control, gateway, script_name + "-s", [{"output": [msg("s")]}])
    assert sentinel.status == TurnStatus.completed
    assert control.items(turn_id) == before
    assert len(gateway.requests) == n_requests + 1


def test_cancel_interrupts_a_running_tool(control, gateway, script_name):
    gateway.add_script(
        script_name, [{"output": [fc("read_thing", '{"label": "long", "ms": 5000}')]}, {"output": [msg("never")]}]
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    import time

    deadline = time.time() + 20
    while time.time() < deadline and not any(e["kind"] == "call_started" for e in control.events(turn_id)):
        time.sleep(0.05)
    assert control.cancel(turn_id) is True
    view = control.wait(turn_id, timeout=20)
    assert view.status == TurnStatus.cancelled
    outs = outputs(control, turn_id)
    assert len(outs) == 1  # the history stays valid for a later turn


def test_idempotency_key_returns_same_turn(control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("once")]}])
    req = {"input": "go", "model": script_name, "toolset": "testing", "idempotency_key": script_name}
    a = control.enqueue(req)
    b = control.enqueue(req)
    assert a == b
    assert control.wait(a).status == TurnStatus.completed


def test_bad_request_is_refused_before_anything_is_stored(control):
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        control.enqueue({"input": "x", "agent_id": "../etc"})


def test_unreachable_redis_gives_clear_error():
    from control.client import ControlPlane, ControlPlaneError
    from devtools.ports import free_port

    with pytest.raises(ControlPlaneError, match="cannot reach Redis"):
        ControlPlane(f"redis://127.0.0.1:{free_port()}/0")


def test_deferred_tool_is_loaded_by_tool_search_for_the_rest_of_the_turn(control, gateway, script_name):
    steps = [
        {"output": [fc("tool_search", '{"query": "archived record"}')]},
        {"output": [fc("archive_lookup", '{"key": "k1"}')]},
        {"output": [msg("found it")]},
    ]
    turn_id, view = run(control, gateway, script_name, steps)
    assert view.status == TurnStatus.completed
    bodies = [b for b in gateway.requests if b["model"] == script_name]

    def names(body):
        out = []
        for t in body["tools"]:
            out += [f"{t['name']}.{c['name']}" for c in t["tools"]] if t["type"] == "namespace" else [t["name"]]
        return out

    # Chat Completions has no namespaces: the chat client sends the namespace's tools flat.
    loaded = "archive_lookup" if bodies[0].get("wire") == "chat" else "archive.archive_lookup"
    assert loaded not in names(bodies[0]) and "tool_search" in names(bodies[0])
    assert loaded in names(bodies[1]) and loaded in names(bodies[2])
    outs = outputs(control, turn_id)
    assert "archive_lookup" in outs[0]["output"]
    assert orjson.loads(outs[1]["output"])["record"] == "archived record k1"
