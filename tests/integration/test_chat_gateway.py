"""Chat Completions over HTTP against the scripted gateway's ``/chat/completions``: a streamed reply
whose parallel calls arrive in fragments, the request checked against the ``openai`` package's
typed params, and the HTTP 400 a real server gives an unanswered tool call. The mapping itself:
tests/unit/model/test_chat_completions.py."""

from __future__ import annotations

import pytest
from openai.types.chat.completion_create_params import CompletionCreateParamsStreaming
from pydantic import TypeAdapter

from tests.support.scripts import fc, msg
from worker.model.chat import CHAT
from worker.model.interface import Delta, GatewayError, ModelRequest
from worker.model.sync_client import SyncModelClient

READ = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                   "additionalProperties": False},
    "strict": True,
}  # fmt: skip


def test_streamed_parallel_calls_through_the_gateway(gateway, script_name):
    args_a, args_b = '{"path": "src/a.py", "limit": 40}', '{"path": "src/b.py"}'
    gateway.add_script(
        script_name,
        [{"output": [msg("Reading."), fc("read_file", args_a), fc("read_file", args_b)], "stream_chunk": 3}],
    )
    client = SyncModelClient(CHAT, gateway.base_url)
    request = ModelRequest(
        model=script_name, input=[{"type": "message", "role": "user", "content": "go"}], tools=[READ]
    )
    deltas: list[Delta] = []
    streamed = client.stream(request, deltas.append)
    whole = client.create(request)
    assert streamed.output == whole.output and streamed.usage == whole.usage
    assert [c["arguments"] for c in streamed.function_calls] == [args_a, args_b]
    assert sum(1 for d in deltas if d.kind == "arguments" and d.output_index == 1) == -(-len(args_a) // 3)
    raw = gateway.chat_requests[-2]
    assert raw["stream"] is True and raw["stream_options"] == {"include_usage": True}
    TypeAdapter(CompletionCreateParamsStreaming).validate_python(raw)


def test_gateway_refuses_an_unanswered_tool_call_like_a_real_server(gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("x")]}])
    history = [{"type": "message", "role": "user", "content": "go"},
               {"type": "function_call", "call_id": "call_z", "name": "read_file", "arguments": "{}"}]  # fmt: skip
    with pytest.raises(GatewayError, match="HTTP 400.*call_z") as err:
        SyncModelClient(CHAT, gateway.base_url).create(ModelRequest(model=script_name, input=history))
    assert not err.value.retryable
