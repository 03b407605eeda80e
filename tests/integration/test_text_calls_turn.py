"""Turns whose model wrote its calls as text, or whose server refused the model's output, in both
wire styles, through the scripted gateway and a real worker: a text call runs as a call (through
the repair ladder, its form named in the repairs), and a refused reply is never retried unchanged:
the model is told what was wrong and the turn goes on, within a bound."""

from __future__ import annotations

import uuid

import orjson
import pytest

from tests.support.scripts import msg
from worker.turn.request import TurnStatus

REFUSED = {
    "code": 500,
    "message": "The model produced output that does not match the expected peg-native format",
    "type": "server_error",
}


@pytest.fixture
def control(styled_control):
    return styled_control


def _agent(homes_root, files: dict[str, str]) -> str:
    agent = f"t-{uuid.uuid4().hex[:6]}"
    home = homes_root / agent
    home.mkdir(parents=True)
    for name, text in files.items():
        (home / name).write_text(text)
    return agent


def _planned(control, turn_id: str) -> list[dict]:
    return [e for e in control.events(turn_id) if e["kind"] == "call_planned"]


def test_fenced_arguments_without_the_wrapper_run_as_the_one_tool_they_fit(control, gateway, script_name, homes_root):
    """What a real open model wrote for "how many lines has todo.txt": run_command's arguments in a
    fence, with a trailing comma the ladder repairs, and no {"name", "arguments"} wrapper."""
    agent = _agent(homes_root, {"todo.txt": "a\nb\nc\n"})
    fenced = 'I will count them.\n```json\n{"command": "wc -l todo.txt",}\n```'
    gateway.add_script(script_name, [{"output": [msg(fenced)]}, {"output": [msg("todo.txt has 3 lines.")]}])
    turn_id = control.enqueue({"agent_id": agent, "input": "count the lines of todo.txt", "model": script_name})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed, view.error
    [planned] = _planned(control, turn_id)
    assert planned["name"] == "run_command" and planned["error"] is None
    assert planned["repairs"][0] == "text_call:fenced_arguments" and len(planned["repairs"]) > 1  # the comma too
    [output] = [i for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert "3 todo.txt" in output["output"]
    # The history holds the call as a call (what the model sees next), after the prose it wrote.
    items = control.items(turn_id)
    call = next(i for i in items if i["type"] == "function_call")
    assert call["call_id"] == planned["call_id"] and "text_call" not in call
    assert items.index(call) > next(i for i, it in enumerate(items) if it.get("role") == "assistant")


def test_tagged_calls_run_and_an_unknown_name_is_an_error_the_model_reads(control, gateway, script_name, homes_root):
    agent = _agent(homes_root, {"notes.md": "hello\n"})
    text = (
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes.md"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "count_words", "arguments": {"path": "notes.md"}}\n</tool_call>'
    )
    gateway.add_script(script_name, [{"output": [msg(text)]}, {"output": [msg("It says hello.")]}])
    turn_id = control.enqueue({"agent_id": agent, "input": "read notes.md", "model": script_name})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed, view.error
    read, unknown = _planned(control, turn_id)
    assert read["name"] == "read_file" and read["repairs"] == ["text_call:tool_call_tag"] and read["error"] is None
    assert unknown["error"] == "unknown_tool"
    outputs = [i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert "hello" in outputs[0] and "unknown tool 'count_words'" in outputs[1]


def test_a_reply_the_server_refused_is_told_to_the_model_not_retried(control, gateway, script_name):
    def answer(body: dict) -> dict:
        # The same step again (the refused reply left no item behind): it answers once told.
        if "could not be read" in orjson.dumps(body["input"]).decode():
            return {"output": [msg("Sorry: the answer is 4.")]}
        return {"output": [msg("x")], "stream_error": REFUSED}

    gateway.add_script(script_name, [answer])
    before = len(gateway.requests)
    turn_id = control.enqueue({"input": "what is 2+2", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed, view.error
    assert view.final_output == "Sorry: the answer is 4."
    assert len(gateway.requests) - before == 2, "one refused call and one more, no retry"
    # The second request told the model what was wrong: its history differs from the first's.
    told = [i for i in control.items(turn_id) if i.get("role") == "user"][-1]
    assert "could not be read" in str(told["content"]) and "does not match the expected" in str(told["content"])
    [event] = [e for e in control.events(turn_id) if e["kind"] == "repair_instruction"]
    assert event["reason"] == "model_output"
    assert not [e for e in control.events(turn_id) if e["kind"] == "model_retry"]


def test_replies_refused_past_the_budget_end_the_turn_as_the_models_output(control, gateway, script_name):
    refused = {"output": [msg("x")], "stream_error": REFUSED}
    gateway.add_script(script_name, [refused, refused, refused, {"output": [msg("never")]}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.failed
    assert view.error.startswith("the model's output could not be read by the model server 3 times")
