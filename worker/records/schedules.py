"""Schedule records: future turns of an agent, kept in Redis (plain Python, no Celery).

A schedule enqueues a future turn for the agent that created it: once at a
time (``kind="once"``), or recurring by a 5-field cron expression
(``kind="cron"``, evaluated in UTC). The record is the source of truth for
what runs and whether it still may; the firing mechanism (a celery-redbeat
entry, see ``tasks.scheduler``) only says *when* to look at it, and the fire
task re-checks ``status == "active"`` first, so a cancelled schedule never
runs even if its entry fires in the same second.

Keys (orjson values, never pickle):

- ``schedule:<id>``: the record (JSON object, fields below).
- ``agent:<agent_id>:schedules``: sorted set of the agent's schedule ids,
  scored by creation time (epoch seconds): listing.
- ``agent:<agent_id>:schedules:active``: set of the agent's active ids: the cap.

Record fields: ``schedule_id``, ``agent_id``, ``title``, ``kind``
(``once`` | ``cron``), ``run_at`` (ISO 8601 UTC, one-off) or ``cron``
(expression), ``request`` (the stored ``TurnRequest`` as JSON: input,
instructions, model, supports, metadata), ``status`` (``active`` | ``done`` |
``cancelled``), ``next_run`` / ``last_run`` (ISO 8601 UTC or ``null``),
``last_turn_id``, ``runs`` (count), ``created_at`` (ISO 8601 UTC),
``created_by_turn``, ``depth`` (scheduling chain depth, see below).

Limits (this module's rules, documented in the tool descriptions):

- ``MAX_ACTIVE_PER_AGENT = 20`` active schedules per agent; creating one more
  is refused until one is cancelled or done. This bounds what a scheduled
  turn (which has the schedule tools too) can pile up.
- ``MAX_CHAIN_DEPTH = 10``: a turn fired by a schedule carries
  ``metadata.schedule_depth``; a schedule it creates has depth + 1 and is
  refused beyond the cap, so a self-rescheduling chain of one-offs ("remind
  me again in 1 second", forever) stops after ten links.
- One-off times must be in the future (``PAST_TOLERANCE_S = 5`` s of clock
  slack) and at most ``MAX_HORIZON_DAYS = 366`` days ahead.
- Cron: exactly 5 fields (minute hour day-of-month month day-of-week) or an
  alias (``@hourly``, ``@daily``, ``@weekly``, ``@monthly``, ``@yearly``);
  validated with ``croniter``; croniter-only syntax (``L``, ``#``, ``?``,
  seconds field) and expressions restricting both day-of-month and
  day-of-week are refused because the firing scheduler (Celery ``crontab``)
  would read them differently (cron ORs the two day fields; Celery ANDs them).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import redis

from worker.errors import AgentRuntimeError
from worker.records.agent_records import AT_CAP, EXISTED, AgentRecords

MAX_ACTIVE_PER_AGENT = 20
MAX_CHAIN_DEPTH = 10
PAST_TOLERANCE_S = 5.0
MAX_HORIZON_DAYS = 366
CRON_ALIASES = {
    "@hourly": "0 * * * *",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@weekly": "0 0 * * 0",
    "@monthly": "0 0 1 * *",
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
}
_RELATIVE = re.compile(
    r"^\s*in\s+(\d+(?:\.\d+)?)\s*(s|secs?|seconds?|m|mins?|minutes?|h|hrs?|hours?)\s*$", re.IGNORECASE
)
_CRON_NUMERIC = re.compile(r"^[0-9*/,\-]+$")  # minute, hour, day-of-month
_CRON_NAMED = re.compile(r"^(?:[0-9*/,\-]|[A-Za-z]{3})+$")  # month, day-of-week: also 'jan', 'mon-fri'


class ScheduleError(AgentRuntimeError, ValueError):
    """A schedule request that cannot be honoured; the message is shown to the model as is."""


def utcnow() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def iso(dt: datetime | None) -> str | None:
    """ISO 8601 in UTC with seconds precision and a ``Z`` suffix, e.g. ``2026-03-01T09:00:00Z``."""
    if dt is None:
        return None
    return dt.astimezone(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def parse_iso(value: str | None) -> datetime | None:
    """An ISO 8601 string (``Z`` allowed) as an aware datetime; None for None or ""."""
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


# ----- parsing the model's input --------------------------------------------
def parse_run_at(text: str, now: datetime | None = None) -> datetime:
    """Parse a one-off time: ISO 8601 with a timezone (``2026-03-01T09:00:00+01:00``, ``...Z``)
    or ``"in N seconds|minutes|hours"``. Returns an aware UTC datetime.

    Raises ``ScheduleError`` for a naive or malformed time, a time more than
    ``PAST_TOLERANCE_S`` seconds in the past, or beyond ``MAX_HORIZON_DAYS``.
    """
    now = now or utcnow()
    raw = (text or "").strip()
    m = _RELATIVE.match(raw)
    if m:
        amount, unit = float(m.group(1)), m.group(2).lower()
        seconds = amount * (3600 if unit.startswith("h") else 60 if unit.startswith("m") else 1)
        if seconds <= 0:
            raise ScheduleError(f"'{raw}' is not in the future: use at least 'in 1 second'.")
        at = now + timedelta(seconds=seconds)
    else:
        try:
            at = datetime.fromisoformat(raw.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise ScheduleError(
                f"cannot read the time {raw!r}: give ISO 8601 with a timezone, e.g. "
                f"'2026-03-01T09:00:00+01:00' or '2026-03-01T08:00:00Z', or 'in N minutes' / 'in N seconds'."
            ) from None
        if at.tzinfo is None or at.utcoffset() is None:
            raise ScheduleError(f"the time {raw!r} has no timezone: add an offset such as '+01:00' or 'Z' (UTC).")
        at = at.astimezone(timezone.utc)
    if at < now - timedelta(seconds=PAST_TOLERANCE_S):
        raise ScheduleError(f"the time {iso(at)} is in the past (now is {iso(now)}): pick a future time.")
    if at > now + timedelta(days=MAX_HORIZON_DAYS):
        raise ScheduleError(f"the time {iso(at)} is more than {MAX_HORIZON_DAYS} days ahead.")
    return max(at, now)


def normalize_cron(expr: str) -> str:
    """Validate a cron expression and return its 5-field form (aliases expanded).

    Raises ``ScheduleError`` naming the problem and showing the expected shape.
    """
    from croniter import croniter

    raw = " ".join((expr or "").split())
    fields_text = CRON_ALIASES.get(raw.lower(), raw)
    shape = (
        "Use 5 fields 'minute hour day-of-month month day-of-week' (UTC), e.g. '0 9 * * 1-5' "
        "for 09:00 on weekdays or '*/15 * * * *' for every 15 minutes."
    )
    fields = fields_text.split(" ")
    if len(fields) != 5:
        raise ScheduleError(f"invalid cron expression {raw!r}: it has {len(fields)} fields, expected 5. {shape}")
    if not (all(_CRON_NUMERIC.match(f) for f in fields[:3]) and all(_CRON_NAMED.match(f) for f in fields[3:])):
        raise ScheduleError(
            f"invalid cron expression {raw!r}: only digits, '*', '/', ',' and '-' (plus 3-letter month and day names) are supported "
            f"(no 'L', '#' or '?'). {shape}"
        )
    try:
        croniter(fields_text, utcnow())
    except Exception as exc:  # croniter's CroniterBadCronError and friends are ValueErrors
        raise ScheduleError(f"invalid cron expression {raw!r}: {exc}. {shape}") from None
    if fields[2] != "*" and fields[4] != "*":
        raise ScheduleError(
            f"invalid cron expression {raw!r}: restrict either day-of-month or day-of-week, not both "
            "(cron and the scheduler combine them differently). Create two schedules instead."
        )
    return fields_text


def cron_next(expr: str, after: datetime | None = None) -> datetime:
    """Next run of a validated 5-field expression after ``after`` (default now), in UTC."""
    from croniter import croniter

    return croniter(expr, (after or utcnow()).astimezone(timezone.utc)).get_next(datetime).astimezone(timezone.utc)


def cron_slot(expr: str, at: datetime | None = None) -> datetime:
    """The cron time a firing at ``at`` belongs to: the latest run time <= ``at`` (+1 s of slack)."""
    from croniter import croniter

    ref = (at or utcnow()).astimezone(timezone.utc) + timedelta(seconds=1)
    return croniter(expr, ref).get_prev(datetime).astimezone(timezone.utc)


# ----- the store ------------------------------------------------------------
def schedule_key(schedule_id: str) -> str:
    """Redis key of a schedule record: ``schedule:<id>``."""
    return f"schedule:{schedule_id}"


def schedule_id_for(turn_id: str, call_id: str) -> str:
    """Deterministic id for the schedule created by one call: a re-run of the call finds the same record."""
    return "sch_" + hashlib.sha1(f"{turn_id}:{call_id}".encode()).hexdigest()[:16]


@dataclass
class CreateOutcome:
    """Result of ``ScheduleStore.create``: the record, and whether this call created it."""

    record: dict[str, Any]
    created: bool  # False when the same call had already created it


class ScheduleStore:
    """Schedule records over a ``redis.Redis`` client (``worker.records.agent_records`` holds the keys and the cap)."""

    def __init__(self, client: redis.Redis):
        self.r = client
        self._records = AgentRecords(client, "schedule", lambda rec: rec["status"] == "active")

    def get(self, schedule_id: str) -> dict[str, Any] | None:
        """The schedule record, or None."""
        return self._records.get(schedule_id)

    def list(self, agent_id: str, limit: int = 100) -> list[dict[str, Any]]:
        """The agent's schedules, newest first (at most ``limit``)."""
        return self._records.list(agent_id, limit)

    def active_count(self, agent_id: str) -> int:
        """How many of the agent's schedules are active (the cap is ``MAX_ACTIVE_PER_AGENT``)."""
        return self._records.active_count(agent_id)

    def create(self, record: dict[str, Any], cap: int = MAX_ACTIVE_PER_AGENT) -> CreateOutcome:
        """Store a new active record atomically with the per-agent cap.

        Raises ``ScheduleError`` when the agent already has ``cap`` active schedules.
        """
        res = self._records.create(record["schedule_id"], record["agent_id"], record, cap)
        if res == EXISTED:
            return CreateOutcome(self.get(record["schedule_id"]) or record, False)
        if res == AT_CAP:
            raise ScheduleError(
                f"this agent already has {cap} active schedules (the maximum): cancel one with schedule_cancel "
                "before creating another."
            )
        return CreateOutcome(record, True)

    def update(
        self, schedule_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply ``change(record) -> fields`` atomically (WATCH/MULTI); keeps the active set in step
        with ``status``. Returns the new record, or None if there is none or ``change`` returned None.
        """
        return self._records.update(schedule_id, change)

    def cancel(self, schedule_id: str, agent_id: str) -> tuple[dict[str, Any] | None, str]:
        """Cancel an active schedule of ``agent_id``. Returns ``(record, outcome)`` with outcome
        ``cancelled`` | ``not_found`` (unknown, or another agent's) | ``already_<status>``."""
        rec = self.get(schedule_id)
        if rec is None or rec.get("agent_id") != agent_id:
            return None, "not_found"
        if rec["status"] != "active":
            return rec, f"already_{rec['status']}"
        new = self.update(
            schedule_id,
            lambda r: (
                {"status": "cancelled", "next_run": None, "cancelled_at": iso(utcnow())}
                if r["status"] == "active"
                else None
            ),
        )
        if new is None:
            return self.get(schedule_id), f"already_{(self.get(schedule_id) or {}).get('status', 'gone')}"
        return new, "cancelled"


def new_record(
    *,
    schedule_id: str | None,
    agent_id: str,
    title: str,
    request: dict[str, Any],
    run_at: datetime | None = None,
    cron: str | None = None,
    created_by_turn: str | None = None,
    depth: int = 0,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Build an active record (exactly one of ``run_at`` / ``cron``, both already validated)."""
    now = now or utcnow()
    if (run_at is None) == (cron is None):
        raise ScheduleError("give exactly one of 'at' (a one-off time) or 'cron' (a recurring schedule).")
    return {
        "schedule_id": schedule_id or "sch_" + uuid.uuid4().hex[:16],
        "agent_id": agent_id,
        "title": title,
        "kind": "once" if run_at is not None else "cron",
        "run_at": iso(run_at),
        "cron": cron,
        "request": request,
        "status": "active",
        "next_run": iso(run_at) if run_at is not None else iso(cron_next(cron, now)),  # type: ignore[arg-type]
        "last_run": None,
        "last_turn_id": None,
        "runs": 0,
        "created_at": iso(now),
        "created_by_turn": created_by_turn,
        "depth": depth,
    }


def describe_when(record: dict[str, Any]) -> str:
    """``"2026-03-01T09:00:00Z"`` for a one-off, ``"cron '0 9 * * 1-5' (UTC)"`` for a recurring schedule."""
    return record["run_at"] if record["kind"] == "once" else f"cron '{record['cron']}' (UTC)"
