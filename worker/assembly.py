"""Per-turn tool assembly: the main text-turn catalog and the workflow task catalog.

Each category creator is given the turn's ``TurnContext`` and returns its
tools; the order is explicit and fixed (spec, "How the tool set is assembled
per turn"). A category whose prerequisites are absent contributes nothing.
"""

from __future__ import annotations

import logging

from worker.contract import WorkerTool
from worker.turn_context import TurnContext

log = logging.getLogger("agent.assembly")


def text_turn_tools(ctx: TurnContext) -> list[WorkerTool]:
    """The main text-turn tool set: todo, computer, web, schedule, background job, workflow tools."""
    from worker.tools.computer import create_computer_tools
    from worker.tools.todo import create_todo_tool

    tools: list[WorkerTool] = [
        create_todo_tool(ctx),
        *create_computer_tools(ctx),
    ]
    from worker.tools.background_jobs import create_background_job_tools
    from worker.tools.schedule import create_schedule_tools

    tools += [*create_schedule_tools(ctx), *create_background_job_tools(ctx)]
    log.info("turn %s tools: %s", ctx.turn_id, ", ".join(t.name for t in tools))
    return tools


def workflow_task_tools(ctx: TurnContext) -> list[WorkerTool]:
    """The fixed workflow task catalog (web, Brain, submit_result)."""
    return []
