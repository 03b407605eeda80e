"""``AGENT_DEFER_TOOLS``: catalog tools sent deferred behind ``tool_search`` (``deferred_by_name``),
to keep a small model's prompt small; a turn of the text catalog sends only what is not deferred,
and a tool loaded through ``tool_search`` is sent from then on."""

from __future__ import annotations

import uuid

import pytest

from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.tool_search import deferred_by_name
from worker.turn.request import TurnStatus


def _tool(name: str, deferred: bool = False):
    return define_worker_tool(
        name=name, description=f"The {name} tool.", execute=lambda p, c: ToolResult("ok"), defer_loading=deferred
    )


TOOLS = [_tool("run_command"), _tool("read_file"), _tool("write_file"), _tool("create_schedule", deferred=True)]


@pytest.mark.parametrize(
    ("patterns", "deferred"),
    [
        ("", {"create_schedule"}),
        ("*", {"run_command", "read_file", "write_file", "create_schedule"}),
        ("*,!run_command,!read_file", {"write_file", "create_schedule"}),
        ("*_file", {"read_file", "write_file", "create_schedule"}),
        ("*, !*_file , write_file", {"run_command", "write_file", "create_schedule"}),
        ("!create_schedule", set()),  # a tool's own deferral can be taken back too
        (" , ,", {"create_schedule"}),
    ],
)
def test_patterns_defer_tools_by_name_the_last_match_winning(patterns, deferred):
    tools = deferred_by_name(TOOLS, patterns)
    assert [t.name for t in tools] == [t.name for t in TOOLS]
    assert {t.name for t in tools if t.defer_loading} == deferred
    assert all(new is old for new, old in zip(tools, TOOLS) if new.defer_loading == old.defer_loading)


def _tool_names(body: dict) -> list[str]:
    return [t.get("name") for t in body.get("tools") or []]


def test_a_text_turn_sends_only_what_is_not_deferred_and_loads_the_rest_on_search(gateway):
    stack = PrivateStack(AGENT_DEFER_TOOLS="*,!run_command,!read_file")
    script = f"script-{uuid.uuid4().hex[:8]}"
    gateway.add_script(
        script,
        [
            {"output": [fc("tool_search", '{"query": "write a file", "limit": 1}')]},
            {"output": [fc("write_file", '{"path": "a.txt", "content": "hi"}')]},
            {"output": [msg("Written.")]},
        ],
    )
    try:
        stack.start_worker(pool="solo", concurrency=1)
        agent = f"d-{uuid.uuid4().hex[:6]}"
        turn_id = stack.control.enqueue({"agent_id": agent, "input": "write a.txt", "model": script})
        view = stack.control.wait(turn_id, timeout=60)
    finally:
        stack.close()
    assert view.status == TurnStatus.completed, view.error
    bodies = [b for b in gateway.requests if b.get("model") == script]
    assert _tool_names(bodies[0]) == ["run_command", "read_file", "tool_search"]
    assert "write_file" in _tool_names(bodies[1]) and "write_file" in _tool_names(bodies[2])
