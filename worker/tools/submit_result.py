"""``submit_result``: the only way a workflow task turn ends.

Built per turn from the turn's metadata (``metadata.result_schema`` and
``metadata.workflow_task_id``, set by ``worker.records.workflow.WorkflowService``).
Its parameters are a RAW JSON Schema wrapping the task's result schema
(``worker.records.workflow.submit_result_schema``: ``{"result": <task schema>}``,
``additionalProperties: false``; a task schema that refers to its own root,
such as a recursive ``{"$ref": "#"}``, is moved to the wrapper's
``$defs.result`` with its refs rewritten, so the wrapper accepts exactly what
the task schema accepts), sent with ``strict: true`` so that the provider
constrains the model's result to the schema. When the task schema
cannot be expressed in strict mode (an open map, an untyped value...), the
tool falls back to ``strict: false``; the reason is recorded on the task at
start (``strict_note``) and logged here.

The loop validates the arguments against the wrapper (the task schema with
every keyword) before ``execute`` runs (``worker.tooling.arguments``): a rejected
submission is an error output naming each failing field and the turn goes
on. An accepted one returns ``ToolResult(terminate=True, details={"submitted":
value})`` and is kept on the task's attempt; the control plane validates it
again against the persisted schema itself, unwrapped, before it commits
(``tasks.hooks``, ``worker.records.workflow.result_errors``).
"""

from __future__ import annotations

import logging
from typing import Any

from worker.records.result_schema import FINISH_TOOL, submit_result_schema
from worker.records.workflow import WorkflowService
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.tooling.errors import ToolDefinitionError
from worker.turn.context import TurnContext

log = logging.getLogger("agent.workflow")

DESCRIPTION = (
    "Submit this workflow task's final result and end the task. `result` must match the task's result "
    "schema. A rejected submission returns the failing fields: fix them and call submit_result again. "
    "Call it exactly once with the complete result."
)


def _execute(task_id: str | None) -> Any:
    def execute(params: dict[str, Any], ctx: ToolContext) -> ToolResult:
        value = params["result"]
        redis = ctx.services.redis
        if redis is not None and task_id:
            WorkflowService(redis).record_submission(task_id, ctx.turn_id, value)
        return ToolResult(
            content="Result accepted. The task is complete; no further action is needed.",
            details={"submitted": value, "workflow_task_id": task_id},
            terminate=True,
        )

    return execute


def create_submit_result_tool(ctx: TurnContext) -> WorkerTool[Any]:
    """The task's ``submit_result`` tool.

    Raises ``ValueError`` when the turn has no ``metadata.result_schema``
    object (a workflow task turn enqueued without its schema cannot finish,
    so it fails at its first step with this reason).
    """
    schema = ctx.metadata.get("result_schema")
    if not isinstance(schema, dict):
        raise ValueError("workflow task turn without metadata.result_schema: submit_result cannot be built")
    task_id = ctx.metadata.get("workflow_task_id")
    params = submit_result_schema(schema)
    common: dict[str, Any] = dict(
        name=FINISH_TOOL,
        description=DESCRIPTION,
        json_schema=params,
        execute=_execute(task_id),
        execution_mode="sequential",
        describe_activity=lambda p: "Submitting the task result",
        describe_completed_activity=lambda p, r: "Submitted the task result",
    )
    try:
        return define_worker_tool(**common, strict=True)
    except ToolDefinitionError as exc:
        log.info("submit_result for workflow task %s is not strict: %s", task_id, exc)
        return define_worker_tool(**common, strict=False)
