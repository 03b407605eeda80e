"""A pool child killed in the middle of a tool call (real prefork worker, real Redis).

With ``task_acks_late`` and ``task_reject_on_worker_lost`` the call's message comes back at
once; the claim's owner is a dead process on this host, so the call is not left waiting for
its lease: a read-only call runs again, a destructive one is reported as "outcome unknown"
(never run twice), and the turn completes without the watchdog.
"""

from __future__ import annotations

import pytest

from tests.conftest import _stop, start_worker_process
from worker.turn import TurnStatus

QUEUES = ("turns", "tools", "background", "workflow")


@pytest.fixture(scope="module")
def prefork_only(solo_worker):
    """Move every queue from the session's solo worker to a prefork worker for this module."""
    from tasks.app import app

    node = solo_worker.node_name
    for q in QUEUES:
        app.control.cancel_consumer(q, destination=[node], reply=True, timeout=5)
    proc = start_worker_process("--pool", "prefork", "-c", "1")
    yield proc
    _stop(proc)
    for q in QUEUES:
        app.control.add_consumer(q, destination=[node], reply=True, timeout=5)


def test_killed_child_read_only_call_runs_again(prefork_only, control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [{"type": "function_call", "name": "crash_read", "arguments": "{}"}]},
                                     {"output": [{"type": "message", "text": "ok"}]}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed
    outs = [i for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert outs[0]["output"] == "survived"
    call_id = outs[0]["call_id"]
    assert control.store.r.get(f"test:crash-ran:{turn_id}:{call_id}") == b"1"


def test_killed_child_destructive_call_is_not_run_twice(prefork_only, control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [{"type": "function_call", "name": "crash_write", "arguments": "{}"}]},
                                     {"output": [{"type": "message", "text": "ok"}]}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed
    outs = [i for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert "outcome of this crash_write call is unknown" in outs[0]["output"]
    call_id = outs[0]["call_id"]
    assert control.store.r.get(f"test:crash-ran:{turn_id}:{call_id}") is None
