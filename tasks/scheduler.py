"""The Celery side of schedules: redbeat entries and the ``fire_schedule`` task.

Mechanism (chosen: celery beat + celery-redbeat, rather than an own ZSET poller):

- Each active schedule has one ``RedBeatSchedulerEntry`` named
  ``agent-schedule:<schedule_id>`` (Redis key ``redbeat:agent-schedule:<id>``,
  definition stored as JSON by redbeat's encoder; never pickle). A one-off
  is ``redbeat.schedules.rrule("SECONDLY", dtstart=run_at, count=1)``; a
  recurring schedule is a Celery ``crontab`` built from the 5 validated cron
  fields (app timezone UTC). The entry's only argument is the schedule id.
- ``celery -A tasks.app beat -S tasks.beat:ResilientRedBeatScheduler`` reads due entries
  from the ``redbeat::schedule`` sorted set on every tick (at most
  ``beat_max_loop_interval`` = 5 s apart, so a schedule fires within ~5 s of
  its time) and sends ``tasks.scheduler.fire_schedule(schedule_id)`` to the
  ``turns`` queue. redbeat holds a Redis lock, so a second beat replica
  stands by instead of firing twice.
- ``fire_schedule`` re-reads the record (``worker.records.schedules``), drops the
  firing unless the schedule is still ``active``, enqueues a real turn with
  the stored request through ``TurnEngine.enqueue_turn`` (idempotency key
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

Beat process: ``celery -A tasks.app beat -S tasks.beat:ResilientRedBeatScheduler -l INFO``
(``beat_scheduler`` is also set in the app config). Tests run it with
``--max-interval 1``.
"""

from __future__ import annotations

import logging
from typing import Any

from tasks.app import app
from tasks.runtime import get_engine
from tasks.schedule_entries import FIRE_TASK, delete_schedule_entry
from worker.records.schedules import ScheduleStore, cron_next, cron_slot, iso, utcnow

log = logging.getLogger("agent.scheduler")


@app.task(name=FIRE_TASK, acks_late=True)
def fire_schedule(schedule_id: str) -> dict[str, Any]:
    """Enqueue the schedule's turn if it is still active. Returns ``{"action", ...}`` for logs.

    Actions: ``fired`` (with ``turn_id``), ``dropped`` (unknown or no longer
    active), ``failed`` (the stored request was refused; a one-off becomes
    ``failed``, a recurring schedule keeps going and records ``last_error``).
    """
    engine = get_engine()
    store = ScheduleStore(engine.redis)
    rec = store.get(schedule_id)
    if rec is None or rec["status"] != "active":
        delete_schedule_entry(schedule_id)
        return {"action": "dropped", "status": rec and rec["status"]}
    now = utcnow()
    once = rec["kind"] == "once"
    slot = "once" if once else iso(cron_slot(rec["cron"], now))
    request = {**rec["request"], "idempotency_key": f"schedule:{schedule_id}:{slot}"}
    try:
        turn_id = engine.enqueue_turn(request)
    except Exception as exc:  # pydantic ValidationError for a request that no longer validates
        log.exception("schedule %s: cannot enqueue its turn", schedule_id)
        error = f"{exc.__class__.__name__}: {str(exc)[:300]}"
        store.update(
            schedule_id,
            lambda r: (
                {"status": "failed", "next_run": None, "last_error": error}
                if once
                else {"last_error": error, "next_run": iso(cron_next(r["cron"], now))}
            ),
        )
        if once:
            delete_schedule_entry(schedule_id)
        return {"action": "failed", "error": error}

    def change(r: dict[str, Any]) -> dict[str, Any] | None:
        if r["status"] != "active":
            return None
        fields: dict[str, Any] = {
            "last_run": iso(now),
            "last_turn_id": turn_id,
            "runs": int(r.get("runs", 0)) + (r.get("last_turn_id") != turn_id),
        }
        if once:
            fields.update(status="done", next_run=None)
        else:
            fields["next_run"] = iso(cron_next(r["cron"], now))
        return fields

    store.update(schedule_id, change)
    engine.store.event(turn_id, "scheduled_by", schedule_id=schedule_id, slot=slot)
    if once:
        delete_schedule_entry(schedule_id)
    return {"action": "fired", "turn_id": turn_id, "slot": slot}
