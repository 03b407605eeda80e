"""The agent's todo list: a ``todo_write`` tool that replaces the whole list.

Modelled on "todo write" tools: the model sends the complete list every time
(items with ``id``, ``content``, ``status`` and ``priority``), which keeps the
stored list and the model's view identical and makes a repeated call harmless.

Storage, per agent:

- Redis, when the turn has a client (``TurnContext.redis``): key
  ``agent:<agent_id>:todos``, value the JSON list (orjson);
- otherwise the file ``<home>/.agent/todos.json``, read and replaced through
  ``worker.tools.computer.home_fs`` (race-free; a hard-linked file is never read).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson
import redis as redis_lib
from pydantic import BaseModel, Field

from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.tools.computer.common import NotRegularFile
from worker.tools.computer.confine import home_root
from worker.tools.computer.home_fs import HomeDir
from worker.turn.context import TurnContext

TODO_FILE = ".agent/todos.json"
MAX_ITEMS = 100
STATUS_MARK = {"completed": "[x]", "in_progress": "[~]", "pending": "[ ]"}


def todo_key(agent_id: str) -> str:
    """Redis key of an agent's todo list."""
    return f"agent:{agent_id}:todos"


class TodoItem(BaseModel):
    """One todo item."""

    id: str = Field(..., min_length=1, max_length=64, description="Stable id of the item, e.g. '1'.")
    content: str = Field(..., min_length=1, max_length=500, description="What to do, imperative.")
    status: Literal["pending", "in_progress", "completed"] = Field(..., description="Current state.")
    priority: Literal["high", "medium", "low"] = Field("medium", description="Priority.")


class TodoRecord(TypedDict):
    """One stored item: a ``TodoItem`` as JSON (its fields, in its order)."""

    id: str
    content: str
    status: Literal["pending", "in_progress", "completed"]
    priority: Literal["high", "medium", "low"]


def todo_record(item: TodoItem) -> TodoRecord:
    """``item`` as stored (the same dict as ``item.model_dump()``)."""
    return TodoRecord(id=item.id, content=item.content, status=item.status, priority=item.priority)


class TodoWriteParams(BaseModel):
    """Input of ``todo_write``: the complete new list (an empty list clears it)."""

    todos: list[TodoItem] = Field(..., max_length=MAX_ITEMS, description="The full, updated todo list.")


class TodoStore:
    """Loads and saves one agent's list, in Redis when given a client, else in a file."""

    def __init__(self, agent_id: str, home: Path, redis: redis_lib.Redis | None = None):
        self.agent_id = agent_id
        self.home = home
        self.redis = redis

    @property
    def file(self) -> Path:
        """The file holding the list when no Redis is given: ``<home>/.agent/todos.json``."""
        return home_root(self.home) / TODO_FILE

    def load(self) -> list[TodoRecord]:
        """The stored list (``[]`` when none).

        The file is read through ``home_fs`` (race-free, symlinks only inside
        the home); ``NotRegularFile`` (also ``HardLinkedFile``) or
        ``ConfinementError`` when it is not a lone regular file inside the home.
        """
        if self.redis is not None:
            raw = self.redis.get(todo_key(self.agent_id))
        else:
            try:
                with HomeDir(self.home) as hd:
                    raw = hd.read_bytes(TODO_FILE)[1]
            except FileNotFoundError:
                raw = None
        return orjson.loads(raw) if raw else []

    def save(self, items: list[TodoRecord]) -> None:
        """Replace the stored list (Redis key, or an atomic rename inside the home by descriptors)."""
        data = orjson.dumps(items)
        if self.redis is not None:
            self.redis.set(todo_key(self.agent_id), data)
            return
        with HomeDir(self.home) as hd:
            hd.write_atomic(TODO_FILE, data)


def render_todos(items: list[TodoRecord]) -> str:
    """The list as the model sees it: a summary line then one line per item."""
    if not items:
        return "Todo list is empty."
    done = sum(i["status"] == "completed" for i in items)
    doing = sum(i["status"] == "in_progress" for i in items)
    lines = [
        f"Todo list ({len(items)} items: {done} completed, {doing} in progress, {len(items) - done - doing} pending)"
    ]
    for i in items:
        lines.append(f"{STATUS_MARK[i['status']]} {i['id']}. {i['content']} ({i['priority']})")
    return "\n".join(lines)


def create_todo_tool(ctx: TurnContext) -> WorkerTool[Any]:
    """The ``todo_write`` tool for the turn's agent (sequential; neither read-only nor destructive).

    Refuses (``is_error``) a list with duplicate ids. Storage as described in
    the module docstring; a storage failure is reported, not raised.
    """
    store = TodoStore(ctx.agent_id, ctx.home, ctx.redis)

    def execute(params: TodoWriteParams, tctx: ToolContext) -> ToolResult:
        ids = [t.id for t in params.todos]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            msg = f"duplicate todo ids: {', '.join(dupes)}; give each item its own id"
            return ToolResult(content=msg, details={"error": msg}, is_error=True)
        items = [todo_record(t) for t in params.todos]
        try:
            try:
                before = store.load()
            except NotRegularFile:  # e.g. hard-linked: never read, and the save below replaces the name
                before = []
            store.save(items)
        except Exception as exc:  # Redis down, disk full: tell the model, keep the turn going
            msg = f"could not save the todo list ({type(exc).__name__})"
            return ToolResult(content=msg, details={"error": msg}, is_error=True)
        done = sum(i["status"] == "completed" for i in items)
        return ToolResult(
            content=render_todos(items),
            details={"items": len(items), "completed": done, "previous_items": len(before), "todos": items},
        )

    def describe(params: TodoWriteParams) -> str:
        return "Updating the todo list"

    def describe_done(params: TodoWriteParams, result: ToolResult) -> str:
        if result.is_error:
            return "Could not update the todo list"
        n = result.details.get("items", 0)
        if n == 0:
            return "Cleared the todo list"
        return f"Updated the todo list: {result.details.get('completed', 0)}/{n} done"

    return define_worker_tool(
        name="todo_write",
        description=(
            "Create and manage your todo list for multi-step work. Send the complete, updated list "
            "every time (it replaces the stored one). Statuses: pending, in_progress, completed; keep "
            "one item in_progress at a time and mark items completed as soon as they are done."
        ),
        input_model=TodoWriteParams,
        execute=execute,
        execution_mode="sequential",
        describe_activity=describe,
        describe_completed_activity=describe_done,
    )
