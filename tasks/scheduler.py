"""The Celery side of schedules: redbeat entries and the ``fire_schedule`` task.

Mechanism (chosen: celery beat + celery-redbeat, rather than an own ZSET poller):

- Each active schedule has one ``RedBeatSchedulerEntry`` named
  ``agent-schedule:<schedule_id>`` (Redis key ``redbeat:agent-schedule:<id>``,
  definition stored as JSON by redbeat's encoder; never pickle). A one-off
  is ``redbeat.schedules.rrule("SECONDLY", dtstart=run_at, count=1)``; a
  recurring schedule is a Celery ``crontab`` built from the 5 validated cron
  fields (app timezone UTC). The entry's only argument is the schedule id.
- ``celery -A tasks.app beat -S redbeat.RedBeatScheduler`` reads due entries
  from the ``redbeat::schedule`` sorted set on every tick (at most
  ``beat_max_loop_interval`` = 5 s apart, so a schedule fires within ~5 s of
  its time) and sends ``tasks.scheduler.fire_schedule(schedule_id)`` to the
  ``turns`` queue. redbeat holds a Redis lock, so a second beat replica
  stands by instead of firing twice.
- ``fire_schedule`` re-reads the record (``worker.schedules``), drops the
  firing unless the schedule is still ``active``, enqueues a real turn with
  the stored request through ``tasks.services.enqueue_turn`` (idempotency key
  ``schedule:<id>:<slot>``, slot = ``once`` or the cron time fired, so an
  ``acks_late`` redelivery does not start a second turn), and updates
  ``last_run``, ``last_turn_id``, ``runs`` and ``next_run``. A one-off is then
  marked ``done`` and its entry deleted.

Why redbeat over an own poller: entries are added and removed at run time
without restarting beat (the stock ``PersistentScheduler`` reads a static
file), it keeps its state in the Redis we already run (no shelve file, JSON
only), cron arithmetic and the single-leader lock come tested, and beat
already runs for the watchdog sweep. An own ZSET poller would need the same
three parts written again. The record, not the entry, decides whether a
firing runs, so a lost or stale entry can never run a cancelled schedule.

Beat process: ``celery -A tasks.app beat -S redbeat.RedBeatScheduler -l INFO``
(``beat_scheduler`` is also set in the app config). Tests run it with
``--max-interval 1``.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta, timezone
from dataclasses import dataclass
from typing import Any, Callable

from tasks.app import app
from worker.schedules import ScheduleStore, cron_next, cron_slot, iso, parse_iso, utcnow

log = logging.getLogger("agent.scheduler")

FIRE_TASK = "tasks.scheduler.fire_schedule"
ENTRY_PREFIX = "agent-schedule:"


def entry_name(schedule_id: str) -> str:
    """The redbeat entry name of a schedule: ``agent-schedule:<schedule_id>``."""
    return ENTRY_PREFIX + schedule_id


def entry_key(schedule_id: str) -> str:
    """Redis key of the schedule's redbeat entry (``redbeat:agent-schedule:<id>``)."""
    from redbeat.schedulers import ensure_conf

    return ensure_conf(app).key_prefix + entry_name(schedule_id)


def _celery_schedule(record: dict[str, Any]) -> Any:
    if record["kind"] == "once":
        from redbeat.schedules import rrule

        return rrule("SECONDLY", dtstart=parse_iso(record["run_at"]), count=1, app=app)
    from celery.schedules import crontab

    minute, hour, dom, month, dow = record["cron"].split()
    return crontab(minute=minute, hour=hour, day_of_month=dom, month_of_year=month, day_of_week=dow, app=app)


def save_schedule_entry(record: dict[str, Any]) -> None:
    """Create (or overwrite) the redbeat entry of an active schedule record.

    ``last_run_at`` is set to now (or just before a one-off time already
    reached) so redbeat scores the entry at its first due time, not "now".
    Raises ``ValueError`` if Celery's ``crontab`` cannot read the fields, and
    redis errors if Redis is unreachable.
    """
    from redbeat import RedBeatSchedulerEntry

    now = datetime.now(timezone.utc)
    last = now
    if record["kind"] == "once":
        due = parse_iso(record["run_at"])
        assert due is not None
        last = min(now, due - timedelta(seconds=1))
    entry = RedBeatSchedulerEntry(name=entry_name(record["schedule_id"]), task=FIRE_TASK,
                                  schedule=_celery_schedule(record), args=[record["schedule_id"]],
                                  options={"queue": "turns"}, app=app, last_run_at=last)
    entry.save()


