"""Chat Completions as a wire format (worker/model/chat.py): the mapping both ways, checked against
the ``openai`` package's typed params and objects, a streamed reply with arguments in fragments,
``finish_reason: length``, and the shapes of the scripted gateway's ``/chat/completions`` side. A
streamed call through the gateway itself: tests/integration/test_chat_gateway.py."""

from __future__ import annotations

import orjson
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError

from devtools.chat_wire import chat_chunks, chat_completion
from worker.model.chat import (
    CHAT,
    ChatMappingError,
    _StreamAssembly,
    chat_body,
    chat_messages,
    chat_tools,
    reply_from_completion,
)
from worker.model.clients import model_client
from worker.model.interface import Delta, GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient
from worker.settings import Settings

READ = {
    "type": "function",
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                   "additionalProperties": False},
    "strict": True,
}  # fmt: skip
NAMESPACE = {"type": "namespace", "name": "archive", "description": "Archive", "tools": [{**READ, "name": "lookup"}]}

HISTORY = [
    {"type": "message", "role": "developer", "content": "Be brief."},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "read a and b"}]},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
    {"type": "function_call", "call_id": "call_a", "name": "read_file", "arguments": '{"path": "a"}'},
    {"type": "function_call", "call_id": "call_b", "name": "read_file", "arguments": '{"path": "b",'},
    {"type": "function_call_output", "call_id": "call_a", "output": "A"},
    {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "B"}]},
    {"type": "function_call", "call_id": "call_c", "name": "read_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_c", "output": "C"},
    {"type": "message", "role": "user", "content": "thanks"},
]


def test_history_maps_to_messages_with_one_assistant_message_per_step():
    messages = chat_messages(HISTORY, "You are a worker.")
    assert messages == [
        {"role": "system", "content": "You are a worker."},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "read a and b"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
                # malformed arguments go back verbatim: the model sees what it sent
                {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "b",'}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "A"},
        {"role": "tool", "tool_call_id": "call_b", "content": "B"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_c", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "C"},
        {"role": "user", "content": "thanks"},
    ]


def test_request_bodies_are_valid_chat_params():
    request = ModelRequest(
        model="m", input=HISTORY, tools=[READ, NAMESPACE], instructions="sys", max_output_tokens=50, metadata={"k": "v"}
    )
    body = chat_body(request)
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python(body)
    TypeAdapter(CompletionCreateParamsStreaming).validate_python(
        {**body, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert body["max_tokens"] == 50 and "metadata" not in body and body["parallel_tool_calls"] is True
    assert [t["function"]["name"] for t in body["tools"]] == ["read_file", "lookup"], "namespace flattened"
    assert body["tools"][0]["function"] == {
        "name": "read_file",
        "description": "Read a file.",
        "parameters": READ["parameters"],
        "strict": True,
    }
    with pytest.raises(ValidationError):  # the check can fail: a Responses body is not Chat params
        TypeAdapter(CompletionCreateParamsNonStreaming).validate_python({"model": "m", "input": HISTORY})


def test_a_tool_without_arguments_under_gemini_is_a_function_without_parameters():
    """G10: under AGENT_MODEL_PROVIDER=gemini a tool that takes no arguments is declared without
    ``parameters``; Chat sends it so (OpenAI's params allow it) instead of inventing a schema."""
    from worker.tooling.contract import ToolResult, define_worker_tool
    from worker.tooling.schemas import function_definition

    tool = define_worker_tool(
        name="list_jobs", description="List jobs.", execute=lambda p, c: ToolResult("ok"),
        json_schema={"type": "object", "properties": {}},
    )  # fmt: skip
    definition = function_definition(tool, "gemini")
    assert "parameters" not in definition
    [sent] = chat_tools([definition])
    assert sent["function"] == {"name": "list_jobs", "description": "List jobs.", "strict": False}
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [sent]}
    )
    [default] = chat_tools([function_definition(tool, "any")])
    assert default["function"]["parameters"] == {"type": "object", "required": []}


def test_an_image_becomes_an_image_url_part():
    item = {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "what is this"}, {"type": "input_image", "image_url": "data:image/png;base64,AA"}]}  # fmt: skip
    [message] = chat_messages([item])
    assert message["content"][1] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AA", "detail": "auto"},
    }
    TypeAdapter(CompletionCreateParamsNonStreaming).validate_python({"model": "m", "messages": [message]})


def test_what_chat_cannot_carry_is_refused_by_name():
    with pytest.raises(ChatMappingError, match="'web_search' tool"):
        chat_tools([{"type": "web_search"}])
    with pytest.raises(ChatMappingError, match="'computer_call' input item"):
        chat_messages([{"type": "computer_call", "call_id": "x"}])
    with pytest.raises(GatewayError, match="cannot be sent as Chat Completions") as err:
        SyncModelClient(CHAT, "http://127.0.0.1:9/v1").create(
            ModelRequest(model="m", input=[], tools=[{"type": "file_search"}])
        )
    assert err.value.retryable is False


