"""A real turn against a real model server (llama.cpp's ``llama-server``, Qwen2.5-Coder-1.5B-Instruct),
in both wire styles: the worker's Responses client against the server's ``/v1/responses`` and its
Chat Completions client against ``/v1/chat/completions`` (``real_stack``, conftest.py).

What the scripted gateway cannot show: a second, independent implementation of both wire APIs
reads what our clients send (tools, history with ``function_call`` and ``function_call_output``
items, streaming options) and answers with what a real server streams, including a tool call
that a model decided to make.
"""

from __future__ import annotations

import time

import httpx
import orjson
import pytest

from devtools.real_model import CACHE, TEMPLATE_FILE
from tests.integration.real_model.toolset import FORECAST, City
from worker.model.text_calls import read_text_calls
from worker.turn.request import TurnStatus

# A turn takes seconds on idle cores, minutes on a loaded 2-core machine (pyproject's 180 s is for the rest).
pytestmark = pytest.mark.timeout(900)

QUESTION = "What is the weather in Paris today?"
INSTRUCTIONS = (
    "You are a weather assistant. First call get_weather once. "
    "When its result is given to you, answer the user in one sentence and call no more tools."
)


def _items(control, turn_id: str, kind: str) -> list[dict]:
    return [i for i in control.items(turn_id) if i["type"] == kind]


def test_a_real_turn_calls_the_tool_and_answers(real_stack):
    control = real_stack.control
    started = time.monotonic()
    turn_id = control.enqueue({"input": QUESTION, "instructions": INSTRUCTIONS, "toolset": "weather"})
    view = control.wait(turn_id, timeout=600)
    print(f"\n{real_stack.style}: {view.status.value} in {time.monotonic() - started:.1f} s: {view.final_output!r}")

    assert view.status == TurnStatus.completed, view.error
    calls = _items(control, turn_id, "function_call")
    assert calls, "the model called no tool"
    assert {c["name"] for c in calls} == {"get_weather"}
    cities = [orjson.loads(c["arguments"])["city"] for c in calls]
    assert any("paris" in city.lower() for city in cities), cities

    # Every call was run once and answered: the tool's own output, under the call's id.
    outputs = _items(control, turn_id, "function_call_output")
    assert sorted(o["call_id"] for o in outputs) == sorted(c["call_id"] for c in calls)
    assert all(FORECAST in o["output"] for o in outputs)

    # The answer came after the tool's output, from a second model call that read it.
    assert view.final_output.strip()
    assert view.model_calls >= 2

    # Usage as the server counted it, per call and in total.
    usage = control.usage(turn_id)
    assert usage["total"]["model_calls"] == view.model_calls
    assert len(usage["steps"]) == view.model_calls
    assert all(s["input_tokens"] > 0 and s["output_tokens"] > 0 for s in usage["steps"])
    assert usage["total"]["total_tokens"] == usage["total"]["input_tokens"] + usage["total"]["output_tokens"]

    # Streamed: each call arrived as deltas that add up to it: its arguments' deltas, or, for a
    # call the server returned as text (--skip-chat-parsing), the text deltas of its step, from
    # which the runtime read it (worker.model.text_calls); and the final text too.
    deltas = [e for e in control.events(turn_id) if e["kind"] == "model_delta"]
    planned = {e["call_id"]: e for e in control.events(turn_id) if e["kind"] == "call_planned"}
    for call in calls:
        event = planned[call["call_id"]]
        if any(r.startswith("text_call:") for r in event["repairs"]):
            text = "".join(d["delta"] for d in deltas if d["type"] == "text" and d["step"] == event["step"])
            read = read_text_calls(text, {"get_weather": City.model_json_schema()})[1]
            assert [(c.name, orjson.loads(c.arguments)) for c in read][:1] == [
                (call["name"], orjson.loads(call["arguments"]))
            ]
            continue
        pieces = [d["delta"] for d in deltas if d["type"] == "arguments" and d["call_id"] == call["call_id"]]
        assert pieces, f"no argument deltas for {call['call_id']}"
        assert orjson.loads("".join(pieces)) == orjson.loads(call["arguments"])
    last_step = max(d["step"] for d in deltas)
    text = "".join(d["delta"] for d in deltas if d["type"] == "text" and d["step"] == last_step)
    assert text == view.final_output


def test_a_real_turn_without_tools_streams_its_answer(real_stack):
    control = real_stack.control
    turn_id = control.enqueue({"input": "Write one sentence about the sea.", "toolset": "plain"})
    view = control.wait(turn_id, timeout=600)
    assert view.status == TurnStatus.completed, view.error
    assert view.final_output.strip() and view.model_calls == 1
    assert not _items(control, turn_id, "function_call")
    texts = [e["delta"] for e in control.events(turn_id) if e["kind"] == "model_delta" and e["type"] == "text"]
    assert texts and "".join(texts) == view.final_output
    assert control.usage(turn_id)["total"]["output_tokens"] > 0


def test_the_server_runs_the_derived_tool_template(llama_server):
    """The template the server runs is ours (docs/real-model.md): calls as bare JSON, and the server
    still reads it as a template with tools and tool calls."""
    props = httpx.get(f"{llama_server.root_url}/props", timeout=30).json()
    assert props["chat_template"] == (CACHE / TEMPLATE_FILE).read_text()
    assert "<tool_call>" not in props["chat_template"] and "<tool_response>" in props["chat_template"]
    caps = props["chat_template_caps"]
    assert caps["supports_tools"] and caps["supports_tool_calls"]
