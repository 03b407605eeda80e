"""OpenAI strict-mode conversion: each rule with its input and expected output, and each
definition-time error (rule ids D1-D10 as in fixtures/cases/strict-mode-rules.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.profiles import openai_profile  # noqa: F401 (a fixture)
from worker.tooling.contract import ToolDefinitionError, ToolResult, define_worker_tool
from worker.tooling.schemas import function_definition
from worker.tooling.strict import strict_violations, to_strict_schema

# Strict mode is OpenAI's: the default profile (any) refuses strict tools (rule G4), so these run under openai.
pytestmark = pytest.mark.usefixtures("openai_profile")

RULES = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "cases" / "strict-mode-rules.json").read_text())


def conv(schema):
    return to_strict_schema(schema, tool_name="t")


def _at(schema, dotted):
    for part in dotted.split("."):
        schema = schema[part]
    return schema


def _nullable(node):
    return {"anyOf": [node, {"type": "null"}]}


# openai-agents-python makes every property required but does not add null to formerly
# optional ones (rule D2 notes); we do (an omitted optional value must stay sendable once
# strict mode makes every key required), so where an example's
# property was optional our expected output is theirs with that property nullable.
def _ours(name, out):
    if name in ("test_object_without_additional_properties", "test_typeless_root_is_normalized_to_object"):
        return {**out, "properties": {"a": _nullable({"type": "string"})}}
    if name == "test_nested_nullable_object_preserves_type_union":
        return {**out, "properties": {"key": _nullable({"type": "string"})}}
    return out


@pytest.mark.parametrize(
    "example",
    RULES["openai_agents_examples"],
    ids=[e["source"].split("::")[-1] for e in RULES["openai_agents_examples"]],
)
def test_openai_agents_examples(example):
    name = example["source"].split("::")[-1]
    schema = example["in"]
    if "raises" in example:
        with pytest.raises(ToolDefinitionError):
            conv(schema)
        return
    if schema.get("type") not in (None, "object"):
        # a non-object node is checked as a required property (strict roots must be objects)
        out = conv({"type": "object", "properties": {"x": schema}, "required": ["x"]})
        assert out["properties"]["x"] == _ours(name, example["out"])
        return
    out = conv(schema)
    if "out_at" in example:
        assert _at(out, example["out_at"]) == _ours(name, example["out"])
    else:
        assert out == _ours(name, example["out"])


def test_array_items_default_null_removed():
    ex = next(e for e in RULES["openai_agents_examples"] if e["in"].get("type") == "array")
    out = conv({"type": "object", "properties": {"xs": ex["in"]}, "required": ["xs"]})
    assert out["properties"]["xs"] == ex["out"]


def test_d1_d2_close_objects_and_require_all_with_nullable_optionals():
    out = conv(
        {
            "type": "object",
            "properties": {
                "a": {"type": "string", "description": "A"},
                "b": {"type": "integer", "default": 3},
                "c": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
                "d": {"type": "object", "properties": {"e": {"enum": ["x", "y"]}}, "required": ["e"]},
            },
            "required": ["a"],
        }
    )
    assert out == {
        "type": "object",
        "additionalProperties": False,
        "required": ["a", "b", "c", "d"],
        "properties": {
            "a": {"type": "string", "description": "A"},
            "b": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": 3},
            "c": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "d": {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"e": {"enum": ["x", "y"]}},
                        "required": ["e"],
                        "additionalProperties": False,
                    },
                    {"type": "null"},
                ]
            },
        },
    }
    assert strict_violations(out) == []


def test_d3_ref_with_sibling_is_inlined_bare_ref_kept():
    schema = {
        "type": "object",
        "$defs": {"Star": {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"]}},
        "properties": {"star": {"$ref": "#/$defs/Star", "description": "the star"}, "other": {"$ref": "#/$defs/Star"}},
        "required": ["star", "other"],
    }
    out = conv(schema)
    assert out["properties"]["star"] == {
        "type": "object",
        "properties": {"n": {"type": "string"}},
        "required": ["n"],
        "additionalProperties": False,
        "description": "the star",
    }
    assert out["properties"]["other"] == {"$ref": "#/$defs/Star"}
    assert out["$defs"]["Star"]["additionalProperties"] is False
    assert strict_violations(out) == []


def test_d4_oneof_to_anyof_and_single_allof_merged():
    out = conv(
        {
            "type": "object",
            "properties": {
                "v": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
                "w": {"allOf": [{"type": "string", "enum": ["a"]}], "description": "W"},
            },
            "required": ["v", "w"],
        }
    )
    assert out["properties"]["v"] == {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert out["properties"]["w"] == {"type": "string", "enum": ["a"], "description": "W"}


def test_d5_root_typeless_and_empty():
    assert conv({}) == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert conv({"properties": {"a": {"type": "string"}}})["type"] == "object"


def test_d6_only_null_default_dropped():
    out = conv({"type": "object", "properties": {"n": {"type": "integer", "default": 10}}, "required": ["n"]})
    assert out["properties"]["n"] == {"type": "integer", "default": 10}


def test_d7_unsupported_keywords_moved_to_description_but_still_validated():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "minLength": 3, "format": "uri", "description": "Name"}},
        "required": ["name"],
    }
    out = conv(schema)
    assert out["properties"]["name"] == {"type": "string", "description": "Name (minLength=3, format=uri)"}
    from worker.tooling.arguments import validate_tool_arguments

    tool = define_worker_tool(
        name="t", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema, strict=True
    )
    assert not validate_tool_arguments(tool, '{"name": "ab"}').ok  # the tool's own schema still holds


def test_conversion_does_not_modify_input_and_is_idempotent():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    before = json.dumps(schema)
    out = conv(schema)
    assert json.dumps(schema) == before
    assert conv(out) == out


# ---- definition-time errors ---------------------------------------------------------------


def _strict_tool(schema):
    return define_worker_tool(
        name="t", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema, strict=True
    )


@pytest.mark.parametrize(
    "schema,field,words",
    [
        (
            {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": {"type": "integer"}}}},
            "'m'",
            "open map",
        ),  # D9 dict[str, int]
        ({"type": "object", "properties": {"m": {"type": "object", "additionalProperties": True}}}, "'m'", "open map"),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": {}},
            "'<root>'",
            "open map",
        ),
        ({"type": "object", "properties": {"m": {"type": "object"}}}, "'m'", "without declared properties"),
        ({"type": "object", "properties": {"xs": {"type": "array"}}}, "'xs'", "array without a typed 'items'"),  # D8
        ({"type": "object", "properties": {"xs": {"type": "array", "items": {}}}}, "'xs'", "array without"),
        ({"type": "object", "properties": {"v": {"description": "anything"}}}, "'v'", "any JSON value"),
        (
            {
                "type": "object",
                "$defs": {"S": {"type": "string"}},
                "properties": {"s": {"$ref": "#/$defs/S", "minLength": 2}},
            },
            "'s'",
            "constraining sibling",
        ),  # D3
        ({"type": "object", "properties": {"s": {"not": {"type": "string"}}}}, "'s'", "'not'"),
        (
            {"type": "object", "properties": {"a": {"allOf": [{"type": "string"}], "type": "integer"}}},
            "'a'",
            "conflict",
        ),
    ],
)
def test_definition_time_errors_name_field_and_rule(schema, field, words):
    with pytest.raises(ToolDefinitionError) as err:
        _strict_tool(schema)
    msg = str(err.value)
    assert field in msg and words in msg and "strict" in msg and "'t'" in msg


def test_non_local_ref_is_refused_before_strict_conversion():
    # checked for every raw-schema tool (tests/unit/tooling/test_schemas.py), strict or not
    with pytest.raises(ToolDefinitionError) as err:
        _strict_tool({"type": "object", "properties": {"s": {"$ref": "other.json#/S", "description": "x"}}})
    assert "'s'" in str(err.value) and "non-local" in str(err.value)


@pytest.mark.parametrize(
    "schema,words",
    [
        ({"type": ["object", "null"], "properties": {"a": {"type": "string"}}}, "non-nullable object"),  # D5
        ({"anyOf": [{"properties": {"a": {"type": "string"}}}, {"type": "null"}]}, "anyOf"),  # D4 root
    ],
)
def test_root_errors(schema, words):
    with pytest.raises(ToolDefinitionError) as err:
        to_strict_schema(schema, tool_name="t")
    assert words in str(err.value)


def test_circular_ref_with_siblings_and_size_guard():
    schema = {
        "type": "object",
        "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N", "description": "next"}}}},
        "properties": {"n": {"$ref": "#/$defs/N"}},
    }
    with pytest.raises(ToolDefinitionError, match="circular"):
        to_strict_schema(schema, tool_name="t")
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(150):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"]}
    with pytest.raises(ToolDefinitionError, match="nested too deeply"):
        to_strict_schema(deep, tool_name="t")


def test_recursive_bare_ref_is_fine():
    class Node(BaseModel):
        value: int
        children: list["Node"]

    tool = define_worker_tool(
        name="tree", description="d", execute=lambda p, c: ToolResult("ok"), input_model=Node, strict=True
    )
    params = function_definition(tool)["parameters"]
    assert strict_violations(params) == []


def test_validation_uses_own_model_not_strict_copy():
    class M(BaseModel):
        name: str
        tags: list[str] = []

    tool = define_worker_tool(
        name="m", description="d", execute=lambda p, c: ToolResult("ok"), input_model=M, strict=True
    )
    from worker.tooling.arguments import validate_tool_arguments

    out = validate_tool_arguments(tool, '{"name": "a", "tags": null}')
    assert out.ok and out.data == {"name": "a", "tags": []}


# ---- regressions: no strict copy that the rules reject or that changes acceptance -------------


@pytest.mark.parametrize(
    "schema,words",
    [
        (
            {
                "type": "object",
                "properties": {"t": {"type": "array", "prefixItems": [{"type": "integer"}], "items": False}},
            },
            "D8",
        ),
        ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "zzz"]}, "'zzz'"),
        (
            {
                "type": "object",
                "properties": {"o": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}},
            },
            "'b'",
        ),
    ],
)
def test_strict_refuses_copies_that_would_not_be_faithful(schema, words):
    with pytest.raises(ToolDefinitionError) as err:
        to_strict_schema(schema, tool_name="t")
    assert words in str(err.value) and "cannot be strict" in str(err.value)


def test_strict_notes_never_push_a_description_over_the_limit():
    for desc_len in (0, 500, 1000, 1020, 1024, 2000):
        schema = {
            "type": "object",
            "properties": {
                "s": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 10**9,
                    "format": "x" * 3000,
                    "description": "d" * desc_len,
                }
            },
        }
        out = to_strict_schema(schema, tool_name="t")
        desc = out["properties"]["s"]["anyOf"][0].get("description") or out["properties"]["s"].get("description")
        assert len(desc) <= max(1024, desc_len)
        assert not strict_violations(out)
