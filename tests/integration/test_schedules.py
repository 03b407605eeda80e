"""Schedule tools and the redbeat firing mechanism, through a real worker, a real Redis and a
real ``celery beat -S tasks.beat:ResilientRedBeatScheduler`` subprocess."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import orjson
import pytest

from devtools.workers import beat_command
from tests.integration.conftest import stop_process
from tests.support.scripts import fc, msg, wait_for
from tests.support.scripts import output_texts as outputs
from worker.records.schedules import (
    MAX_ACTIVE_PER_AGENT,
    MAX_CHAIN_DEPTH,
    ScheduleStore,
    cron_next,
    new_record,
    parse_iso,
    schedule_id_for,
)
from worker.turn.request import TurnStatus

ROOT = Path(__file__).resolve().parents[2]


def start_turn(control, gateway, script, steps, *, agent_id, turn_id=None, **extra):
    gateway.add_script(script, steps)
    return control.enqueue(
        {"agent_id": agent_id, "input": "go", "model": script, "toolset": "text", **extra}, turn_id=turn_id
    )


def redbeat_key(sid):
    from tasks.schedule_entries import entry_key

    return entry_key(sid)


@pytest.fixture
def agent_id():
    return f"sched-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def beat(solo_worker, redis_url):
    """``celery beat`` with the redbeat scheduler, ticking at least every second; stopped after the module."""
    log = open(Path(tempfile.gettempdir()) / f"beat-{uuid.uuid4().hex[:6]}.log", "w")
    proc = subprocess.Popen(beat_command(), cwd=ROOT, env=dict(os.environ), stdout=log, stderr=subprocess.STDOUT)
    import redis

    r = redis.Redis.from_url(redis_url)
    try:
        # redbeat takes its lock ("redbeat::lock") once it runs; a stale lock from a killed beat expires in 5 s.
        wait_for(lambda: proc.poll() is not None or r.exists("redbeat::lock"), timeout=30)
        assert proc.poll() is None, f"beat exited early; see {log.name}"
        yield proc
    finally:
        stop_process(proc)
        log.close()


def test_create_list_cancel_through_a_turn(control, gateway, script_name, agent_id):
    turn_id = uuid.uuid4().hex
    weekly = schedule_id_for(turn_id, "c-cron")
    steps = [
        {
            "output": [
                fc(
                    "schedule_create",
                    {"title": "weekday report", "input": "Write the weekday report.", "cron": "0 9 * * 1-5"},
                    "c-cron",
                ),
                fc("schedule_create", {"title": "reminder", "input": "Remind me.", "at": "in 10 minutes"}, "c-once"),
            ]
        },
        {"output": [fc("schedule_list", {})]},
        {
            "output": [
                fc("schedule_cancel", {"schedule_id": weekly}),
                fc("schedule_cancel", {"schedule_id": weekly}),
                fc("schedule_cancel", {"schedule_id": "sch_nope"}),
            ]
        },
        {"output": [fc("schedule_list", {"include_finished": True})]},
        {"output": [msg("done")]},
    ]
    before = datetime.now(timezone.utc)
    start_turn(control, gateway, script_name, steps, agent_id=agent_id, turn_id=turn_id)
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed, view.error
    outs = outputs(control, turn_id)
    created_cron, created_once = orjson.loads(outs[0]), orjson.loads(outs[1])
    assert created_cron["schedule_id"] == weekly and created_cron["kind"] == "cron"
    assert created_cron["next_run"] == cron_next("0 9 * * 1-5", before).isoformat().replace("+00:00", "Z")
    once_at = parse_iso(created_once["next_run"])
    assert 590 <= (once_at - before).total_seconds() <= 610
    listed = orjson.loads(outs[2])["schedules"]
    assert {s["title"] for s in listed} == {"weekday report", "reminder"}
    assert all(s["status"] == "active" and s["next_run"] and s["last_run"] is None for s in listed)
    assert orjson.loads(outs[3]) == {"schedule_id": weekly, "status": "cancelled", "title": "weekday report"}
    assert "already cancelled" in outs[4]
    assert outs[5].startswith("Error: no schedule 'sch_nope'")
    final = {s["schedule_id"]: s for s in orjson.loads(outs[6])["schedules"]}
    assert final[weekly]["status"] == "cancelled" and final[weekly]["next_run"] is None
    once_id = created_once["schedule_id"]
    assert final[once_id]["status"] == "active"

    # Redis: records, the active set, and redbeat entries (JSON, not pickle) for active schedules only.
    r = control.redis
    store = ScheduleStore(r)
    assert store.active_count(agent_id) == 1
    assert not r.exists(redbeat_key(weekly))
    definition = orjson.loads(r.hget(redbeat_key(once_id), "definition"))
    assert definition["task"] == "tasks.scheduler.fire_schedule" and definition["args"] == [once_id]
    assert definition["schedule"]["__type__"] == "rrule" and definition["schedule"]["count"] == 1
    assert r.zscore("redbeat::schedule", redbeat_key(once_id)) == pytest.approx(once_at.timestamp(), abs=2)
    rec = store.get(once_id)
    assert rec["request"]["agent_id"] == agent_id and rec["request"]["input"] == "Remind me."
    assert rec["created_by_turn"] == turn_id and rec["depth"] == 0

    # Activity labels (describe_activity / describe_completed_activity).
    events = control.events(turn_id)
    planned = [e["activity"] for e in events if e["kind"] == "call_planned" and e["name"] == "schedule_create"]
    assert planned[0] == "Scheduling 'weekday report' for cron '0 9 * * 1-5' (UTC)"
    assert planned[1].startswith("Scheduling 'reminder' for 20") and planned[1].endswith("Z")
    done = [e["activity"] for e in events if e["kind"] == "call_completed" and e["name"] == "schedule_create"]
    assert done[1] == f"Scheduled 'reminder' for {created_once['next_run']}"

    # Clean up the still-active entry so the module's beat never fires it.
    store.cancel(once_id, agent_id)
    from tasks.schedule_entries import delete_schedule_entry

    delete_schedule_entry(once_id)


@pytest.mark.parametrize(
    "cron, expect",
    [
        ("61 * * * *", "out of range"),
        ("* * * *", "has 4 fields, expected 5"),
        ("0 0 L * *", "no 'L', '#' or '?'"),
        ("0 9 1 * 1", "either day-of-month or day-of-week"),
    ],
)
def test_bad_cron_is_refused_with_a_clear_output(control, gateway, script_name, agent_id, cron, expect):
    steps = [{"output": [fc("schedule_create", {"title": "bad", "input": "x", "cron": cron})]}, {"output": [msg("ok")]}]
    turn_id = start_turn(control, gateway, script_name, steps, agent_id=agent_id)
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    out = outputs(control, turn_id)[0]
    assert out.startswith(f"Error: invalid cron expression '{cron}'")
    assert expect in out
    if "day-of-week" not in expect:  # the shape is shown whenever the fields themselves are wrong
        assert "Use 5 fields 'minute hour day-of-month month day-of-week' (UTC)" in out
    assert ScheduleStore(control.redis).list(agent_id) == []


def test_bad_times_and_both_or_neither_are_refused(control, gateway, script_name, agent_id):
    steps = [
        {
            "output": [
                fc("schedule_create", {"title": "a", "input": "x", "at": "2026-01-01T09:00:00"}),
                fc("schedule_create", {"title": "b", "input": "x", "at": "2001-01-01T09:00:00Z"}),
                fc("schedule_create", {"title": "c", "input": "x", "at": "tomorrow-ish"}),
                fc("schedule_create", {"title": "d", "input": "x"}),
                fc("schedule_create", {"title": "e", "input": "x", "at": "in 5 minutes", "cron": "* * * * *"}),
            ]
        },
        {"output": [msg("ok")]},
    ]
    turn_id = start_turn(control, gateway, script_name, steps, agent_id=agent_id)
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    outs = outputs(control, turn_id)
    assert "has no timezone" in outs[0]
    assert "is in the past" in outs[1]
    assert "cannot read the time 'tomorrow-ish'" in outs[2] and "in N minutes" in outs[2]
    assert "exactly one of 'at'" in outs[3] and "exactly one of 'at'" in outs[4]
    assert ScheduleStore(control.redis).list(agent_id) == []


def test_active_schedule_cap_and_chain_depth(control, gateway, script_name, agent_id):
    store = ScheduleStore(control.redis)
    for i in range(MAX_ACTIVE_PER_AGENT):
        store.create(
            new_record(
                schedule_id=f"sch_{agent_id}_{i}",
                agent_id=agent_id,
                title=f"s{i}",
                request={"input": "x"},
                cron="0 0 1 1 *",
            )
        )
    steps = [
        {"output": [fc("schedule_create", {"title": "one too many", "input": "x", "cron": "0 0 * * *"})]},
        {"output": [msg("ok")]},
    ]
    turn_id = start_turn(control, gateway, script_name, steps, agent_id=agent_id)
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    out = outputs(control, turn_id)[0]
    assert out.startswith(f"Error: this agent already has {MAX_ACTIVE_PER_AGENT} active schedules")
    assert store.active_count(agent_id) == MAX_ACTIVE_PER_AGENT

    # A turn at the end of a chain of scheduled turns may not schedule again.
    other = agent_id + "-deep"
    turn_id = start_turn(
        control,
        gateway,
        script_name + "-deep",
        steps,
        agent_id=other,
        metadata={"schedule_id": "sch_x", "schedule_depth": MAX_CHAIN_DEPTH},
    )
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    out = outputs(control, turn_id)[0]
    assert "chain of 11 schedules" in out and f"the limit is {MAX_CHAIN_DEPTH}" in out
    assert store.list(other) == []


def test_one_off_schedule_fires_and_runs_a_real_turn(control, gateway, script_name, agent_id, beat):
    scheduled_script = script_name + "-scheduled"
    gateway.add_script(scheduled_script, [{"output": [msg("good morning from the schedule")]}])
    turn_id = uuid.uuid4().hex
    sid = schedule_id_for(turn_id, "c1")
    steps = [
        {
            "output": [
                fc(
                    "schedule_create",
                    {
                        "title": "wake up",
                        "input": "Say good morning.",
                        "instructions": "Be brief.",
                        "at": "in 2 seconds",
                    },
                    "c1",
                )
            ]
        },
        {"output": [msg("scheduled")]},
    ]
    start_turn(
        control,
        gateway,
        script_name,
        steps,
        agent_id=agent_id,
        turn_id=turn_id,
        instructions="You are Ada.",
        metadata={"schedule_model": scheduled_script},
    )
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    store = ScheduleStore(control.redis)
    run_at = parse_iso(store.get(sid)["run_at"])

    rec = wait_for(lambda: (r := store.get(sid)) and r["status"] == "done" and r, timeout=30)
    fired = control.wait(rec["last_turn_id"], timeout=30)
    assert fired.status == TurnStatus.completed
    assert fired.final_output == "good morning from the schedule"
    assert rec["runs"] == 1 and rec["next_run"] is None
    lateness = (parse_iso(rec["last_run"]) - run_at).total_seconds()
    assert -1 <= lateness <= 5, lateness  # beat ticks every second here
    print(f"\none-off fired {lateness:+.1f}s after its time")
    # The fired turn is a real turn of the same agent with the stored request.
    state = control.store.load(rec["last_turn_id"])
    assert state.agent_id == agent_id
    assert state.request["input"] == "Say good morning."
    assert state.request["metadata"]["schedule_id"] == sid and state.request["metadata"]["schedule_depth"] == 0
    assert state.request["instructions"].startswith("You are Ada.")
    assert f"started by your schedule 'wake up' ({sid})" in state.request["instructions"]
    assert state.request["instructions"].endswith("Be brief.")
    assert any(e["kind"] == "scheduled_by" and e["schedule_id"] == sid for e in control.events(rec["last_turn_id"]))
    # One-off: its redbeat entry is gone, and it never fires again.
    r = control.redis
    wait_for(lambda: not r.exists(redbeat_key(sid)), timeout=5)
    assert r.zscore("redbeat::schedule", redbeat_key(sid)) is None
    time.sleep(2)
    assert store.get(sid)["runs"] == 1
    assert control.store.agent_turns(agent_id)[0] == rec["last_turn_id"]
    assert len(control.store.agent_turns(agent_id)) == 2


def test_fire_task_is_idempotent_per_slot_and_skips_cancelled(control, gateway, script_name, agent_id):
    """fire_schedule through the worker: a recurring schedule's duplicate firing in the same cron slot
    (acks_late redelivery) starts no second turn; a cancelled schedule's firing is dropped."""
    from tasks.scheduler import fire_schedule

    def drain(tag):
        # A sentinel turn behind the fire messages on the same queue: once it is done, they were consumed.
        gateway.add_script(f"{script_name}-{tag}", [{"output": [msg(tag)]}])
        sentinel = control.enqueue({"input": tag, "model": f"{script_name}-{tag}", "toolset": "text"})
        assert control.wait(sentinel, timeout=30).status == TurnStatus.completed

    gateway.add_script(script_name, [{"output": [msg("recurring run")]}])
    store = ScheduleStore(control.redis)
    # No redbeat entry here: this test sends the fire task itself.
    rec = new_record(
        schedule_id=f"sch_{agent_id}",
        agent_id=agent_id,
        title="every minute",
        request={
            "agent_id": agent_id,
            "input": "tick",
            "model": script_name,
            "toolset": "text",
            "metadata": {"schedule_id": f"sch_{agent_id}", "schedule_depth": 0},
        },
        cron="* * * * *",
    )
    store.create(rec)
    sid = rec["schedule_id"]
    if datetime.now(timezone.utc).second > 45:  # keep both firings inside one cron minute
        time.sleep(61 - datetime.now(timezone.utc).second)
    fire_schedule.apply_async((sid,), queue="turns")
    first = wait_for(lambda: (r := store.get(sid)) and r["last_turn_id"] and r, timeout=30)
    fire_schedule.apply_async((sid,), queue="turns")
    drain("s1")
    assert control.wait(first["last_turn_id"], timeout=30).final_output == "recurring run"
    again = store.get(sid)
    assert again["status"] == "active" and again["runs"] == 1 and again["last_turn_id"] == first["last_turn_id"]
    assert parse_iso(again["next_run"]) > parse_iso(again["last_run"])
    assert control.store.agent_turns(agent_id) == [first["last_turn_id"]]

    store.cancel(sid, agent_id)
    fire_schedule.apply_async((sid,), queue="turns")
    drain("s2")
    final = store.get(sid)
    assert final["status"] == "cancelled" and final["runs"] == 1
    assert control.store.agent_turns(agent_id) == [first["last_turn_id"]]


def test_jobs_demo_runs_end_to_end(control, gateway, beat):
    """``make run DEMO=jobs``'s function with the JSON scripts in scripts/: the scheduled turn fires and
    completes, the background job completes, and the report says so."""
    from devtools.jobs_demo import run_schedule_and_job_demo

    gateway.load_dir(ROOT / "scripts")
    lines: list[str] = []
    report = run_schedule_and_job_demo(control, timeout=60, out=lines.append)
    assert report, report.lines()
    assert report.main["status"] == "completed"
    assert report.schedule["status"] == "done" and report.schedule["runs"] == 1
    assert report.scheduled_turn["final_output"].startswith("Check-in:")
    assert report.job["output"].startswith("Plan drafted in plan.md")
    assert (Path(os.environ["AGENT_HOMES_ROOT"]) / report.agent_id / "plan.md").read_text().startswith("# Release plan")
    # The scheduled turn saw the job through job_list (it inherits spawn_jobs from the main turn).
    listed = orjson.loads(outputs(control, report.scheduled_turn["turn_id"])[0])["jobs"]
    assert [j["job_id"] for j in listed] == [report.job["job_id"]]
    assert any(line.startswith("background job ") for line in lines)
    print("\n" + "\n".join(report.lines()))
