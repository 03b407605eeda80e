"""Background agent job tools: ``job_start``, ``job_status``, ``job_list``, ``job_cancel``.

Present only when the turn supports spawning jobs (``ctx.supports.spawn_jobs``,
``worker.tools.assembly``), has a Redis client and the
``enqueue_turn(request_dict, turn_id) -> turn_id`` service, and is not a
workflow task turn.

``job_cancel`` marks the record ``cancel_requested`` and sets the job turn's
cancel flag (``services.cancel_turn`` when present, which also ends a
still-queued turn at once; else ``TurnStore.request_cancel``); the job turn
stops at its next step boundary and the hook records ``cancelled``.

``job_start`` writes a ``queued`` job record (``worker.records.jobs``) and enqueues
the job's own turn:

    TurnRequest(agent_id=<same agent>, input=<call input>, instructions=<call instructions>,
                model=<parent metadata.job_model, else the parent's model>, toolset="text",
                queue="background", supports={"spawn_jobs": False, "brain": <parent's>},
                metadata={"background_job_id", "parent_turn_id", + carried schedule keys},
                network=<parent's>, egress_allow_hosts=<parent's>,
                idempotency_key="background-job:<job_id>")

``spawn_jobs=False`` means a job cannot start jobs. Ids derive from
``(turn_id, call_id)``, so a re-run of the same call (crash, redelivery)
finds the same job instead of starting a second one. The job's outcome is
recorded by ``tasks.hooks.on_turn_finished`` when its turn ends.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from worker.records.jobs import MAX_ACTIVE_JOBS_PER_AGENT, JobError, JobStore, live_status
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.turn.context import TurnContext

CARRIED_METADATA = ("schedule_model", "job_model", "schedule_depth")
PREVIEW_CHARS = 300


class JobStartParams(BaseModel):
    """Input of ``job_start``."""

    title: str = Field(..., min_length=1, max_length=120, description="Short name of the job, e.g. 'summarize logs'.")
    instructions: str = Field(
        ...,
        min_length=1,
        max_length=20_000,
        description="System instructions for the background agent: its role and how to report.",
    )
    input: str = Field(
        ..., min_length=1, max_length=20_000, description="The task message the background agent receives."
    )


class JobIdParams(BaseModel):
    """Input of ``job_status`` and ``job_cancel``."""

    job_id: str = Field(..., min_length=1, max_length=64, description="The id returned by job_start or job_list.")


class NoParams(BaseModel):
    """Input of tools that take no arguments."""

    pass


def _error(text: str, kind: str) -> ToolResult:
    return ToolResult(content=f"Error: {text}", is_error=True, details={"error": kind})


def create_background_job_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The background job category (empty unless the turn may spawn jobs)."""
    enqueue_turn = ctx.services.enqueue_turn
    if not ctx.supports.spawn_jobs or ctx.workflow_task or ctx.redis is None or enqueue_turn is None:
        return []

    def turn_status(tctx: ToolContext, turn_id: str | None) -> str | None:
        from worker.turn.store import TurnStore

        st = TurnStore(tctx.services.redis_client()).load(turn_id) if turn_id else None
        return st.status.value if st else None

    def view(tctx: ToolContext, rec: dict[str, Any], preview: bool = False) -> dict[str, Any]:
        out = rec.get("output")
        if preview and out and len(out) > PREVIEW_CHARS:
            out = out[:PREVIEW_CHARS] + f"... [{len(rec['output']) - PREVIEW_CHARS} more characters: job_status]"
        return {
            "job_id": rec["job_id"],
            "title": rec["title"],
            "status": live_status(rec, turn_status(tctx, rec.get("turn_id"))),
            "output": out,
            "error": rec.get("error"),
            "created_at": rec["created_at"],
            "finished_at": rec.get("finished_at"),
        }

    def own(tctx: ToolContext, job_id: str) -> dict[str, Any] | None:
        rec = JobStore(tctx.services.redis_client()).get(job_id)
        return rec if rec is not None and rec.get("agent_id") == tctx.agent_id else None

    def start(p: JobStartParams, tctx: ToolContext) -> ToolResult:
        from worker.records.jobs import job_id_for
        from worker.turn.store import TurnStore

        state = TurnStore(tctx.services.redis_client()).load(tctx.turn_id)
        parent = state.request if state is not None else {}
        meta = parent.get("metadata") or {}
        job_id = job_id_for(tctx.turn_id, tctx.call_id)
        job_turn_id = f"{job_id}-turn"
        store = JobStore(tctx.services.redis_client())
        try:
            rec, created = store.create(
                job_id=job_id,
                agent_id=tctx.agent_id,
                title=p.title,
                instructions=p.instructions,
                input=p.input,
                turn_id=job_turn_id,
                parent_turn_id=tctx.turn_id,
            )
        except JobError as exc:
            return _error(str(exc), "limit")
        request = {
            "agent_id": tctx.agent_id,
            "input": p.input,
            "instructions": p.instructions,
            "model": meta.get("job_model") or parent.get("model"),
            "toolset": "text",
            "queue": "background",
            "supports": {"spawn_jobs": False, "brain": bool((parent.get("supports") or {}).get("brain", False))},
            "metadata": {
                "background_job_id": job_id,
                "parent_turn_id": tctx.turn_id,
                **{k: meta[k] for k in CARRIED_METADATA if k in meta},
            },
            "idempotency_key": f"background-job:{job_id}",
            # A job's commands get its parent turn's network, never more.
            "network": parent.get("network", "none"),
            "egress_allow_hosts": parent.get("egress_allow_hosts"),
        }
        try:
            enqueue_turn(request, job_turn_id)
        except Exception as exc:
            if created:
                store.remove(job_id)
            return _error(f"could not start the job: {exc.__class__.__name__}: {exc}", "enqueue_failed")
        return ToolResult(
            content={
                "job_id": job_id,
                "status": rec["status"],
                "title": p.title,
                "note": "The job runs in the background; check it later with job_status.",
            },
            details={"job_id": job_id, "turn_id": job_turn_id, "created": created},
        )

    def status(p: JobIdParams, tctx: ToolContext) -> ToolResult:
        rec = own(tctx, p.job_id)
        if rec is None:
            return _error(f"no background job {p.job_id!r} for this agent; call job_list to see the ids.", "not_found")
        v = view(tctx, rec)
        return ToolResult(content=v, details={"job_id": p.job_id, "status": v["status"]})

    def list_(p: NoParams, tctx: ToolContext) -> ToolResult:
        store = JobStore(tctx.services.redis_client())
        rows = [view(tctx, r, preview=True) for r in store.list(tctx.agent_id)]
        return ToolResult(
            content={
                "jobs": rows,
                "unfinished": store.active_count(tctx.agent_id),
                "max_unfinished": MAX_ACTIVE_JOBS_PER_AGENT,
            },
            details={"count": len(rows)},
        )

    def cancel(p: JobIdParams, tctx: ToolContext) -> ToolResult:
        from worker.turn.store import TurnStore

        rec = own(tctx, p.job_id)
        if rec is None:
            return _error(f"no background job {p.job_id!r} for this agent; call job_list to see the ids.", "not_found")
        new = JobStore(tctx.services.redis_client()).request_cancel(p.job_id)
        if new is None:
            return ToolResult(
                content=f"Job {p.job_id} ('{rec['title']}') already finished with status "
                f"{rec['status']}; nothing to cancel.",
                details={"outcome": "already_finished"},
            )
        cancel_turn = tctx.services.cancel_turn
        if cancel_turn is not None:  # flag + event, and a still-queued turn ends at once
            cancel_turn(rec["turn_id"])
        else:
            TurnStore(tctx.services.redis_client()).request_cancel(rec["turn_id"], by="job_cancel")
        return ToolResult(
            content={
                "job_id": p.job_id,
                "status": "cancel_requested",
                "note": "The job stops at its next step boundary; its running tools see the abort.",
            },
            details={"outcome": "cancel_requested"},
        )

    return [
        define_worker_tool(
            name="job_start",
            description=(
                "Start a background agent job: a separate agent with its own instructions works on 'input' "
                "while you continue. It cannot start jobs itself. Read its result later with job_status. "
                f"At most {MAX_ACTIVE_JOBS_PER_AGENT} unfinished jobs."
            ),
            input_model=JobStartParams,
            execute=start,
            execution_mode="sequential",
            describe_activity=lambda p: f"Starting background job '{p.title}'",
            describe_completed_activity=lambda p, r: (
                f"Could not start job '{p.title}'" if r.is_error else f"Started background job '{p.title}'"
            ),
        ),
        define_worker_tool(
            name="job_status",
            description="Status and output of one of your background jobs.",
            input_model=JobIdParams,
            execute=status,
            is_read_only=True,
            describe_activity=lambda p: f"Checking background job {p.job_id}",
        ),
        define_worker_tool(
            name="job_list",
            description="List your background jobs, newest first, with status and an output preview.",
            input_model=NoParams,
            execute=list_,
            is_read_only=True,
            describe_activity=lambda p: "Listing background jobs",
        ),
        define_worker_tool(
            name="job_cancel",
            description="Cancel one of your unfinished background jobs.",
            input_model=JobIdParams,
            execute=cancel,
            execution_mode="sequential",
            describe_activity=lambda p: f"Cancelling background job {p.job_id}",
        ),
    ]
