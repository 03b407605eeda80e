"""A call that carries no arguments at all (``"arguments": null``: Gemini omits a no-argument call's
``args``, and OpenAI-compatible relays pass the null on) runs like one whose arguments are ``""``,
through the real wire in both styles, streamed and not (the scripted gateway speaks each)."""

from __future__ import annotations

import pytest

from tests.support.scripts import msg
from tests.support.scripts import output_texts as outputs
from worker.turn.request import TurnStatus


@pytest.fixture
def control(styled_control):
    return styled_control


@pytest.mark.parametrize("stream", [True, False])
def test_null_arguments_run_a_tool_without_parameters(control, gateway, script_name, stream):
    call = {"type": "function_call", "name": "big_output", "arguments": None}
    gateway.add_script(script_name, [{"output": [call]}, {"output": [msg("done")]}])
    gateway.streaming = stream  # False: the gateway answers the JSON body, as an endpoint without streaming
    try:
        turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
        view = control.wait(turn_id, timeout=60)
    finally:
        gateway.streaming = True
    assert view.status == TurnStatus.completed, view.error
    out = outputs(control, turn_id)
    assert len(out) == 1 and out[0].startswith("xxxx"), out[0][:300]  # it ran: no "invalid arguments"
    recorded = [i for i in control.items(turn_id) if i["type"] == "function_call"]
    assert [i["arguments"] for i in recorded] == [""]  # replayable: the API takes only a string back
