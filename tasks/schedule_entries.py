"""A schedule's firing entry in celery-redbeat: create, replace and delete it.

Each active schedule has one ``RedBeatSchedulerEntry`` named
``agent-schedule:<schedule_id>`` whose only argument is the schedule id; beat
sends ``tasks.scheduler.fire_schedule`` when it is due (``tasks.scheduler``
explains the mechanism). Used by the ``save_schedule_entry`` /
``delete_schedule_entry`` turn services and by ``fire_schedule``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from tasks.app import app
from worker.records.schedules import parse_iso

FIRE_TASK = "tasks.scheduler.fire_schedule"
ENTRY_PREFIX = "agent-schedule:"


def entry_name(schedule_id: str) -> str:
    """The redbeat entry name of a schedule: ``agent-schedule:<schedule_id>``."""
    return ENTRY_PREFIX + schedule_id


def entry_key(schedule_id: str) -> str:
    """Redis key of the schedule's redbeat entry (``redbeat:agent-schedule:<id>``)."""
    from redbeat.schedulers import ensure_conf

    return str(ensure_conf(app).key_prefix) + entry_name(schedule_id)


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
    entry = RedBeatSchedulerEntry(
        name=entry_name(record["schedule_id"]),
        task=FIRE_TASK,
        schedule=_celery_schedule(record),
        args=[record["schedule_id"]],
        options={"queue": "turns"},
        app=app,
        last_run_at=last,
    )
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
