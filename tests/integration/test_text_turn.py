"""The main text-turn catalog through a real worker and real Redis: computer, todo and web tools."""

from __future__ import annotations

import json
import os
import uuid

import orjson
import pytest

from tests.support.scripts import fc
from worker.turn.request import TurnStatus


@pytest.fixture
def control(styled_control):
    """The end-to-end tests here run in both wire styles (``styled_control``, tests/conftest.py)."""
    return styled_control


def run(control, gateway, script_name, steps, agent_id):
    gateway.add_script(script_name, steps + [{"output": [{"type": "message", "text": "done"}]}])
    turn_id = control.enqueue({"agent_id": agent_id, "input": "go", "model": script_name})
    view = control.wait(turn_id, timeout=90)
    outs = {i["call_id"]: i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"}
    ordered = [outs[i["call_id"]] for i in control.items(turn_id) if i["type"] == "function_call"]
    return turn_id, view, ordered


def test_computer_tools_in_a_turn(control, gateway, script_name, homes_root):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    turn_id, view, outs = run(
        control,
        gateway,
        script_name,
        [
            {"output": [fc("write_file", {"path": "src/app.py", "content": "print('hello')\nX = 1\n"})]},
            {"output": [fc("edit_file", {"path": "src/app.py", "old_string": "X = 1", "new_string": "X = 2"})]},
            {
                "output": [
                    fc("read_file", {"path": "src/app.py"}),
                    fc("list_files", {"path": "src"}),
                    fc("search_files", {"pattern": "X = ", "path": "."}),
                ]
            },
            {"output": [fc("run_command", {"command": "python3 src/app.py && echo secret=${OPENAI_API_KEY:-none}"})]},
        ],
        agent,
    )
    assert view.status == TurnStatus.completed
    assert (homes_root / agent / "src" / "app.py").read_text() == "print('hello')\nX = 2\n"
    assert "X = 2" in outs[2] and "app.py" in outs[3] and "X = 2" in outs[4]
    assert "hello" in outs[5] and "secret=none" in outs[5], "the command must not see the worker's secrets"
    labels = [e["activity"] for e in control.events(turn_id) if e["kind"] == "call_completed"]
    assert any(label.startswith("Wrote") and "src/app.py" in label for label in labels)
    assert any(label.startswith("Read") and "src/app.py" in label for label in labels)


def test_a_home_is_made_only_where_a_tool_call_runs(control, gateway, script_name, homes_root):
    """A turn without tool calls makes no home (its model steps run no tool); the agent's first
    tool call makes it."""
    agent = f"a-{uuid.uuid4().hex[:6]}"
    _, view, _ = run(control, gateway, script_name, [], agent)
    assert view.status == TurnStatus.completed
    assert not (homes_root / agent).exists()
    _, view, outs = run(control, gateway, script_name, [{"output": [fc("list_files", {"path": "."})]}], agent)
    assert view.status == TurnStatus.completed and (homes_root / agent).is_dir(), outs


def test_file_confinement_refusals_through_the_worker(control, gateway, script_name, homes_root):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    home = homes_root / agent
    home.mkdir(parents=True)
    os.symlink("/etc", home / "etc-link")
    turn_id, view, outs = run(
        control,
        gateway,
        script_name,
        [
            {
                "output": [
                    fc("read_file", {"path": "../../../etc/passwd"}),
                    fc("read_file", {"path": "/etc/passwd"}),
                    fc("read_file", {"path": "etc-link/passwd"}),
                    fc("list_files", {"path": ".."}),
                ]
            },
            {"output": [fc("write_file", {"path": "../escape.txt", "content": "x"})]},
        ],
        agent,
    )
    assert view.status == TurnStatus.completed
    for out in outs:
        assert "root:" not in out
        assert "agent home" in out, out
    assert not (homes_root / "escape.txt").exists()


def test_todo_tool_keeps_the_list_in_redis(control, gateway, script_name):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    todos = [
        {"id": "1", "content": "write tests", "status": "in_progress"},
        {"id": "2", "content": "ship", "status": "pending", "priority": "high"},
    ]
    turn_id, view, outs = run(control, gateway, script_name, [{"output": [fc("todo_write", {"todos": todos})]}], agent)
    assert view.status == TurnStatus.completed
    stored = control.redis.get(f"agent:{agent}:todos")
    assert stored is not None
    assert [(t["content"], t["status"]) for t in orjson.loads(stored)] == [
        ("write tests", "in_progress"),
        ("ship", "pending"),
    ]


def test_web_tools_search_fetch_and_refuse_metadata(control, gateway, script_name, web_server):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    turn_id, view, outs = run(
        control,
        gateway,
        script_name,
        [
            {
                "output": [
                    fc("web_search", {"query": "celery barrier"}),
                    fc("web_fetch", {"url": f"{web_server.base_url}/article"}),
                    fc("web_fetch", {"url": "http://169.254.169.254/latest/meta-data/"}),
                    fc("web_fetch", {"url": f"{web_server.base_url}/to-metadata"}),
                    fc("web_fetch", {"url": "http://10.1.2.3/"}),
                ]
            }
        ],
        agent,
    )
    assert view.status == TurnStatus.completed
    assert "Result 0 for celery barrier" in outs[0] and "search-key-never-shown" not in outs[0]
    assert web_server.queries[-1]["auth"] == "Bearer search-key-never-shown"
    assert "barrier of your own" in outs[1] and "footer" not in outs[1]
    for out in outs[2:]:
        assert "refus" in out.lower() or "blocked" in out.lower() or "not allowed" in out.lower(), out
    events = json.dumps(control.events(turn_id))
    assert "search-key-never-shown" not in events
