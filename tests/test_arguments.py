"""validate_tool_arguments: happy path, feedback to the model, strict nulls, and the tool-search tool."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field

from worker.arguments import DEFAULT_MAX_RAW_ECHO, FieldError, validate_params, validate_tool_arguments
from worker.contract import AbortSignal, ToolContext, ToolResult, define_worker_tool
from worker.schemas import collect_tool_definitions
from worker.tool_search import make_tool_search_tool, rank_tools, with_tool_search


class Todo(BaseModel):
    content: str
    status: str = Field(pattern="^(pending|done)$")


class TodoArgs(BaseModel):
    todos: list[Todo]
    note: str | None = None


def _tool(**kw):
    return define_worker_tool(name=kw.pop("name", "todowrite"), description=kw.pop("description", "write todos"),
                              execute=lambda p, c: ToolResult("ok"), **kw)


def _ctx():
    return ToolContext(turn_id="t", call_id="c", home=Path("."), abort=AbortSignal())


def test_happy_path_pydantic_and_lazy_data():
    tool = _tool(input_model=TodoArgs)
    out = validate_tool_arguments(tool, '{"todos": [{"content": "a", "status": "done"}]}')
    assert out.ok and isinstance(out.params, TodoArgs) and out.repairs == [] and out.error_kind is None
    assert out.data == {"todos": [{"content": "a", "status": "done"}], "note": None}


def test_validation_error_lists_fields_and_asks_for_correction():
    tool = _tool(input_model=TodoArgs)
    out = validate_tool_arguments(tool, '{"todos": [{"content": "a", "status": "later"}, {"status": "done"}]}')
    assert not out.ok and out.error_kind == "validation"
    assert [e.loc for e in out.errors] == ["todos[0].status", "todos[1].content"]
    for e in out.errors:
        assert f"- {e.loc}: {e.msg}" in out.error
    assert "did not run" in out.error and "corrected call" in out.error
    assert '"status": "later"' in out.error  # raw arguments echoed


def test_raw_echo_is_capped():
    tool = _tool(input_model=TodoArgs)
    raw = json.dumps({"todos": "x" * 10_000})
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and len(out.error) < DEFAULT_MAX_RAW_ECHO + 600
    assert "more characters not shown" in out.error
    out = validate_tool_arguments(tool, raw, max_raw_echo=100)
    assert len(out.error) < 800


def test_parse_errors_are_parse_kind_and_never_dispatch_empty():
    tool = _tool(input_model=TodoArgs)
    for raw in ("pwd", "null", "[1]", '{"todos": [', '{"todos": "a"}{"todos": "b"}'):
        out = validate_tool_arguments(tool, raw)
        assert not out.ok and out.params is None and out.error_kind == "parse", raw


def test_non_string_arguments_are_encoded():
    tool = _tool(json_schema={"type": "object", "properties": {"a": {"type": "integer"}}})
    assert validate_tool_arguments(tool, {"a": 1}).data == {"a": 1}


def test_validate_params_public_shape():
    tool = _tool(json_schema={"type": "object", "properties": {"a": {"type": "integer", "minimum": 2}},
                              "required": ["a"]})
    assert validate_params(tool, {"a": 3}) == ({"a": 3}, [])
    params, errors = validate_params(tool, {"a": 1})
    assert params is None and errors == [FieldError("a", errors[0].msg)] and "minimum" in errors[0].msg
    assert validate_params(tool, {})[1][0].loc == "a"


def test_repaired_pydantic_call_reports_repairs():
    tool = _tool(input_model=TodoArgs)
    out = validate_tool_arguments(tool, '```json\n{"todos": []}\n```')
    assert out.ok and out.repairs == ["code_fence"] and out.data["todos"] == []
    out = validate_tool_arguments(tool, '```json\n{"todos": []}\n```', response_status="incomplete")
    assert not out.ok and out.error_kind == "cut_off"


# ---- tool search ------------------------------------------------------------------------------

def _deferred(name, description, namespace=None):
    return define_worker_tool(name=name, description=description, execute=lambda p, c: ToolResult("ok"),
                              json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
                              defer_loading=True, namespace=namespace)


CATALOGUE = [
    _deferred("create_issue", "Create a new GitHub issue in a repository", "github"),
    _deferred("list_pull_requests", "List pull requests of a repository", "github"),
    _deferred("send_email", "Send an email message to a recipient"),
    _deferred("convertTime", "Convert a time between time zones"),
]


def test_with_tool_search_only_when_deferred():
    plain = [_tool(name="a", json_schema={"type": "object"})]
    assert with_tool_search(plain) == plain
    tools = with_tool_search(plain + CATALOGUE)
    search = tools[-1]
    assert search.name == "tool_search" and search.is_read_only and search.execution_mode == "parallel"
    assert "create_issue" in search.description and "send_email" in search.description
    defs = collect_tool_definitions(tools)
    assert [d["name"] for d in defs] == ["a", "tool_search"]
    assert defs[1]["parameters"]["required"] == ["query", "limit"] and defs[1]["strict"] is True


def test_ranking_by_name_and_description_words():
    ranked = [t.name for _, t in rank_tools("create github issue", CATALOGUE)]
    assert ranked[0] == "create_issue"
    assert [t.name for _, t in rank_tools("pull requests", CATALOGUE)][0] == "list_pull_requests"
    assert [t.name for _, t in rank_tools("convert time zone", CATALOGUE)][0] == "convertTime"
    assert rank_tools("email", CATALOGUE)[0][1].name == "send_email"
    assert rank_tools("weather", CATALOGUE) == []


def test_search_returns_definitions_and_loaded_names():
    search = make_tool_search_tool(CATALOGUE)
    out = validate_tool_arguments(search, '{"query": "github issue", "limit": null}')
    assert out.ok, out.error
    assert out.params.limit == 5
    result = search.execute(out.params, _ctx())
    assert result.details["loaded"][0] == "create_issue"
    first = result.content["loaded"][0]
    assert first["name"] == "create_issue" and first["namespace"] == "github" and "parameters" in first
    # the loop adds the names to ``loaded``: the tools are then sent for the rest of the turn
    defs = collect_tool_definitions(with_tool_search(CATALOGUE), loaded=result.details["loaded"])
    assert any(d.get("type") == "namespace" and d["tools"][0]["name"] == "create_issue" for d in defs)
    none = search.execute(validate_tool_arguments(search, '{"query": "weather", "limit": 2}').params, _ctx())
    assert none.details == {"loaded": []} and "send_email" in none.content["message"]


def test_search_limit_enforced():
    search = make_tool_search_tool(CATALOGUE)
    out = validate_tool_arguments(search, '{"query": "x", "limit": 100}')
    assert not out.ok and out.errors[0].loc == "limit"
