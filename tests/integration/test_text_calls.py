"""Tool calls written as text (``worker.model.text_calls``): the open models' forms read on the client,
a tool inferred from fenced arguments only when exactly one offered schema fits, and a server's
refusal of the model's output classified as the model's (``GatewayError.model_output``)."""

from __future__ import annotations

import orjson
import pytest

from worker.model.http_pool import status_error_of
from worker.model.interface import GatewayError, is_model_output_error
from worker.model.text_calls import calls_from_text, fits_schema, read_text_calls
from worker.turn import metrics

SCHEMAS = {
    "run_command": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
    "read_file": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "list_files": {"type": "object", "properties": {"path": {"type": "string"}}},
    "write_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
        "required": ["path", "content"],
    },
}


def _calls(text: str) -> list[tuple[str, object, str]]:
    _, calls = read_text_calls(text, SCHEMAS)
    return [(c.name, _decoded(c.arguments), c.form) for c in calls]


def _decoded(arguments: str) -> object:
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def test_hermes_qwen_tags_are_calls_in_order_with_the_prose_kept():
    text = (
        "I will count the lines first.\n"
        '<tool_call>\n{"name": "run_command", "arguments": {"command": "wc -l todo.txt"}}\n</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "notes.md"}}</tool_call>'
    )
    rest, calls = read_text_calls(text, SCHEMAS)
    assert rest == "I will count the lines first."
    assert [(c.name, orjson.loads(c.arguments), c.form) for c in calls] == [
        ("run_command", {"command": "wc -l todo.txt"}, "tool_call_tag"),
        ("read_file", {"path": "notes.md"}, "tool_call_tag"),
    ]


def test_an_unclosed_tag_runs_to_the_next_tag_or_the_end():
    text = '<tool_call>{"name": "read_file", "arguments": {"path": "a"}}\n<tool_call>{"name": "list_files", "arguments": {}}'
    assert [name for name, _, _ in _calls(text)] == ["read_file", "list_files"]


def test_a_tag_whose_body_is_not_json_keeps_its_name_and_leaves_the_body_to_the_ladder():
    body = '{"name": "run_command", "arguments": {"command": "ls",}}'  # a trailing comma
    [call] = read_text_calls(f"<tool_call>{body}</tool_call>", SCHEMAS)[1]
    assert call.name == "run_command" and call.arguments == body
    unreadable = '{"name": "run_command", "arguments": {"command": "ls" "-l"}'
    [call] = read_text_calls(f"<tool_call>{unreadable}</tool_call>", SCHEMAS)[1]
    assert call.name == "run_command" and call.arguments == unreadable


def test_fenced_arguments_the_ladder_repairs_are_inferred_and_handed_on_as_written():
    content = "{'command': 'wc -l todo.txt',}"
    [call] = read_text_calls(f"```\n{content}\n```", SCHEMAS)[1]
    assert (call.name, call.arguments, call.form) == ("run_command", content, "fenced_arguments")


def test_a_tag_without_a_readable_name_is_a_call_of_no_tool():
    [call] = read_text_calls("<tool_call>run the command please</tool_call>", SCHEMAS)[1]
    assert call.name == "" and call.arguments == "run the command please"


def test_arguments_as_a_json_string_and_parameters_for_arguments():
    text = '{"name": "read_file", "parameters": {"path": "x"}}\n{"name": "read_file", "arguments": "{\\"path\\": \\"y\\"}"}'
    assert _calls(text) == [("read_file", {"path": "x"}, "json"), ("read_file", {"path": "y"}, "json")]


def test_bare_call_objects_in_prose_are_calls():
    text = 'Let me look.\n{"name": "list_files", "arguments": {"path": "."}}\nThen I will answer.'
    rest, calls = read_text_calls(text, SCHEMAS)
    assert [(c.name, c.form) for c in calls] == [("list_files", "json")]
    assert rest == "Let me look.\n\nThen I will answer."


def test_a_fenced_call_object_is_a_call():
    text = '```json\n{"name": "run_command", "arguments": {"command": "wc -l todo.txt"}}\n```'
    assert _calls(text) == [("run_command", {"command": "wc -l todo.txt"}, "fenced_json")]


