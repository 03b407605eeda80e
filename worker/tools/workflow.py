"""Main-turn workflow tools: ``workflow_start``, ``workflow_show``, ``workflow_list``, ``workflow_cancel``.

The four main-turn operations (start, show, list, cancel); they are not included in
workflow task turns (docs/architecture.md, "Workflow tasks"). ``create_workflow_tools(ctx)`` returns ``[]`` in a
workflow task turn or without Redis; ``workflow_start`` is left out when the
turn has no ``enqueue_turn`` service (a missing service means the capability
is absent, ``worker.turn.context``).

A task started here belongs to the turn's agent. Its turns use the model in
the main turn's ``metadata.workflow_model`` when set (the control plane's
choice), else the worker's default model. Starting does not wait: the result
tells the model the task id, and a later ``workflow_show`` (in this turn or a
later one) reads the status, attempts and result. ``workflow_start`` is
idempotent per call: the task id is derived from the turn and ``call_id``. The task records the
main turn's approval policy, and each attempt's turn runs under it (a task turn's catalog has no
computer tools today; the policy still holds for any tool that asks for approval).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, Field

from worker.records.result_schema import WorkflowError
from worker.records.workflow import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_TITLE_CHARS,
    WorkflowService,
    WorkflowTask,
    start_task_id,
)
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.turn.approval_policy import inherited_approval
from worker.turn.context import TurnContext

LIST_LIMIT = 50


class StartParams(BaseModel):
    """Input of ``workflow_start``."""

    title: str = Field(..., min_length=1, max_length=MAX_TITLE_CHARS, description="Short name of the task.")
    instructions: str = Field(
        ...,
        min_length=1,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="The question or instructions; the task sees nothing else.",
    )
    result_schema: dict[str, Any] = Field(
        ...,
        description="JSON Schema of the result the task must submit, e.g. "
        '{"type":"object","properties":{"answer":{"type":"string"}},"required":["answer"]}.',
    )
    use_brain: bool = Field(False, description="Let the task search and read the agent's Brain pages.")


class TaskIdParams(BaseModel):
    """Input of ``workflow_cancel``."""

    task_id: str = Field(..., min_length=1, max_length=100, description="The workflow task id (wf_...).")


class ShowParams(BaseModel):
    """Input of ``workflow_show``."""

    task_id: str | None = Field(
        None,
        min_length=1,
        max_length=100,
        description="The workflow task id (wf_...); omit for the agent's latest task.",
    )


class NoParams(BaseModel):
    """``workflow_list`` takes no parameters."""


def _json(data: object) -> str:
    return orjson.dumps(data).decode()


def _error(message: str) -> ToolResult:
    return ToolResult(content=f"Error: {message}", is_error=True, details={"error": message})


def _service(ctx: ToolContext) -> WorkflowService:
    return WorkflowService(
        ctx.services.redis_client(), enqueue_turn=ctx.services.enqueue_turn, cancel_turn=ctx.services.cancel_turn
    )


def _owned(svc: WorkflowService, task_id: str, agent_id: str) -> WorkflowTask:
    task = svc.show(task_id)
    if task.agent_id != agent_id:  # another agent's task is as good as unknown
        raise WorkflowError(f"unknown workflow task {task_id!r}")
    return task


def _parent_approval(ctx: ToolContext) -> dict[str, Any]:
    """The starting turn's approval policy, for every attempt of the task (never a weaker one)."""
    from worker.turn.store import TurnStore

    state = TurnStore(ctx.services.redis_client()).load(ctx.turn_id)
    return inherited_approval(state.request if state is not None else {}, ctx.services.settings)


def _start(params: StartParams, ctx: ToolContext) -> ToolResult:
    meta = ctx.metadata
    try:
        task, created = _service(ctx).start(
            agent_id=ctx.agent_id,
            title=params.title,
            instructions=params.instructions,
            result_schema=params.result_schema,
            use_brain=params.use_brain,
            model=meta.get("workflow_model"),
            task_id=start_task_id(ctx.turn_id, ctx.call_id),
            origin=f"turn:{ctx.turn_id}",
            approval=_parent_approval(ctx),
        )
    except WorkflowError as exc:
        return _error(str(exc))
    body = {
        "task_id": task.task_id,
        "title": task.title,
        "status": task.status,
        "created": created,
        "note": f"The task runs on its own. Call workflow_show with task_id={task.task_id!r} for its "
        "status and result.",
    }
    if task.strict_note:
        body["strict_note"] = task.strict_note
    return ToolResult(content=_json(body), details={"task_id": task.task_id, "created": created, "status": task.status})


