"""The schedule and background job demo (``make run DEMO=jobs``): ``run_schedule_and_job_demo``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from worker.records.schedules import ScheduleStore, parse_iso

if TYPE_CHECKING:
    from rich.console import Console

    from control.client import ControlPlane

DEMO_MODEL = "demo-jobs-main"
DEMO_SCHEDULED_MODEL = "demo-jobs-scheduled"
DEMO_JOB_MODEL = "demo-jobs-job"


@dataclass
class JobsDemoReport:
    """What the demo did. A turn is ``{"turn_id", "status", "final_output", "error"}``; ``schedule`` and
    ``job`` are the stored records. True (``bool(report)``) when the scheduled turn and the job completed."""

    agent_id: str
    main: dict[str, Any]
    schedule: dict[str, Any]
    scheduled_turn: dict[str, Any]
    job: dict[str, Any]
    job_turn: dict[str, Any]
    seconds: float

    def __bool__(self) -> bool:
        return bool(self.scheduled_turn["status"] == "completed" and self.job["status"] == "completed")

    def lines(self) -> list[str]:
        """The report as printable lines."""
        s, j, m, st = self.schedule, self.job, self.main, self.scheduled_turn
        last_run, run_at = parse_iso(s.get("last_run")), parse_iso(s.get("run_at"))
        late = (last_run - run_at).total_seconds() if last_run and run_at else None
        return [
            f"main turn {m['turn_id']}: {m['status']}: {m['final_output']}",
            f"schedule {s['schedule_id']} '{s['title']}' ({s['kind']}, due {s['run_at']}): {s['status']}; "
            f"fired {s['last_run']} ({late:+.0f} s) -> turn {s['last_turn_id']}",
            f"scheduled turn: {st['status']}: {st['final_output']}",
            f"background job {j['job_id']} '{j['title']}' (turn {j['turn_id']}, background queue): {j['status']}",
            f"job output: {j['output']}",
            f"demo took {self.seconds:.1f} s",
        ]


def run_schedule_and_job_demo(
    control: ControlPlane,
    *,
    agent_id: str | None = None,
    model: str = DEMO_MODEL,
    scheduled_model: str = DEMO_SCHEDULED_MODEL,
    job_model: str = DEMO_JOB_MODEL,
    timeout: float = 90.0,
    poll: float = 0.25,
    out: Callable[[str], object] | None = None,
    console: Console | None = None,
) -> JobsDemoReport:
    """Run the schedule + background job demo against a running stack; returns a ``JobsDemoReport``.

    Needs: a worker serving ``turns,tools,background``, a beat process with
    the redbeat scheduler, and a gateway serving ``scripts/demo-jobs-main.json``,
    ``demo-jobs-scheduled.json`` and ``demo-jobs-job.json`` (chosen by model
    name). The main turn creates a one-off schedule due in 3 s and starts a
    background job; the scheduled turn and the job get their scripted replies
    through the main turn's ``metadata.schedule_model`` / ``metadata.job_model``.
    Progress lines go to ``out`` (default ``print``) or a rich ``console``.
    Raises ``control.client.ControlPlaneError`` after ``timeout`` seconds, naming
    what did not happen (e.g. no beat running).
    """
    import uuid

    from control.errors import ControlPlaneError
    from worker.records.jobs import FINISHED, JobStore

    if out is None:
        out = (lambda line: console.print(line, markup=False)) if console is not None else print
    agent = agent_id or f"demo-jobs-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    deadline = started + timeout
    main_id = control.enqueue(
        {
            "agent_id": agent,
            "model": model,
            "toolset": "text",
            "supports": {"spawn_jobs": True},
            "input": "In a few seconds, check in with me; meanwhile start a background job that drafts the plan.",
            "instructions": "You are the demo agent.",
            "metadata": {"schedule_model": scheduled_model, "job_model": job_model},
        }
    )
    main = control.wait(main_id, timeout=timeout)
    out(f"main turn {main_id}: {main.status.value}: {main.final_output}")
    r = control.redis
    schedules = [s for s in ScheduleStore(r).list(agent) if s.get("created_by_turn") == main_id]
    jobs = [j for j in JobStore(r).list(agent) if j.get("parent_turn_id") == main_id]
    if not schedules or not jobs:
        raise ControlPlaneError(
            f"the main turn {main_id} ended {main.status.value} without creating a schedule "
            f"and a job (schedules={len(schedules)}, jobs={len(jobs)}; error={main.error})"
        )
    sid, jid = schedules[0]["schedule_id"], jobs[0]["job_id"]
    out(f"schedule {sid} due {schedules[0]['run_at']}; background job {jid} started; waiting for both...")
    sched = job = None
    while time.monotonic() < deadline:
        sched, job = ScheduleStore(r).get(sid), JobStore(r).get(jid)
        fired = sched.get("last_turn_id") if sched else None
        if fired and control.status(fired).done and job and job["status"] in FINISHED:
            break
        time.sleep(poll)
    else:
        what = (
            []
            if (sched and sched.get("last_turn_id"))
            else [f"schedule {sid} never fired (is celery beat with -S tasks.beat:ResilientRedBeatScheduler running?)"]
        )
        if not (job and job["status"] in FINISHED):
            what.append(f"job {jid} is still {job and job['status']} (is a worker serving the background queue?)")
        raise ControlPlaneError("demo timed out after %.0fs: %s" % (timeout, "; ".join(what) or "turn not done"))

    def turn(tid: str) -> dict[str, Any]:
        v = control.status(tid)
        return {"turn_id": tid, "status": v.status.value, "final_output": v.final_output, "error": v.error}

    assert sched is not None and job is not None
    report = JobsDemoReport(
        agent,
        turn(main_id),
        sched,
        turn(sched["last_turn_id"]),
        job,
        turn(job["turn_id"]),
        round(time.monotonic() - started, 2),
    )
    for line in report.lines()[1:]:
        out(line)
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m devtools.jobs_demo demo [--timeout S]``: run the demo against the configured stack."""
    import argparse

    from control.client import ControlPlane

    parser = argparse.ArgumentParser(description="Schedule and background job demo")
    parser.add_argument("command", choices=["demo"])
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    return 0 if run_schedule_and_job_demo(ControlPlane(), timeout=args.timeout) else 1


if __name__ == "__main__":
    raise SystemExit(main())
