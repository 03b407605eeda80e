"""Schedule tools: ``schedule_create``, ``schedule_list``, ``schedule_cancel``.

A schedule enqueues a future turn for the agent: once at a time, or
recurring by cron (UTC). Records live in Redis (``worker.records.schedules``); the
firing entry (celery-redbeat) is saved and deleted through two services the
queue layer provides, so this module never imports Celery:

- ``services.save_schedule_entry(record) -> None``
- ``services.delete_schedule_entry(schedule_id) -> None``

The category is absent when the turn has no Redis client or lacks either
service, or in a workflow task turn (a task's catalog is fixed and has no
schedule tools, ``worker.tools.assembly``).

The scheduled turn's request (stored in the record): same ``agent_id``;
``input`` from the call; ``instructions`` = the creating turn's instructions,
a note naming the schedule, and the call's optional ``instructions``;
``model`` = the creating turn's ``metadata.schedule_model`` if set, else its
model; ``toolset="text"``; ``queue="turns"``; the creating turn's
``supports``; ``metadata`` = ``{"schedule_id", "schedule_depth"}`` plus the
creating turn's ``schedule_model``/``job_model`` keys.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from worker.records.schedules import (
    MAX_ACTIVE_PER_AGENT,
    MAX_CHAIN_DEPTH,
    ScheduleError,
    ScheduleStore,
    describe_when,
    iso,
    new_record,
    normalize_cron,
    parse_run_at,
    schedule_id_for,
    utcnow,
)
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.turn.context import TurnContext

CARRIED_METADATA = ("schedule_model", "job_model")


class ScheduleCreateParams(BaseModel):
    """Input of ``schedule_create``: give exactly one of ``at`` and ``cron``."""

    title: str = Field(
        ..., min_length=1, max_length=120, description="Short name of the schedule, e.g. 'daily report'."
    )
    input: str = Field(
        ...,
        min_length=1,
        max_length=20_000,
        description="The message your future turn will receive, e.g. 'Write the daily report.'",
    )
    instructions: str | None = Field(
        None, max_length=20_000, description="Extra instructions for the future turn (optional)."
    )
    at: str | None = Field(
        None,
        max_length=100,
        description="One-off time: ISO 8601 with timezone ('2026-03-01T09:00:00+01:00', "
        "'...Z') or 'in N minutes' / 'in N seconds'.",
    )
    cron: str | None = Field(
        None, max_length=100, description="Recurring: 5-field cron expression in UTC, e.g. '0 9 * * 1-5'."
    )


class ScheduleListParams(BaseModel):
    """Input of ``schedule_list``."""

    include_finished: bool = Field(False, description="Also list done and cancelled schedules.")


class ScheduleCancelParams(BaseModel):
    """Input of ``schedule_cancel``."""

    schedule_id: str = Field(
        ..., min_length=1, max_length=64, description="The id from schedule_create or schedule_list."
    )


def _when_label(p: ScheduleCreateParams) -> str:
    if p.cron:
        return f"cron '{p.cron}' (UTC)"
    try:
        return str(iso(parse_run_at(p.at or "")))
    except ScheduleError:
        return str(p.at)


def _error(text: str, kind: str) -> ToolResult:
    return ToolResult(content=f"Error: {text}", is_error=True, details={"error": kind})


def _parent_request(ctx: ToolContext) -> dict[str, Any]:
    from worker.turn.store import TurnStore

    state = TurnStore(ctx.services.redis_client()).load(ctx.turn_id)
    return state.request if state is not None else {}


def _public(rec: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "schedule_id",
        "title",
        "kind",
        "run_at",
        "cron",
        "status",
        "next_run",
        "last_run",
        "last_turn_id",
        "runs",
        "created_at",
    )
    out = {k: rec.get(k) for k in keys}
    out["input"] = rec["request"].get("input")
    return out


def create_schedule_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The schedule category for a turn (empty when its prerequisites are absent)."""
    if ctx.workflow_task or ctx.redis is None:
        return []
    save_entry, delete_entry = ctx.services.save_schedule_entry, ctx.services.delete_schedule_entry
    if save_entry is None or delete_entry is None:
        return []

    def create(p: ScheduleCreateParams, tctx: ToolContext) -> ToolResult:
        if bool(p.at) == bool(p.cron):
            return _error("give exactly one of 'at' (a one-off time) or 'cron' (a recurring schedule).", "bad_request")
        now = utcnow()
        try:
            run_at = parse_run_at(p.at, now) if p.at else None
            cron = normalize_cron(p.cron) if p.cron else None
        except ScheduleError as exc:
            return _error(str(exc), "invalid_cron" if p.cron else "invalid_time")
        parent = _parent_request(tctx)
        meta = parent.get("metadata") or {}
        depth = int(meta.get("schedule_depth", -1)) + 1
        if depth > MAX_CHAIN_DEPTH:
            return _error(
                f"this turn was started by a chain of {depth} schedules, each created by the turn the "
                f"previous one started; the limit is {MAX_CHAIN_DEPTH}. Do not schedule again from here.",
                "chain_depth",
            )
        sid = schedule_id_for(tctx.turn_id, tctx.call_id)
        when = f"due {iso(run_at)}" if run_at else f"recurring by cron '{cron}' (UTC)"
        note = f"This turn was started by your schedule '{p.title}' ({sid}), {when}."
        instructions = "\n\n".join(x for x in (parent.get("instructions"), note, p.instructions) if x)
        request = {
            "agent_id": tctx.agent_id,
            "input": p.input,
            "instructions": instructions,
            "model": meta.get("schedule_model") or parent.get("model"),
            "toolset": "text",
            "queue": "turns",
            "supports": parent.get("supports") or {},
            "metadata": {
                "schedule_id": sid,
                "schedule_depth": depth,
                **{k: meta[k] for k in CARRIED_METADATA if k in meta},
            },
        }
        store = ScheduleStore(tctx.services.redis_client())
        try:
            outcome = store.create(
                new_record(
                    schedule_id=sid,
                    agent_id=tctx.agent_id,
                    title=p.title,
                    request=request,
                    run_at=run_at,
                    cron=cron,
                    created_by_turn=tctx.turn_id,
                    depth=depth,
                    now=now,
                )
            )
        except ScheduleError as exc:
            return _error(str(exc), "limit")
        rec = outcome.record
        try:
            save_entry(rec)
        except Exception as exc:  # the record must not stay active without a firing entry
            reason = str(exc)[:300]
            store.update(sid, lambda r: {"status": "cancelled", "next_run": None, "error": reason})
            return _error(
                f"the scheduler could not store the schedule: {exc.__class__.__name__}: {exc}", "scheduler_unavailable"
            )
        return ToolResult(
            content={
                "schedule_id": sid,
                "status": rec["status"],
                "kind": rec["kind"],
                "when": describe_when(rec),
                "next_run": rec["next_run"],
                "active_schedules": store.active_count(tctx.agent_id),
                "max_active": MAX_ACTIVE_PER_AGENT,
            },
            details={"schedule_id": sid, "created": outcome.created, "next_run": rec["next_run"]},
        )

    def list_(p: ScheduleListParams, tctx: ToolContext) -> ToolResult:
        from worker.turn.store import TurnStore

        store = ScheduleStore(tctx.services.redis_client())
        turns = TurnStore(tctx.services.redis_client())
        rows = []
        for rec in store.list(tctx.agent_id):
            if rec["status"] != "active" and not p.include_finished:
                continue
            row = _public(rec)
            if rec.get("last_turn_id"):
                st = turns.load(rec["last_turn_id"])
                row["last_turn_status"] = st.status.value if st else None
            rows.append(row)
        return ToolResult(
            content={
                "schedules": rows,
                "active": store.active_count(tctx.agent_id),
                "max_active": MAX_ACTIVE_PER_AGENT,
            },
            details={"count": len(rows)},
        )

    def cancel(p: ScheduleCancelParams, tctx: ToolContext) -> ToolResult:
        store = ScheduleStore(tctx.services.redis_client())
        rec, outcome = store.cancel(p.schedule_id, tctx.agent_id)
        if outcome == "not_found":
            return _error(
                f"no schedule {p.schedule_id!r} for this agent; call schedule_list to see the ids.", "not_found"
            )
        delete_entry(p.schedule_id)  # idempotent; also cleans up after a done one-off
        if rec is None:  # deleted between the cancel's reads
            return _error(f"no schedule {p.schedule_id!r} for this agent any more.", "not_found")
        if outcome != "cancelled":
            return ToolResult(
                content=f"Schedule {p.schedule_id} ('{rec['title']}') was already {rec['status']}; nothing to cancel.",
                details={"outcome": outcome},
            )
        return ToolResult(
            content={"schedule_id": p.schedule_id, "status": "cancelled", "title": rec["title"]},
            details={"outcome": outcome},
        )

    return [
        define_worker_tool(
            name="schedule_create",
            description=(
                "Schedule a future turn for yourself: once at a time ('at': ISO 8601 with timezone, or "
                "'in N minutes'/'in N seconds'), or recurring ('cron': 5 fields, UTC). At the time, you get a new "
                f"turn with 'input' as the message. At most {MAX_ACTIVE_PER_AGENT} active schedules per agent."
            ),
            input_model=ScheduleCreateParams,
            execute=create,
            execution_mode="sequential",
            describe_activity=lambda p: f"Scheduling '{p.title}' for {_when_label(p)}",
            describe_completed_activity=lambda p, r: (
                f"Could not schedule '{p.title}'" if r.is_error else f"Scheduled '{p.title}' for {r.content['when']}"
            ),
        ),
        define_worker_tool(
            name="schedule_list",
            description="List your schedules (active ones; include_finished adds done and cancelled ones), "
            "with next run, last run and the last turn they started.",
            input_model=ScheduleListParams,
            execute=list_,
            is_read_only=True,
            describe_activity=lambda p: "Listing schedules",
            describe_completed_activity=lambda p, r: f"Listed {r.details.get('count', 0)} schedules",
        ),
        define_worker_tool(
            name="schedule_cancel",
            description="Cancel one of your schedules by id; it will not start any more turns.",
            input_model=ScheduleCancelParams,
            execute=cancel,
            execution_mode="sequential",
            describe_activity=lambda p: f"Cancelling schedule {p.schedule_id}",
        ),
    ]
