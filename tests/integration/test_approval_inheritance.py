"""Attack tests: a turn that a turn starts (a background job, a schedule's turn, a workflow task)
never gets a weaker approval policy, nor a wider network, than its parent (issue 19, item 3).

Through a real worker and a real Redis; the suite's workers run with ``AGENT_APPROVAL_MODE=off``,
so a child that fell back to the worker's setting would write without anyone approving.
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.scripts import fc, msg, wait_for
from tests.support.scripts import output_texts as outputs
from worker.records.jobs import job_id_for
from worker.records.schedules import ScheduleStore, schedule_id_for
from worker.turn.request import TurnStatus

PARENT_POLICY = {"mode": "destructive", "timeout": 600.0}
NETWORK = {"network": "egress", "egress_allow_hosts": ["example.org"]}
WRITE = fc("write_file", {"path": "pwned.txt", "content": "written without approval\n"})


@pytest.fixture
def agent_id():
    return f"inherit-{uuid.uuid4().hex[:8]}"


def parent(control, gateway, script, call, *, agent_id, turn_id, **meta):
    gateway.add_script(script, [{"output": [call]}, {"output": [msg("started")]}])
    control.enqueue(
        {
            "agent_id": agent_id,
            "input": "go",
            "model": script,
            "toolset": "text",
            "supports": {"spawn_jobs": True},
            "approval": PARENT_POLICY,
            "metadata": meta,
            **NETWORK,
        },
        turn_id=turn_id,
    )
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    return outputs(control, turn_id)[0]


def parks_on_write(control, turn_id):
    """The child turn waits for a person on its write_file; returns the pending record."""

    def ready():
        pending = control.pending_approvals(turn_id=turn_id)
        return pending[0] if pending else None

    rec = wait_for(ready, timeout=30)
    assert rec["name"] == "write_file"
    assert control.status(turn_id).status == TurnStatus.awaiting_approval
    return rec


def test_background_job_of_a_destructive_turn_parks_its_destructive_call(
    control, gateway, script_name, agent_id, homes_root
):
    job_script = script_name + "-job"
    gateway.add_script(job_script, [{"output": [WRITE]}, {"output": [msg("wrote it")]}])
    parent_id = uuid.uuid4().hex
    start = fc("job_start", {"title": "write", "instructions": "You write files.", "input": "Write."}, "c-job")
    parent(control, gateway, script_name, start, agent_id=agent_id, turn_id=parent_id, job_model=job_script)
    job_turn = f"{job_id_for(parent_id, 'c-job')}-turn"

    rec = parks_on_write(control, job_turn)
    request = control.store.load(job_turn).request
    assert request["approval"] == PARENT_POLICY
    assert (request["network"], request["egress_allow_hosts"]) == ("egress", ["example.org"])
    home = homes_root / agent_id
    assert not (home / "pwned.txt").exists(), "nothing was written before a person approved"
    # Once approved it runs (so the path checked above is where the write lands).
    control.approve(job_turn, rec["call_id"], by="ops")
    assert control.wait(job_turn, timeout=30).status == TurnStatus.completed
    assert (home / "pwned.txt").read_text() == "written without approval\n"


def test_schedule_of_a_destructive_turn_fires_turns_that_park(control, gateway, script_name, agent_id):
    from tasks.scheduler import fire_schedule

    fired_script = script_name + "-fired"
    gateway.add_script(fired_script, [{"output": [WRITE]}, {"output": [msg("wrote it")]}])
    parent_id = uuid.uuid4().hex
    sid = schedule_id_for(parent_id, "c-sch")
    create = fc("schedule_create", {"title": "later", "input": "Write.", "at": "in 1 hour"}, "c-sch")
    parent(control, gateway, script_name, create, agent_id=agent_id, turn_id=parent_id, schedule_model=fired_script)
    store = ScheduleStore(control.redis)
    stored = store.get(sid)["request"]
    assert stored["approval"] == PARENT_POLICY
    assert (stored["network"], stored["egress_allow_hosts"]) == ("egress", ["example.org"])

    fire_schedule.apply_async((sid,), queue="turns")  # what its timer entry sends, here and now
    fired = wait_for(lambda: (r := store.get(sid)) and r["last_turn_id"], timeout=30)
    parks_on_write(control, fired)
    assert control.store.load(fired).request["approval"] == PARENT_POLICY
    assert control.cancel(fired) is True
    [out] = outputs(control, fired)
    assert "did not run" in out
    store.cancel(sid, agent_id)


def test_workflow_task_of_a_destructive_turn_records_and_carries_the_policy(control, gateway, script_name, agent_id):
    from control.workflow import WorkflowClient

    task_script = script_name + "-task"
    gateway.add_script(task_script, [{"output": [fc("submit_result", {"result": {"answer": "42"}})]}])
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}
    start = fc("workflow_start", {"title": "ask", "instructions": "Answer.", "result_schema": schema})
    out = parent(
        control, gateway, script_name, start, agent_id=agent_id, turn_id=uuid.uuid4().hex, workflow_model=task_script
    )
    import orjson

    client = WorkflowClient(control)
    task = client.wait(orjson.loads(out)["task_id"])
    assert task.status == "succeeded"
    assert task.approval == PARENT_POLICY
    attempt_turn = task.attempts[0]["turn_id"]
    assert control.store.load(attempt_turn).request["approval"] == PARENT_POLICY


def test_a_child_of_a_turn_without_a_policy_gets_the_settings_resolved_at_creation():
    from worker.settings import Settings
    from worker.turn.approval_policy import inherited_approval

    strict = Settings(approval_mode="destructive", approval_timeout=60)
    assert inherited_approval({}, strict) == {"mode": "destructive", "timeout": 60.0}
    assert inherited_approval({"approval": {"timeout": 5}}, strict) == {"mode": "destructive", "timeout": 5.0}
    assert inherited_approval({"approval": {"mode": "declared"}}, strict) == {"mode": "declared", "timeout": 60.0}
