"""validate_tool_arguments: happy path, feedback to the model, strict nulls, and the tool-search tool."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from tests.support.profiles import openai_profile  # noqa: F401 (a fixture)
from worker.tooling.arguments import DEFAULT_MAX_RAW_ECHO, FieldError, validate_params, validate_tool_arguments
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, define_worker_tool
from worker.tooling.schemas import collect_tool_definitions
from worker.tooling.tool_search import make_tool_search_tool, rank_tools, with_tool_search


class Todo(BaseModel):
    content: str
    status: str = Field(pattern="^(pending|done)$")


class TodoArgs(BaseModel):
    todos: list[Todo]
    note: str | None = None


def _tool(**kw):
    return define_worker_tool(
        name=kw.pop("name", "todowrite"),
        description=kw.pop("description", "write todos"),
        execute=lambda p, c: ToolResult("ok"),
        **kw,
    )


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
    tool = _tool(
        json_schema={"type": "object", "properties": {"a": {"type": "integer", "minimum": 2}}, "required": ["a"]}
    )
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
    return define_worker_tool(
        name=name,
        description=description,
        execute=lambda p, c: ToolResult("ok"),
        json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        defer_loading=True,
        namespace=namespace,
    )


CATALOGUE = [
    _deferred("create_issue", "Create a new GitHub issue in a repository", "github"),
    _deferred("list_pull_requests", "List pull requests of a repository", "github"),
    _deferred("send_email", "Send an email message to a recipient"),
    _deferred("convertTime", "Convert a time between time zones"),
]


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
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


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
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


# ---- regressions: hostile inputs never raise; storage-safe values; one duplicate-key rule ------

from typing import Any, Literal  # noqa: E402

from worker.tooling.contract import WorkerTool  # noqa: E402
from worker.tooling.repair import MAX_NESTING_DEPTH  # noqa: E402


class AnyData(BaseModel):
    data: dict[str, Any]


class Num(BaseModel):
    x: float


def _raw_tool(schema=None, **kw):
    return _tool(json_schema=schema or {"type": "object"}, **kw)


def _nest(depth):
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "raw,model",
    [
        ('{"a": ' + _nest(1000) + ",}", None),  # ladder (trailing comma) on deep input
        ('{"a": ' + _nest(1100) + "}", None),  # valid JSON beyond orjson's limit
        ('{"a": ' + _nest(300) + "}", None),  # valid JSON that jsonschema would recurse on
        ('{"data": ' + _nest(1100) + "}", AnyData),  # pydantic dict[str, Any]
        ('{"data": {"x": ' + _nest(150) + "}}", AnyData),  # within pydantic's own limit, over ours
        ('"{\\"a\\": ' + "[" * 1100 + "]" * 1100 + '}"', None),  # double encoded
        ('```json\n{"a": ' + '{"b": ' * 600 + "1" + "}" * 600 + ",}\n```", None),
    ],
)
@pytest.mark.usefixtures("openai_profile")
def test_deep_nesting_is_refused_with_the_limit_never_raises(raw, model):
    tool = (
        _tool(input_model=model)
        if model
        else _raw_tool(
            {
                "type": "object",
                "properties": {"a": {"$ref": "#/$defs/n"}},
                "$defs": {
                    "n": {
                        "anyOf": [
                            {"type": "array", "items": {"$ref": "#/$defs/n"}},
                            {"type": "object"},
                            {"type": "integer"},
                        ]
                    }
                },
            }
        )
    )
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and out.error_kind == "parse"
    assert f"nested too deeply (limit {MAX_NESTING_DEPTH}" in out.error


def test_nesting_up_to_the_limit_is_accepted_and_brackets_in_strings_do_not_count():
    out = validate_tool_arguments(_raw_tool(), '{"a": ' + _nest(MAX_NESTING_DEPTH - 1) + "}")
    assert out.ok
    out = validate_tool_arguments(_tool(input_model=AnyData), '{"data": {"s": "' + "[" * 5000 + '"}}')
    assert out.ok and out.data == {"data": {"s": "[" * 5000}}


@pytest.mark.parametrize(
    "raw",
    [
        '{"label": "\\ud800"}',
        '{"label": "\\udfff x"}',
        '{"label": "a\\ud83d"}',
        '{"\\ud800": 1}',
        "{'label': '\\ud800'}",  # through the ladder
        '{"label": "\ud800"}',  # a raw surrogate code point in the str
    ],
)
@pytest.mark.parametrize("model", [None, AnyData])
def test_lone_surrogates_are_refused(raw, model):
    if model is not None:
        raw = '{"data": ' + raw + "}"
    tool = _tool(input_model=model) if model else _raw_tool()
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and "surrogate" in out.error


def test_surrogate_pair_is_accepted_and_storable():
    out = validate_tool_arguments(_tool(input_model=AnyData), '{"data": {"l": "\\ud83d\\ude00"}}')
    assert out.ok and out.data == {"data": {"l": "\U0001f600"}}
    import orjson

    orjson.dumps(out.data)


@pytest.mark.parametrize(
    "raw",
    [
        '```json\n{"path": "a", "path": "b"}\n```',  # fenced
        '"{\\"path\\": \\"a\\", \\"path\\": \\"b\\"}"',  # double encoded
        "{'path': 'a', 'path': 'b'}",  # single quotes
    ],
)
@pytest.mark.parametrize("model", [None, AnyData])
def test_duplicate_keys_are_refused_in_text_that_needs_repair(raw, model):
    tool = _tool(input_model=model) if model else _raw_tool()
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and "repeat the key" in out.error


@pytest.mark.parametrize(
    "raw, expected",
    [
        ('{"data": {"a": 1, "a": 2}}', {"data": {"a": 2}}),
        ('{"data": {"l": [{"k": 1}, {"k": 2, "k": 3}]}}', {"data": {"l": [{"k": 1}, {"k": 3}]}}),
        ('{"data": {"a": 1, "\\u0061": 2}}', {"data": {"a": 2}}),  # same key, one of them escaped
    ],
)
@pytest.mark.parametrize("model", [None, AnyData])
def test_valid_json_keeps_standard_semantics_for_a_repeated_key(raw, expected, model):
    # the last value wins, as in every JSON parser; the value validated is the value executed
    tool = _tool(input_model=model) if model else _raw_tool()
    out = validate_tool_arguments(tool, raw)
    assert out.ok and out.data == expected


def test_repeated_keys_in_different_objects_are_fine():
    raw = json.dumps({"todos": [{"content": "a", "status": "done"}, {"content": "a:b", "status": "done"}]})
    assert validate_tool_arguments(_tool(input_model=TodoArgs), raw).ok


@pytest.mark.parametrize(
    "raw", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e400}', '{"x": -1e999}', "{'x': 1e400}"]
)
@pytest.mark.parametrize("model", [None, Num])
def test_non_json_numbers_are_refused_for_both_kinds_of_tools(raw, model):
    tool = _tool(input_model=model) if model else _raw_tool({"type": "object", "properties": {"x": {"type": "number"}}})
    out = validate_tool_arguments(tool, raw)
    assert not out.ok, out.params
    assert out.error_kind == "parse"
    assert validate_tool_arguments(tool, '{"x": 1e300}').ok


HOSTILE = [
    "",
    " ",
    "null",
    "[]",
    '"x"',
    "{",
    "}",
    "{{{{",
    "]]]]",
    '{"a": "\\',
    "\\" * 5000,
    '{"a": 1, ' + "\\" * 5000 + "}",
    "\x00",
    '{"a": "\x00"}',
    "```",
    "~~~",
    "```json",
    '{"a": 1}```',
    '{"a": ' + "[" * 5000,
    "{" * 5000,
    '{"a": 1}' * 3000,
    "{'a': " + "'" * 3000,
    '{"a": ' + "/*" * 3000,
    '{"a": 123456789012345678901234567890}',
    '{"a": 1' + "0" * 5000 + "}",
    '{"a": 1' + "0" * 5000,
    '{"a": -}',
    '{"\\ud800": "\\udc00"}',
    "\ud800",
]


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
@pytest.mark.parametrize("raw", HOSTILE, ids=range(len(HOSTILE)))
@pytest.mark.parametrize("kind", ["raw", "pydantic", "strict"])
def test_validate_tool_arguments_never_raises(raw, kind):
    if kind == "raw":
        tool = _raw_tool({"type": "object", "properties": {"a": {}}})
    elif kind == "pydantic":
        tool = _tool(input_model=AnyData)
    else:
        tool = _tool(input_model=TodoArgs, strict=True)
    for status in ("completed", "incomplete"):
        out = validate_tool_arguments(tool, raw, response_status=status)
        assert out.ok or out.error
        if out.ok:
            import orjson

            orjson.dumps(out.data)  # what the turn store does


def test_a_broken_schema_at_validation_time_is_an_error_output_not_an_exception():
    # bypasses define_worker_tool (which refuses such a schema) to prove the validation path never raises
    tool = WorkerTool(
        name="broken",
        description="d",
        execute=lambda p, c: ToolResult("ok"),
        json_schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}},
    )
    out = validate_tool_arguments(tool, '{"a": 1}')
    assert not out.ok and "schema could not be applied" in out.error


# ---- strict: null-as-omitted reaches every optional the strict copy made nullable -------------


class Sub(BaseModel):
    a: int
    b: str = "x"


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: int = 9


class Dog(BaseModel):
    kind: Literal["dog"]
    lives: int = 1
    bark: str | None = "woof"


class Nested(BaseModel):
    sub: Sub | None = None
    subs: list[Sub] | None = None
    pet: Cat | Dog | None = Field(None, discriminator="kind")
    plain: Cat | Sub | None = None
    keep: str | None = "k"


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
def test_strict_nulls_are_dropped_through_unions_lists_and_refs():
    tool = _tool(input_model=Nested, strict=True)
    raw = json.dumps(
        {
            "sub": {"a": 1, "b": None},
            "subs": [{"a": 2, "b": None}],
            "pet": {"kind": "dog", "lives": None, "bark": None},
            "plain": {"a": 3, "b": None},
            "keep": None,
        }
    )
    out = validate_tool_arguments(tool, raw)
    assert out.ok, out.error
    assert out.params.sub == Sub(a=1) and out.params.subs == [Sub(a=2)] and out.params.plain == Sub(a=3)
    assert out.params.pet == Dog(kind="dog", lives=1, bark=None)  # bark accepts null: kept
    assert out.params.keep is None  # a nullable field keeps its null
    assert sorted(out.repairs) == [
        "null_as_omitted:pet.lives",
        "null_as_omitted:plain.b",
        "null_as_omitted:sub.b",
        "null_as_omitted:subs[0].b",
    ]
    out = validate_tool_arguments(tool, json.dumps({"pet": {"kind": "cat", "lives": None}, "sub": None}))
    assert out.ok and out.params.pet == Cat(kind="cat") and out.params.sub is None


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
def test_strict_nulls_raw_schema_refs_and_maps_and_required_nulls_still_fail():
    schema = {
        "type": "object",
        "$defs": {
            "S": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                "required": ["a"],
            }
        },
        "properties": {
            "s": {"$ref": "#/$defs/S"},
            "xs": {"type": "array", "items": {"$ref": "#/$defs/S"}},
            "o": {"oneOf": [{"$ref": "#/$defs/S"}, {"type": "string"}]},
            "all": {"allOf": [{"$ref": "#/$defs/S"}]},
        },
        "required": ["s"],
    }
    tool = _raw_tool(schema, strict=True)
    out = validate_tool_arguments(
        tool,
        json.dumps(
            {
                "s": {"a": 1, "b": None},
                "xs": [{"a": 1, "b": None}],
                "o": {"a": 1, "b": None},
                "all": {"a": 1, "b": None},
            }
        ),
    )
    assert out.ok, out.error
    assert out.data == {"s": {"a": 1}, "xs": [{"a": 1}], "o": {"a": 1}, "all": {"a": 1}}
    out = validate_tool_arguments(tool, json.dumps({"s": {"a": None}}))
    assert not out.ok and out.error_kind == "validation"  # required: a null is not "omitted"
    # a non-strict tool never drops nulls
    out = validate_tool_arguments(_raw_tool(schema), json.dumps({"s": {"a": 1, "b": None}}))
    assert not out.ok