def test_a_completion_maps_to_responses_items_and_usage():
    data = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {
                    "role": "assistant",
                    "content": "Reading both.",
                    "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"a"'}},
                        {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": '{"path":"b"}'}},
                    ],
                },
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                  "prompt_tokens_details": {"cached_tokens": 8}, "completion_tokens_details": {"reasoning_tokens": 3}},
    }  # fmt: skip
    ChatCompletion.model_validate(data)
    reply = reply_from_completion(data)
    assert reply.status == "completed" and reply.text == "Reading both."
    assert [(c["call_id"], c["arguments"]) for c in reply.function_calls] == [
        ("call_1", '{"path":"a"'),  # cut-off arguments kept verbatim for the repair ladder
        ("call_2", '{"path":"b"}'),
    ]
    assert reply.usage == {
        "input_tokens": 30,
        "output_tokens": 12,
        "total_tokens": 42,
        "input_tokens_details": {"cached_tokens": 8},
        "output_tokens_details": {"reasoning_tokens": 3},
    }


def test_finish_reason_length_is_an_incomplete_reply():
    data = {"id": "c", "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant",
            "content": None, "tool_calls": [{"id": "call_1", "type": "function",
                                             "function": {"name": "read_file", "arguments": '{"pa'}}]}}]}  # fmt: skip
    reply = reply_from_completion(data)
    assert (reply.status, reply.incomplete_reason) == ("incomplete", "max_output_tokens")
    assert reply.function_calls[0]["arguments"] == '{"pa'


def test_odd_server_replies():
    # Ollama sends arguments as an object, some servers omit the call id
    data = {"choices": [{"finish_reason": "tool_calls", "message": {"tool_calls": [
        {"type": "function", "function": {"name": "read_file", "arguments": {"path": "a"}}}]}}]}  # fmt: skip
    [call] = reply_from_completion(data).function_calls
    assert orjson.loads(call["arguments"]) == {"path": "a"} and "call_id" not in call
    for bad in ({}, {"choices": []}, [], {"choices": [{"message": {"tool_calls": ["x"]}}]}):
        with pytest.raises(GatewayError) as err:
            reply_from_completion(bad)
        assert err.value.retryable


def test_interleaved_parallel_fragments_are_assembled_by_index():
    """Fragments of two calls interleaved (as vLLM can send them), the usage chunk with ``choices: null``."""
    deltas: list[Delta] = []
    asm = _StreamAssembly(deltas.append)
    head = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 0, "model": "m"}

    def chunk(delta, finish=None):
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def frag(i, **kw):
        return chunk({"tool_calls": [{"index": i, **kw}]})

    stream = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"content": "Two "}),
        chunk({"content": "reads."}),
        frag(0, id="call_a", type="function", function={"name": "read_file", "arguments": ""}),
        frag(1, id="call_b", type="function", function={"name": "read_file", "arguments": '{"pa'}),
        frag(0, function={"arguments": '{"path"'}),
        frag(1, function={"arguments": 'th": "b"}'}),
        frag(0, function={"arguments": ': "a"}'}),
        chunk({}, "tool_calls"),
        {**head, "choices": None, "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}},
    ]
    for c in stream:
        if c["choices"] is not None:
            ChatCompletionChunk.model_validate(c)
        asm.add(c)
    reply = asm.reply()
    assert reply.text == "Two reads."
    assert [(c["call_id"], c["arguments"]) for c in reply.function_calls] == [
        ("call_a", '{"path": "a"}'),
        ("call_b", '{"path": "b"}'),
    ]
    assert [i["type"] for i in reply.output] == ["message", "function_call", "function_call"]
    assert reply.usage["input_tokens"] == 5 and reply.usage["output_tokens"] == 7
    by_index: dict[int, str] = {}
    for d in deltas:
        by_index[d.output_index] = by_index.get(d.output_index, "") + d.text
    assert by_index == {0: "Two reads.", 1: '{"path": "a"}', 2: '{"path": "b"}'}
    assert {(d.output_index, d.call_id) for d in deltas if d.kind == "arguments"} == {(1, "call_a"), (2, "call_b")}


def test_gateway_chat_shapes_are_the_real_types():
    payload = {"id": "resp_1", "model": "m", "status": "completed", "created_at": 0, "usage": {"input_tokens": 3},
               "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi there"}]},
                          {"type": "function_call", "call_id": "call_1", "name": "read_file", "arguments": '{"p": 1}'}]}  # fmt: skip
    completion = ChatCompletion.model_validate(chat_completion(payload))
    assert completion.choices[0].finish_reason == "tool_calls"
    chunks = [c for _, c in chat_chunks(payload, chunk=3)]
    for c in chunks:
        ChatCompletionChunk.model_validate(c)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] == 3
    assert chat_completion({**payload, "status": "incomplete"})["choices"][0]["finish_reason"] == "length"


def test_the_setting_picks_the_wire(monkeypatch):
    monkeypatch.setenv("OPENAI_API_STYLE", "chat")
    assert model_client(Settings()).wire is CHAT
    monkeypatch.setenv("OPENAI_API_STYLE", "responses")
    assert model_client(Settings()).wire is RESPONSES


def test_the_suites_worker_speaks_the_style_the_environment_names(monkeypatch):
    """``OPENAI_API_STYLE=chat make test`` runs the session's worker in the chat style; a value the
    settings refuse stops the run before anything starts (tests/conftest.py)."""
    from tests.conftest import session_api_style

    monkeypatch.delenv("OPENAI_API_STYLE", raising=False)
    assert session_api_style() == "responses"
    monkeypatch.setenv("OPENAI_API_STYLE", "chat")
    assert session_api_style() == "chat"
    monkeypatch.setenv("OPENAI_API_STYLE", "completions")
    with pytest.raises(pytest.UsageError, match="OPENAI_API_STYLE='completions'"):
        session_api_style()
