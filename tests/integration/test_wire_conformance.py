"""Every request the runtime sends and every item it writes validates against the
``openai`` package's typed Responses models (a real conversation through the worker)."""

from __future__ import annotations

import pytest
from openai.types.responses import Response, ResponseInputItemParam
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError

from worker.turn.request import TurnStatus

REQUEST = TypeAdapter(ResponseCreateParamsNonStreaming)
STREAMING_REQUEST = TypeAdapter(ResponseCreateParamsStreaming)
ITEM = TypeAdapter(ResponseInputItemParam)


def test_typed_models_reject_a_broken_request():
    # guard: the adapters really check shapes (a test that cannot fail would prove nothing)
    with pytest.raises(ValidationError):
        ITEM.validate_python({"type": "function_call_output", "call_id": "c", "output": {"not": "a string"}})
    with pytest.raises(ValidationError):
        REQUEST.validate_python({"model": "m", "input": [{"type": "function_call_output", "call_id": "c"}]})


def test_requests_items_and_replies_conform(control, gateway, script_name):
    def fc(name, args):
        return {"type": "function_call", "name": name, "arguments": args}

    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc("read_thing", '{"label": "a"}'),
                    fc("read_thing", "{'label': 'b'}"),
                    fc("nope", "{}"),
                    fc("read_thing", '{"label": 1}'),
                ]
            },
            {"output": [fc("big_output", "{}"), fc("boom", "")]},
            {"output": [{"type": "message", "text": "done"}]},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing", "instructions": "be brief"})
    assert control.wait(turn_id).status == TurnStatus.completed
    bodies = [b for b in gateway.requests if b["model"] == script_name]
    assert len(bodies) == 3
    for body in bodies:
        (STREAMING_REQUEST if body.get("stream") else REQUEST).validate_python(body)
        assert all(t["strict"] in (True, False) for t in body["tools"] if t["type"] == "function")
        for item in body["input"]:
            ITEM.validate_python(item)
    for item in control.items(turn_id):
        ITEM.validate_python(item)
    # the gateway's replies parse as typed Responses too
    _, reply = gateway.respond(bodies[0])
    Response.model_validate(reply)
    # exactly one output per call, and every output is a string
    items = control.items(turn_id)
    call_ids = [i["call_id"] for i in items if i["type"] == "function_call"]
    out_ids = [i["call_id"] for i in items if i["type"] == "function_call_output"]
    assert sorted(call_ids) == sorted(out_ids) and len(set(out_ids)) == len(out_ids)
    assert all(isinstance(i["output"], str) for i in items if i["type"] == "function_call_output")
