"""Background agent jobs through a real worker and a real Redis: a parent turn starts a job, the job's
own turn runs on the ``background`` queue and finishes, and a later parent turn reads its result."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest

from tests.support.scripts import fc, msg, wait_for
from tests.support.scripts import output_texts as outputs
from worker.records.jobs import JobStore, job_id_for
from worker.turn.request import TurnStatus


def tool_names(body):
    return {t.get("name") for t in body.get("tools", [])}


@pytest.fixture
def agent_id():
    return f"jobs-{uuid.uuid4().hex[:8]}"


def parent_turn(control, gateway, script, steps, *, agent_id, turn_id=None, spawn_jobs=True, **meta):
    gateway.add_script(script, steps)
    return control.enqueue(
        {
            "agent_id": agent_id,
            "input": "go",
            "model": script,
            "toolset": "text",
            "supports": {"spawn_jobs": spawn_jobs},
            "metadata": meta,
        },
        turn_id=turn_id,
    )


def test_job_runs_on_background_queue_and_next_turn_reads_its_result(control, gateway, script_name, agent_id):
    job_script = script_name + "-job"
    gateway.add_script(
        job_script,
        [
            {"output": [fc("todo_write", {"todos": [{"id": "1", "content": "count", "status": "completed"}]})]},
            {"output": [msg("the answer is 42")]},
        ],
    )
    parent_id = uuid.uuid4().hex
    job_id = job_id_for(parent_id, "c-start")
    parent_turn(
        control,
        gateway,
        script_name,
        [
            {
                "output": [
                    fc(
                        "job_start",
                        {"title": "count things", "instructions": "You count things.", "input": "Count to 42."},
                        "c-start",
                    )
                ]
            },
            {"output": [msg("started it")]},
        ],
        agent_id=agent_id,
        turn_id=parent_id,
        job_model=job_script,
    )
    assert control.wait(parent_id, timeout=30).status == TurnStatus.completed
    started = orjson.loads(outputs(control, parent_id)[0])
    assert started["job_id"] == job_id and started["status"] == "queued"
    started_event = [e for e in control.events(parent_id) if e["kind"] == "call_completed"][0]
    assert started_event["activity"] == "Started background job 'count things'"

    store = JobStore(control.redis)
    rec = wait_for(lambda: (r := store.get(job_id)) and r["status"] == "completed" and r, timeout=30)
    assert rec["output"] == "the answer is 42" and rec["error"] is None and rec["finished_at"]
    assert rec["parent_turn_id"] == parent_id and rec["agent_id"] == agent_id
    assert store.active_count(agent_id) == 0

    # The job's own turn: background queue, own instructions, cannot spawn jobs.
    job_turn = control.store.load(rec["turn_id"])
    assert job_turn.status == TurnStatus.completed
    req = job_turn.request
    assert req["queue"] == "background" and req["toolset"] == "text"
    assert req["supports"]["spawn_jobs"] is False
    assert req["instructions"] == "You count things." and req["input"] == "Count to 42."
    assert req["metadata"] == {"background_job_id": job_id, "parent_turn_id": parent_id, "job_model": job_script}
    job_requests = [b for b in gateway.requests if b["model"] == job_script]
    assert job_requests and job_requests[0]["instructions"] == "You count things."
    names = tool_names(job_requests[0])
    assert "todo_write" in names and "schedule_create" in names
    assert not names & {"job_start", "job_status", "job_list", "job_cancel"}
    parent_names = tool_names([b for b in gateway.requests if b["model"] == script_name][0])
    assert {"job_start", "job_status", "job_list", "job_cancel"} <= parent_names

    # A second parent turn reads the result.
    second = parent_turn(
        control,
        gateway,
        script_name + "-2",
        [
            {
                "output": [
                    fc("job_status", {"job_id": job_id}),
                    fc("job_list", {}),
                    fc("job_status", {"job_id": "job_unknown"}),
                ]
            },
            {"output": [msg("read it")]},
        ],
        agent_id=agent_id,
    )
    assert control.wait(second, timeout=30).status == TurnStatus.completed
    status, listing, unknown = outputs(control, second)
    status = orjson.loads(status)
    assert status["status"] == "completed" and status["output"] == "the answer is 42"
    jobs = orjson.loads(listing)["jobs"]
    assert [j["job_id"] for j in jobs] == [job_id] and jobs[0]["output"] == "the answer is 42"
    assert unknown.startswith("Error: no background job 'job_unknown'")

    # Another agent cannot see it.
    other = parent_turn(
        control,
        gateway,
        script_name + "-3",
        [{"output": [fc("job_status", {"job_id": job_id})]}, {"output": [msg("x")]}],
        agent_id=agent_id + "-other",
    )
    control.wait(other, timeout=30)
    assert outputs(control, other)[0].startswith("Error: no background job")


@pytest.fixture
def second_worker():
    """A second solo worker on every queue (one worker deployment per queue, in miniature):
    one worker can run the job's blocking tool while the other runs the parent's job_cancel."""
    from tests.conftest import _state
    from tests.integration.conftest import start_worker_process, stop_process

    proc = start_worker_process("--pool", "solo", "-c", "1")
    yield proc
    stop_process(proc)
    _state["workers"].remove(proc)


def test_job_cancel_stops_a_running_job(control, gateway, script_name, agent_id, second_worker):
    job_script = script_name + "-job"
    gateway.add_script(
        job_script,
        [
            {"output": [fc("run_command", {"command": "sleep 30", "timeout_seconds": 55})]},
            {"output": [msg("never reached")]},
        ],
    )
    parent_id = uuid.uuid4().hex
    job_id = job_id_for(parent_id, "c-start")
    store = JobStore(control.redis)

    def cancel_once_running(body):
        # Runs in the gateway while the parent's step waits: return job_cancel once the job's tool runs.
        rec = store.get(job_id)
        wait_for(lambda: any(e["kind"] == "call_started" for e in control.events(rec["turn_id"])), timeout=30)
        return {"output": [fc("job_cancel", {"job_id": job_id}), fc("job_status", {"job_id": job_id})]}

    started = time.monotonic()
    parent_turn(
        control,
        gateway,
        script_name,
        [
            {
                "output": [
                    fc("job_start", {"title": "slow", "instructions": "Work slowly.", "input": "Sleep."}, "c-start")
                ]
            },
            cancel_once_running,
            {"output": [fc("job_cancel", {"job_id": job_id})]},
            {"output": [msg("cancelled it")]},
        ],
        agent_id=agent_id,
        turn_id=parent_id,
        job_model=job_script,
    )
    assert control.wait(parent_id, timeout=60).status == TurnStatus.completed
    outs = outputs(control, parent_id)
    assert orjson.loads(outs[1])["status"] == "cancel_requested"
    assert orjson.loads(outs[2])["status"] in ("cancel_requested", "cancelled")
    rec = wait_for(lambda: (r := store.get(job_id)) and r["status"] == "cancelled" and r, timeout=30)
    elapsed = time.monotonic() - started
    assert elapsed < 25, f"the job's sleep was not interrupted ({elapsed:.1f}s)"
    view = control.status(rec["turn_id"])
    assert view.status == TurnStatus.cancelled
    assert rec["cancel_requested_at"] and rec["finished_at"]
    assert store.active_count(agent_id) == 0
    # The second cancel (after the job ended, or while it was ending) changes nothing.
    assert "nothing to cancel" in outs[3] or orjson.loads(outs[3])["status"] == "cancel_requested"
    job_out = [i["output"] for i in control.items(rec["turn_id"]) if i["type"] == "function_call_output"]
    assert len(job_out) == 1  # the interrupted call still has its output: history stays valid


def test_job_tools_absent_without_spawn_jobs(control, gateway, script_name, agent_id, homes_root):
    from worker.settings import get_settings
    from worker.tooling.contract import ToolServices
    from worker.tools.assembly import text_turn_tools
    from worker.turn.context import TurnContext
    from worker.turn.request import TurnSupports

    services = ToolServices(
        enqueue_turn=lambda request, turn_id=None: "t",
        save_schedule_entry=lambda r: None,
        delete_schedule_entry=lambda s: None,
    )

    def names(spawn):
        ctx = TurnContext(
            turn_id="t",
            agent_id=agent_id,
            home=Path(homes_root),
            settings=get_settings(),
            supports=TurnSupports(spawn_jobs=spawn),
            redis=control.redis,
            services=services,
        )
        return [t.name for t in text_turn_tools(ctx)]

    with_jobs, without = names(True), names(False)
    jobs = ["job_start", "job_status", "job_list", "job_cancel"]
    assert [n for n in with_jobs if n in jobs] == jobs
    assert not set(jobs) & set(without)
    # Catalog order: ... schedule tools, then background job tools.
    assert with_jobs.index("schedule_cancel") < with_jobs.index("job_start")
    assert "schedule_create" in without

    # Through a real turn: the model's job_start is an unknown tool, nothing starts.
    turn_id = parent_turn(
        control,
        gateway,
        script_name,
        [{"output": [fc("job_start", {"title": "x", "instructions": "x", "input": "x"})]}, {"output": [msg("ok")]}],
        agent_id=agent_id,
        spawn_jobs=False,
    )
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    out = outputs(control, turn_id)[0]
    assert "unknown tool 'job_start'" in out and "schedule_create" in out
    assert JobStore(control.redis).list(agent_id) == []