def delete_schedule_entry(schedule_id: str) -> None:
    """Remove the schedule's redbeat entry (no error if there is none)."""
    from redbeat.schedulers import ensure_conf, get_redis

    conf = ensure_conf(app)
    key = entry_key(schedule_id)
    with get_redis(app).pipeline() as pipe:
        pipe.zrem(conf.schedule_key, key)
        pipe.delete(key)
        pipe.execute()


@app.task(name=FIRE_TASK, acks_late=True)
def fire_schedule(schedule_id: str) -> dict[str, Any]:
    """Enqueue the schedule's turn if it is still active. Returns ``{"action", ...}`` for logs.

    Actions: ``fired`` (with ``turn_id``), ``dropped`` (unknown or no longer
    active), ``failed`` (the stored request was refused; a one-off becomes
    ``failed``, a recurring schedule keeps going and records ``last_error``).
    """
    from tasks.runtime import get_engine
    from tasks.services import enqueue_turn

    store = ScheduleStore(get_engine().store.r)
    rec = store.get(schedule_id)
    if rec is None or rec["status"] != "active":
        delete_schedule_entry(schedule_id)
        return {"action": "dropped", "status": rec and rec["status"]}
    now = utcnow()
    once = rec["kind"] == "once"
    slot = "once" if once else iso(cron_slot(rec["cron"], now))
    request = {**rec["request"], "idempotency_key": f"schedule:{schedule_id}:{slot}"}
    try:
        turn_id = enqueue_turn(request)
    except Exception as exc:  # pydantic ValidationError for a request that no longer validates
        log.exception("schedule %s: cannot enqueue its turn", schedule_id)
        error = f"{exc.__class__.__name__}: {str(exc)[:300]}"
        store.update(schedule_id, lambda r: {"status": "failed", "next_run": None, "last_error": error} if once
                     else {"last_error": error, "next_run": iso(cron_next(r["cron"], now))})
        if once:
            delete_schedule_entry(schedule_id)
        return {"action": "failed", "error": error}

    def change(r: dict[str, Any]) -> dict[str, Any] | None:
        if r["status"] != "active":
            return None
        fields: dict[str, Any] = {"last_run": iso(now), "last_turn_id": turn_id,
                                  "runs": int(r.get("runs", 0)) + (r.get("last_turn_id") != turn_id)}
        if once:
            fields.update(status="done", next_run=None)
        else:
            fields["next_run"] = iso(cron_next(r["cron"], now))
        return fields

    store.update(schedule_id, change)
    get_engine().store.event(turn_id, "scheduled_by", schedule_id=schedule_id, slot=slot)
    if once:
        delete_schedule_entry(schedule_id)
    return {"action": "fired", "turn_id": turn_id, "slot": slot}


# ----- demo ------------------------------------------------------------------
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
        return self.scheduled_turn["status"] == "completed" and self.job["status"] == "completed"

    def lines(self) -> list[str]:
        """The report as printable lines."""
        s, j, m, st = self.schedule, self.job, self.main, self.scheduled_turn
        late = (parse_iso(s["last_run"]) - parse_iso(s["run_at"])).total_seconds() if s.get("last_run") else None
        return [
            f"main turn {m['turn_id']}: {m['status']}: {m['final_output']}",
            f"schedule {s['schedule_id']} '{s['title']}' ({s['kind']}, due {s['run_at']}): {s['status']}; "
            f"fired {s['last_run']} ({late:+.0f} s) -> turn {s['last_turn_id']}",
            f"scheduled turn: {st['status']}: {st['final_output']}",
            f"background job {j['job_id']} '{j['title']}' (turn {j['turn_id']}, background queue): {j['status']}",
            f"job output: {j['output']}",
            f"demo took {self.seconds:.1f} s",
        ]


