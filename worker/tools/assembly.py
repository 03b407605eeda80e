"""Per-turn tool assembly: the main text-turn catalog and the workflow task catalog.

Each category creator is given the turn's ``TurnContext`` and returns its
tools; the order is explicit and fixed (a stable order keeps the model's prompt
prefix, and so its cache, the same from turn to turn). A category whose
prerequisites are absent contributes nothing.
"""

from __future__ import annotations

from typing import Any, Callable

from worker.tooling.contract import WorkerTool
from worker.tools.background_jobs import create_background_job_tools
from worker.tools.brain import create_brain_tools
from worker.tools.computer.catalog import create_computer_tools
from worker.tools.schedule import create_schedule_tools
from worker.tools.submit_result import create_submit_result_tool
from worker.tools.todo import create_todo_tool
from worker.tools.web.catalog import create_web_tools
from worker.tools.workflow import create_workflow_tools
from worker.turn.context import TurnContext


def _todo_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    return [create_todo_tool(ctx)]


# The main text-turn catalog's categories, in order. A new category is one entry here (and its own
# module and test): tests/integration/test_assembly.py and docs/layout.md read this tuple.
TEXT_TURN_CATEGORIES: tuple[Callable[[TurnContext], list[WorkerTool[Any]]], ...] = (
    _todo_tools,
    create_computer_tools,
    create_web_tools,
    create_schedule_tools,
    create_background_job_tools,
    create_workflow_tools,
)


def text_turn_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The main text-turn tool set: each of ``TEXT_TURN_CATEGORIES`` in order (todo, computer, web,
    schedule, background job and workflow tools). Each creator returns ``[]`` when its
    prerequisites are absent (no web profile bound, the turn may not spawn jobs,
    a workflow task turn never gets workflow tools).
    """
    return [tool for create in TEXT_TURN_CATEGORIES for tool in create(ctx)]


def workflow_task_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The fixed workflow task catalog: web tools, Brain ``recall``/``get_page``, ``submit_result``.

    A task gets only what its isolated unit of work needs: the available web tools
    (present only when a provider profile is bound), the read-only Brain tools when Brain is enabled
    (``ctx.supports.brain``), and the task-specific ``submit_result`` built from
    ``ctx.metadata["result_schema"]``. It does not reuse the main catalog: no
    computer, file, shell, MCP, skill, schedule, workflow or background job tools.

    Raises ``ValueError`` when the turn has no ``metadata.result_schema``.
    """
    tools: list[WorkerTool[Any]] = [*create_web_tools(ctx), *create_brain_tools(ctx), create_submit_result_tool(ctx)]
    return tools
