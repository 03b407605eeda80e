"""A real prefork worker (2 processes): a parallel group really runs concurrently, and a pool
child killed in the middle of a tool call is recovered.

With ``task_acks_late`` and ``task_reject_on_worker_lost`` the call's message comes back at
once; the claim's owner is a dead process on this host, so the call is not left waiting for
its lease: a read-only call runs again, a destructive one is reported as "outcome unknown"
(never run twice), and the turn completes without the watchdog.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import start_worker_process, stop_process
from tests.support.scripts import fc, msg
from worker.turn.request import TurnStatus

QUEUES = ("turns", "tools", "background", "workflow")


@pytest.fixture(scope="module")
def prefork_only(solo_worker):
    """Move every queue from the session's solo worker to a prefork worker for this module."""
    from tasks.app import app

    node = solo_worker.node_name
    for q in QUEUES:
        app.control.cancel_consumer(q, destination=[node], reply=True, timeout=5)
    proc = start_worker_process("--pool", "prefork", "-c", "2")
    yield proc
    stop_process(proc)
    for q in QUEUES:
        app.control.add_consumer(q, destination=[node], reply=True, timeout=5)


def test_parallel_group_runs_concurrently_and_the_barrier_holds(prefork_only, control, gateway, script_name):
    import orjson

    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc("read_thing", '{"label": "a", "ms": 400}'),
                    fc("read_thing", '{"label": "b", "ms": 400}'),
                    fc("write_thing", '{"label": "w"}'),
                ]
            },
            {"output": [msg("ok")]},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=60).status == TurnStatus.completed
    log = {e[4]: e for e in (orjson.loads(x) for x in control.redis.lrange(f"test:log:{turn_id}", 0, -1))}
    a, b, w = log["a"], log["b"], log["w"]
    assert a[2] < b[3] and b[2] < a[3], "the two reads of one group overlap in time"
    assert w[2] >= max(a[3], b[3]), "the sequential write starts after the group ended"


def test_killed_child_read_only_call_runs_again(prefork_only, control, gateway, script_name):
    gateway.add_script(
        script_name,
        [
            {"output": [{"type": "function_call", "name": "crash_read", "arguments": "{}"}]},
            {"output": [{"type": "message", "text": "ok"}]},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed
    outs = [i for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert outs[0]["output"] == "survived"
    call_id = outs[0]["call_id"]
    assert control.redis.get(f"test:crash-ran:{turn_id}:{call_id}") == b"1"


def test_killed_child_destructive_call_is_not_run_twice(prefork_only, control, gateway, script_name):
    gateway.add_script(
        script_name,
        [
            {"output": [{"type": "function_call", "name": "crash_write", "arguments": "{}"}]},
            {"output": [{"type": "message", "text": "ok"}]},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed
    outs = [i for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert "outcome of this crash_write call is unknown" in outs[0]["output"]
    call_id = outs[0]["call_id"]
    assert control.redis.get(f"test:crash-ran:{turn_id}:{call_id}") is None