def run_schedule_and_job_demo(control: Any, *, agent_id: str | None = None, model: str = DEMO_MODEL,
                              scheduled_model: str = DEMO_SCHEDULED_MODEL, job_model: str = DEMO_JOB_MODEL,
                              timeout: float = 90.0, poll: float = 0.25, out: Callable[[str], Any] | None = None,
                              console: Any = None) -> JobsDemoReport:
    """Run the schedule + background job demo against a running stack; returns a ``JobsDemoReport``.

    Needs: a worker serving ``turns,tools,background``, a beat process with
    the redbeat scheduler, and a gateway serving ``scripts/demo-jobs-main.json``,
    ``demo-jobs-scheduled.json`` and ``demo-jobs-job.json`` (chosen by model
    name). The main turn creates a one-off schedule due in 3 s and starts a
    background job; the scheduled turn and the job get their scripted replies
    through the main turn's ``metadata.schedule_model`` / ``metadata.job_model``.
    Progress lines go to ``out`` (default ``print``) or a rich ``console``.
    Raises ``tasks.control.ControlPlaneError`` after ``timeout`` seconds, naming
    what did not happen (e.g. no beat running).
    """
    import uuid

    from tasks.control import ControlPlaneError
    from worker.jobs import FINISHED, JobStore

    if out is None:
        out = (lambda line: console.print(line, markup=False)) if console is not None else print
    agent = agent_id or f"demo-jobs-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    deadline = started + timeout
    main_id = control.enqueue({
        "agent_id": agent, "model": model, "toolset": "text", "supports": {"spawn_jobs": True},
        "input": "In a few seconds, check in with me; meanwhile start a background job that drafts the plan.",
        "instructions": "You are the demo agent.",
        "metadata": {"schedule_model": scheduled_model, "job_model": job_model},
    })
    main = control.wait(main_id, timeout=timeout)
    out(f"main turn {main_id}: {main.status.value}: {main.final_output}")
    r = control.store.r
    schedules = [s for s in ScheduleStore(r).list(agent) if s.get("created_by_turn") == main_id]
    jobs = [j for j in JobStore(r).list(agent) if j.get("parent_turn_id") == main_id]
    if not schedules or not jobs:
        raise ControlPlaneError(f"the main turn {main_id} ended {main.status.value} without creating a schedule "
                                f"and a job (schedules={len(schedules)}, jobs={len(jobs)}; error={main.error})")
    sid, jid = schedules[0]["schedule_id"], jobs[0]["job_id"]
    out(f"schedule {sid} due {schedules[0]['run_at']}; background job {jid} started; waiting for both...")
    sched = job = None
    while time.monotonic() < deadline:
        sched, job = ScheduleStore(r).get(sid), JobStore(r).get(jid)
        fired = sched and sched.get("last_turn_id")
        if fired and control.status(sched["last_turn_id"]).done and job and job["status"] in FINISHED:
            break
        time.sleep(poll)
    else:
        what = [] if (sched and sched.get("last_turn_id")) else [
            f"schedule {sid} never fired (is celery beat with -S redbeat.RedBeatScheduler running?)"]
        if not (job and job["status"] in FINISHED):
            what.append(f"job {jid} is still {job and job['status']} (is a worker serving the background queue?)")
        raise ControlPlaneError("demo timed out after %.0fs: %s" % (timeout, "; ".join(what) or "turn not done"))

    def turn(tid: str) -> dict[str, Any]:
        v = control.status(tid)
        return {"turn_id": tid, "status": v.status.value, "final_output": v.final_output, "error": v.error}

    assert sched is not None and job is not None
    report = JobsDemoReport(agent, turn(main_id), sched, turn(sched["last_turn_id"]), job, turn(job["turn_id"]),
                            round(time.monotonic() - started, 2))
    for line in report.lines()[1:]:
        out(line)
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m tasks.scheduler demo [--timeout S]``: run the demo against the configured stack."""
    import argparse

    from tasks.control import ControlPlane

    parser = argparse.ArgumentParser(description="Schedule and background job demo")
    parser.add_argument("command", choices=["demo"])
    parser.add_argument("--timeout", type=float, default=90.0)
    args = parser.parse_args(argv)
    return 0 if run_schedule_and_job_demo(ControlPlane(), timeout=args.timeout) else 1


if __name__ == "__main__":
    raise SystemExit(main())