def test_fenced_arguments_name_the_one_tool_whose_schema_they_fit():
    """The case a real model wrote: the right arguments in a fence, without the call's wrapper."""
    text = 'To count them:\n```json\n{"command": "wc -l todo.txt", "timeout": 30}\n```'
    rest, calls = read_text_calls(text, SCHEMAS)
    assert [(c.name, orjson.loads(c.arguments), c.form) for c in calls] == [
        ("run_command", {"command": "wc -l todo.txt", "timeout": 30}, "fenced_arguments")
    ]
    assert rest == "To count them:"


@pytest.mark.parametrize(
    "content",
    [
        '{"path": "notes.md"}',  # read_file and list_files both fit: never guessed
        '{"query": "weather"}',  # no tool declares it
        '{"command": "ls", "shell": "zsh"}',  # a key run_command does not declare
        '{"content": "x"}',  # write_file requires path
        "{}",
        '["command", "ls"]',
        "wc -l todo.txt",
    ],
)
def test_fenced_text_that_fits_no_single_tool_stays_text(content):
    text = f"Here:\n```\n{content}\n```"
    assert read_text_calls(text, SCHEMAS) == (text, [])


def test_tags_take_precedence_and_fences_inside_a_tag_are_read():
    text = '<tool_call>\n```json\n{"name": "read_file", "arguments": {"path": "a"}}\n```\n</tool_call>'
    assert _calls(text) == [("read_file", {"path": "a"}, "tool_call_tag")]


@pytest.mark.parametrize(
    "text",
    [
        "The answer is 42.",
        'A JSON example: {"name": "Ada", "age": 36}',
        '{"name": "read_file"}',
        '{"name": "read_file", "arguments": [1]}',
        '{"name": "read_file", "arguments": {}, "extra": 1}',
        "{not json",
        "<tool_call",
        "",
    ],
)
def test_text_without_a_call_is_left_alone(text):
    assert read_text_calls(text, SCHEMAS) == (text, [])


def test_fits_schema_needs_declared_keys_and_required_ones():
    schema = SCHEMAS["write_file"]
    assert fits_schema({"path": "a", "content": "b"}, schema)
    assert not fits_schema({"path": "a"}, schema)
    assert not fits_schema({"path": "a", "content": "b", "mode": "w"}, schema)
    assert not fits_schema({"path": "a"}, {"type": "object"})
    assert not fits_schema("a", schema)


def _message(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def test_a_reply_becomes_function_calls_with_stable_ids_and_its_form():
    output = [
        _message('Counting.\n<tool_call>{"name": "run_command", "arguments": {"command": "wc -l a"}}</tool_call>')
    ]
    items = calls_from_text(output, SCHEMAS, step=3)
    assert items is not None
    assert items[0]["content"][0]["text"] == "Counting."
    call = items[1]
    assert call["type"] == "function_call" and call["name"] == "run_command"
    assert call["call_id"] == "call_text_s3_0" and call["text_call"] == "tool_call_tag"
    assert calls_from_text(output, SCHEMAS, step=3) == items  # the same on every read of the stored reply


def test_a_reply_with_function_calls_or_without_call_text_is_unchanged():
    fc = {"type": "function_call", "call_id": "c", "name": "read_file", "arguments": "{}"}
    tagged = _message('<tool_call>{"name": "read_file", "arguments": {"path": "a"}}</tool_call>')
    assert calls_from_text([tagged, fc], SCHEMAS, step=0) is None
    assert calls_from_text([_message("Done: 3 lines.")], SCHEMAS, step=0) is None
    assert calls_from_text([], SCHEMAS, step=0) is None


@pytest.mark.parametrize(
    "message",
    [
        "The model produced output that does not match the expected peg-native format",
        'error parsing tool call: raw=\'{"name": "x"\', err=unexpected end of JSON input',
    ],
)
def test_a_servers_refusal_of_the_models_output_is_model_output_not_retried(message):
    """llama.cpp and Ollama, in a stream frame or an HTTP 500: the same request gives the same
    output, so it is never retried, and it is counted as the model's, not as transport."""
    assert is_model_output_error(message)
    for error in (
        GatewayError(f"model stream error server_error: {message}", retryable=True),
        status_error_of(500, message),
    ):
        assert error.model_output and not error.retryable
    assert metrics.gateway_error_class(500, model_output=True) == "model_output"
    assert metrics.turn_reason("failed", "the model's output could not be read by the model server 3 times") == (
        "model_output"
    )


def test_other_server_errors_keep_their_class():
    error = status_error_of(500, "failed to load the model")
    assert error.retryable and not error.model_output
    assert metrics.gateway_error_class(None) == "transport"