def _show(params: ShowParams, ctx: ToolContext) -> ToolResult:
    svc = _service(ctx)
    try:
        if params.task_id is None:
            tasks = svc.list(ctx.agent_id, limit=1)
            if not tasks:
                return _error("this agent has no workflow tasks")
            task = tasks[0]
        else:
            task = _owned(svc, params.task_id, ctx.agent_id)
    except WorkflowError as exc:
        return _error(str(exc))
    return ToolResult(
        content=_json(task.view(with_schema=True)), details={"task_id": task.task_id, "status": task.status}
    )


def _list(params: NoParams, ctx: ToolContext) -> ToolResult:
    tasks = _service(ctx).list(ctx.agent_id, limit=LIST_LIMIT)
    rows = [
        {
            "task_id": t.task_id,
            "title": t.title,
            "status": t.status,
            "attempts": len(t.attempts),
            **({"error": t.error} if t.error else {}),
        }
        for t in tasks
    ]
    return ToolResult(content=_json({"tasks": rows, "count": len(rows)}), details={"count": len(rows)})


def _cancel(params: TaskIdParams, ctx: ToolContext) -> ToolResult:
    svc = _service(ctx)
    try:
        _owned(svc, params.task_id, ctx.agent_id)
        task = svc.cancel(params.task_id, reason=f"cancelled from turn {ctx.turn_id}")
    except WorkflowError as exc:
        return _error(str(exc))
    return ToolResult(
        content=_json({"task_id": task.task_id, "status": task.status}),
        details={"task_id": task.task_id, "status": task.status},
    )


def create_workflow_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The four main-turn workflow tools (``workflow_start`` only with an ``enqueue_turn`` service).

    ``[]`` in a workflow task turn (``ctx.workflow_task``) or when the turn has no Redis client.
    """
    if ctx.workflow_task or ctx.redis is None:
        return []
    tools: list[WorkerTool[Any]] = []
    if ctx.services.enqueue_turn is not None:
        tools.append(
            define_worker_tool(
                name="workflow_start",
                description=(
                    "Start a workflow task: an isolated unit of work that answers a question or follows "
                    "instructions on its own (with web and, if asked, Brain tools) and must submit a result "
                    "matching result_schema. Returns the task id at once; the task runs in the background. "
                    "Read its status and result later with workflow_show."
                ),
                input_model=StartParams,
                execute=_start,
                execution_mode="sequential",
                describe_activity=lambda p: f"Starting workflow task '{p.title}'",
                describe_completed_activity=lambda p, r: (
                    f"Started workflow task '{p.title}' (id {r.details['task_id']})"
                    if not r.is_error
                    else f"Could not start workflow task '{p.title}'"
                ),
            )
        )
    tools += [
        define_worker_tool(
            name="workflow_show",
            description=(
                "Show one workflow task: status (queued, running, succeeded, failed, cancelled), "
                "attempts, the result once it succeeded or the failure reason."
            ),
            input_model=ShowParams,
            execute=_show,
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=lambda p: f"Showing workflow task {p.task_id or '(latest)'}",
            describe_completed_activity=lambda p, r: (
                f"Workflow task {r.details['task_id']} is {r.details['status']}"
                if not r.is_error
                else f"Could not show workflow task {p.task_id or '(latest)'}"
            ),
        ),
        define_worker_tool(
            name="workflow_list",
            description=f"List this agent's workflow tasks, newest first (at most {LIST_LIMIT}).",
            input_model=NoParams,
            execute=_list,
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=lambda p: "Listing workflow tasks",
            describe_completed_activity=lambda p, r: f"Listed {r.details.get('count', 0)} workflow tasks",
        ),
        define_worker_tool(
            name="workflow_cancel",
            description="Cancel a queued or running workflow task; its running attempt is stopped.",
            input_model=TaskIdParams,
            execute=_cancel,
            execution_mode="sequential",
            describe_activity=lambda p: f"Cancelling workflow task {p.task_id}",
            describe_completed_activity=lambda p, r: (
                f"Cancelled workflow task {p.task_id}"
                if not r.is_error
                else f"Could not cancel workflow task {p.task_id}"
            ),
        ),
    ]
    return tools
