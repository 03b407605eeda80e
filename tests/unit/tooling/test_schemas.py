"""Schema collection: pydantic signatures (pydantic-model-cases.json), the 18 real raw schemas
(fixtures/cases/schemas/), namespaces, deferred tools and caching."""

from __future__ import annotations

import json
import time
from enum import Enum
from pathlib import Path
from typing import Any, Literal, Mapping

import pytest
from openai.types.responses import FunctionTool, NamespaceTool
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from tests.support.profiles import openai_profile  # noqa: F401 (a fixture)
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import AbortSignal, ToolContext, ToolDefinitionError, ToolResult, define_worker_tool
from worker.tooling.function_tools import call_arguments, function_input_model, function_tool
from worker.tooling.schemas import collect_tool_definitions, function_definition
from worker.tooling.strict import strict_violations

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
PYDANTIC_CASES = {c["id"]: c for c in json.loads((CASES_DIR / "pydantic-model-cases.json").read_text())}
SCHEMA_FILES = sorted((CASES_DIR / "schemas").glob("*.json"))


# ---- the signatures of pydantic-model-cases.json ---------------------------------------------


def simple_function(a: int, b: int = 5):
    """Adds two numbers.

    Args:
        a: The first argument
        b: The second argument
    """
    return a + b


class InnerModel(BaseModel):
    a: int
    b: str


class Foo(TypedDict):
    a: int
    b: str


class OuterModel(BaseModel):
    inner: InnerModel
    foo: Foo


def complex_args_function(model: OuterModel) -> str:
    return f"{model.inner.a}, {model.inner.b}, {model.foo['a']}, {model.foo['b']}"


class MyEnum(str, Enum):
    FOO = "foo"
    BAR = "bar"
    BAZ = "baz"


def enum_and_literal_function(a: MyEnum, b: Literal["a", "b", "c"]) -> str:
    return f"{a.value} {b}"


def gt_le(my_number: int = Field(..., gt=10, le=100)) -> int:
    return my_number * 2


def optional_default_ge(required_param: str, optional_param: float = Field(default=5.0, ge=0.0)) -> str:
    return f"{required_param}: {optional_param}"


def string_constraints(name: str = Field(..., min_length=3, max_length=20, pattern=r"^[A-Za-z]+$")) -> str:
    return f"Hello, {name}!"


def multiple_constraints(
    score: int = Field(..., ge=0, le=100, description="Score from 0 to 100"),
    name: str = Field(default="Unknown", min_length=1, max_length=50),
    factor: float = Field(default=1.0, gt=0.0, description="Positive multiplier"),
) -> str:
    return f"{name} scored {score * factor}"


def varargs_function(x: int, *numbers: float, flag: bool = False, **kwargs: Any):
    return x, numbers, flag, kwargs


def mapping_function(test_one: Mapping[str, int]):
    return test_one


def kwargs_dict_function(**kwargs: dict[str, int]):
    return kwargs


def tuple_varargs_function(*args: tuple[int, ...]):
    return args


FUNCTIONS = {
    "P01-simple-default": simple_function,
    "P02-nested-model-typeddict": complex_args_function,
    "P03-enum-literal": enum_and_literal_function,
    "P04-gt-le": gt_le,
    "P05-optional-default-ge": optional_default_ge,
    "P06-string-constraints": string_constraints,
    "P07-multiple-constraints": multiple_constraints,
    "P08-varargs-kwargs-nonstrict": varargs_function,
    "P09-mapping-rejected-in-strict": mapping_function,
    "P10-kwargs-dict-nonstrict": kwargs_dict_function,
    "P11-tuple-varargs": tuple_varargs_function,
}


def _ctx():
    return ToolContext(turn_id="t", call_id="c", home=Path("."), abort=AbortSignal())


def _at(schema: dict, dotted: str):
    node: Any = schema
    for part in dotted.split("."):
        node = node[part]
    return node


def test_every_pydantic_case_has_a_function():
    assert set(FUNCTIONS) == set(PYDANTIC_CASES)


@pytest.mark.parametrize("case_id", sorted(PYDANTIC_CASES))
@pytest.mark.usefixtures("openai_profile")
def test_pydantic_model_case(case_id):
    case = PYDANTIC_CASES[case_id]
    assert case["source"]
    fn = FUNCTIONS[case_id]
    if "expect" in case:  # P09: open map cannot be strict
        with pytest.raises(ToolDefinitionError) as err:
            function_tool(fn, strict=True)
        msg = str(err.value)
        assert "test_one" in msg and "additionalProperties" in msg
        function_tool(fn, strict=False)  # fine when not strict
        return
    tool = function_tool(fn)
    schema = function_definition(tool)["parameters"]
    for dotted, expected in case.get("schema_expectations", {}).items():
        if dotted == "title":
            assert schema["title"] == expected
        else:
            assert _at(schema, dotted) == expected, dotted
    for valid in case.get("valid", []):
        out = validate_tool_arguments(tool, json.dumps(valid["input"]))
        assert out.ok, out.error
        if isinstance(valid.get("call"), dict):
            assert out.data == valid["call"]
        result = tool.execute(out.params, _ctx()).content
        if "result" in valid:
            assert result == valid["result"]
        if isinstance(valid.get("call"), str):
            assert repr(result) == valid["call"]
    for invalid in case.get("invalid", []):
        out = validate_tool_arguments(tool, json.dumps(invalid))
        assert not out.ok and out.error_kind == "validation"
        assert out.errors and all(e.loc for e in out.errors)


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
def test_strict_function_tool_keeps_defaults_via_null():
    tool = function_tool(simple_function, strict=True)
    params = function_definition(tool)["parameters"]
    assert params["required"] == ["a", "b"] and params["additionalProperties"] is False
    assert {"type": "null"} in params["properties"]["b"]["anyOf"]
    assert strict_violations(params) == []
    out = validate_tool_arguments(tool, '{"a": 3, "b": null}')
    assert out.ok and out.data == {"a": 3, "b": 5} and out.repairs == ["null_as_omitted:b"]
    out = validate_tool_arguments(tool, '{"a": null, "b": 1}')  # a is required: null is an error
    assert not out.ok and out.errors[0].loc == "a"


def test_call_arguments_expands_varargs():
    model = function_input_model(varargs_function)
    args, kwargs = call_arguments(varargs_function, model(x=1, numbers=[2.0], kwargs={"k": 1}))
    assert args == [1, 2.0] and kwargs == {"flag": False, "k": 1}


# ---- raw schemas from public MCP servers and SDKs ---------------------------------------------

# Which schemas cannot be strict, and why (the rest must convert).
NOT_STRICT = {
    "projects_write": "updated_field<anyOf[0]>.value"  # "Any JSON value": untyped subschema
}


def _load(path):
    doc = json.loads(path.read_text())
    return doc


def _strip_added_required(wire, src):
    """``wire`` without the ``required: []`` the wire copy adds where ``src`` has none (rule P4)."""
    if isinstance(wire, dict) and isinstance(src, dict):
        return {
            k: _strip_added_required(v, src.get(k))
            for k, v in wire.items()
            if not (k == "required" and v == [] and "required" not in src)
        }
    if isinstance(wire, list) and isinstance(src, list) and len(wire) == len(src):
        return [_strip_added_required(w, s) for w, s in zip(wire, src)]
    return wire


@pytest.mark.parametrize("path", SCHEMA_FILES, ids=[p.stem for p in SCHEMA_FILES])
@pytest.mark.usefixtures("openai_profile")
def test_raw_schema_sent_intact_when_not_strict(path):
    """Under the openai profile: intact but for P1-P4 (the other profiles: tests/unit/tooling/test_wire_profiles.py)."""
    doc = _load(path)
    assert doc["_source"]
    tool = define_worker_tool(
        name=doc["name"],
        description=doc["description"] or doc["name"],
        execute=lambda p, c: ToolResult("ok"),
        json_schema=doc["parameters"],
    )
    definition = function_definition(tool)
    # intact but for the provider rules (worker.tooling.wire): here only P4, `required` on every object
    assert _strip_added_required(definition["parameters"], doc["parameters"]) == doc["parameters"]
    assert definition["strict"] is False
    FunctionTool.model_validate(definition)


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
@pytest.mark.parametrize("path", SCHEMA_FILES, ids=[p.stem for p in SCHEMA_FILES])
def test_raw_schema_strict_converts_or_fails_clearly(path):
    doc = _load(path)
    original = json.loads(json.dumps(doc["parameters"]))

    def make():
        return define_worker_tool(
            name=doc["name"],
            description=doc["description"] or doc["name"],
            execute=lambda p, c: ToolResult("ok"),
            json_schema=doc["parameters"],
            strict=True,
        )

    if doc["name"] in NOT_STRICT:
        with pytest.raises(ToolDefinitionError) as err:
            make()
        assert NOT_STRICT[doc["name"]] in str(err.value) and "strict" in str(err.value)
        return
    tool = make()
    params = function_definition(tool)["parameters"]
    assert strict_violations(params) == []
    assert doc["parameters"] == original  # the tool's own schema is untouched
    if doc["name"] in ("Query", "Universe"):  # reference strict outputs: unchanged
        assert params == doc["parameters"]


def _tool_for(stem, strict=False):
    doc = _load(CASES_DIR / "schemas" / f"{stem}.json")
    return define_worker_tool(
        name=doc["name"],
        description=doc["description"] or doc["name"],
        execute=lambda p, c: ToolResult("ok"),
        json_schema=doc["parameters"],
        strict=strict,
    )


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
@pytest.mark.parametrize("strict", [False, True])
def test_raw_schema_keywords_enforced_even_when_strict(strict):
    tool = _tool_for("github-mcp__search_repositories", strict)
    ok = validate_tool_arguments(tool, '{"query": "celery"}')
    assert ok.ok
    bad = validate_tool_arguments(tool, '{"query": "x", "perPage": 1000}')
    assert not bad.ok and [e.loc for e in bad.errors] == ["perPage"]
    assert "perPage:" in bad.error and "corrected call" in bad.error


def test_raw_schema_min_items_and_nested_paths():
    tool = _tool_for("github-mcp__set_issue_fields")
    doc = _load(CASES_DIR / "schemas" / "github-mcp__set_issue_fields.json")
    props = doc["parameters"]["properties"]
    arr = next(k for k, v in props.items() if v.get("minItems"))
    base = {
        k: ("o" if v.get("type") == "string" else 1)
        for k, v in props.items()
        if k in doc["parameters"].get("required", []) and k != arr
    }
    out = validate_tool_arguments(tool, json.dumps({**base, arr: []}))
    assert not out.ok and [e.loc for e in out.errors] == [arr]
    out = validate_tool_arguments(tool, json.dumps({**base, arr: [{}]}))
    assert not out.ok and any(e.loc.startswith(f"{arr}[0]") for e in out.errors)


def test_raw_schema_pattern_and_required_location():
    schema = {
        "type": "object",
        "properties": {
            "files": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "pattern": "^[a-z/]+$"}},
                    "required": ["path"],
                },
            }
        },
        "required": ["files"],
    }
    tool = define_worker_tool(name="p", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema)
    out = validate_tool_arguments(tool, '{"files": [{"path": "A.TXT"}, {}]}')
    assert not out.ok
    assert [e.loc for e in out.errors] == ["files[0].path", "files[1].path"]
    assert "files[0].path:" in out.error and "corrected call" in out.error


@pytest.mark.usefixtures("openai_profile")  # strict mode: OpenAI's profile (any refuses it, G4)
def test_edit_file_strict_optional_default_and_null():
    tool = _tool_for("mcp-filesystem__edit_file", strict=True)
    params = function_definition(tool)["parameters"]
    assert "dryRun" in params["required"]
    doc = _load(CASES_DIR / "schemas" / "mcp-filesystem__edit_file.json")
    required = doc["parameters"]["required"]
    args = {k: ("x" if k != "edits" else [{"oldText": "a", "newText": "b"}]) for k in required}
    out = validate_tool_arguments(tool, json.dumps({**args, "dryRun": None}))
    assert out.ok, out.error
    assert "dryRun" not in out.data and out.repairs == ["null_as_omitted:dryRun"]


# ---- namespaces, deferred loading, caching ---------------------------------------------------


def _simple(name, **kw):
    return define_worker_tool(
        name=name,
        description=f"{name} tool",
        execute=lambda p, c: ToolResult("ok"),
        json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        **kw,
    )


def test_namespaces_grouped_and_conform_to_openai_types():
    tools = [
        _simple("a"),
        _simple("gh_issue", namespace="github", namespace_description="GitHub tools"),
        _simple("b"),
        _simple("gh_pr", namespace="github"),
    ]
    defs = collect_tool_definitions(tools)
    assert [d.get("name") for d in defs] == ["a", "github", "b"]
    ns = defs[1]
    assert ns["type"] == "namespace" and ns["description"] == "GitHub tools"
    assert [t["name"] for t in ns["tools"]] == ["gh_issue", "gh_pr"]
    NamespaceTool.model_validate(ns)
    for d in (defs[0], defs[2]):
        FunctionTool.model_validate(d)
        assert d["strict"] is False


def test_deferred_tools_left_out_until_loaded():
    tools = [_simple("a"), _simple("lazy", defer_loading=True), _simple("lazy_ns", namespace="n", defer_loading=True)]
    assert [d["name"] for d in collect_tool_definitions(tools)] == ["a"]
    defs = collect_tool_definitions(tools, loaded=["lazy", "lazy_ns"])
    assert [d["name"] for d in defs] == ["a", "lazy", "n"]
    assert "defer_loading" not in defs[1]


def test_assembling_50_tools_is_cached():
    tools = [_simple(f"tool_{i}", namespace="ns" if i % 5 == 0 else None) for i in range(50)]
    collect_tool_definitions(tools)
    t0 = time.perf_counter()
    for _ in range(200):
        collect_tool_definitions(tools)
    per_turn = (time.perf_counter() - t0) / 200
    assert per_turn < 500e-6, per_turn  # microseconds, not schema generation
    assert function_definition(tools[1]) is function_definition(tools[1])


# ---- regressions: $ref checked at definition time; description limit --------------------------


def _raw(schema, **kw):
    return define_worker_tool(
        name="reftool",
        description=kw.pop("description", "d"),
        execute=lambda p, c: ToolResult("ok"),
        json_schema=schema,
        **kw,
    )


@pytest.mark.parametrize(
    "schema,field,words",
    [
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}}, "'a'", "does not resolve"),
        ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "'a'", "non-local"),
        ({"type": "object", "properties": {"a": {"$ref": "http://example.com/s.json"}}}, "'a'", "non-local"),
        (
            {"type": "object", "properties": {"a": {"type": "array", "items": {"$ref": "#/definitions/X"}}}},
            "'a[]'",
            "does not resolve",
        ),
        (
            {"type": "object", "$defs": {"S": {"$ref": "#/$defs/T"}}, "properties": {"a": {"$ref": "#/$defs/S"}}},
            "$defs.S",
            "does not resolve",
        ),
        ({"type": "object", "properties": {"a": {"anyOf": [{"$ref": "#nowhere"}, {"type": "null"}]}}}, "'a", "anchor"),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/properties/b/type"}, "b": {"type": "string"}}},
            "'a'",
            "non-schema",
        ),
    ],
)
def test_unresolvable_or_remote_refs_fail_at_definition(schema, field, words):
    for strict in (False, True):
        with pytest.raises(ToolDefinitionError) as err:
            _raw(schema, strict=strict)
        assert field in str(err.value) and words in str(err.value) and "'reftool'" in str(err.value)


@pytest.mark.parametrize(
    "schema",
    [
        {
            "type": "object",
            "$defs": {"a/b": {"type": "string"}, "c~d": {"type": "integer"}},
            "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c~0d"}},
        },
        {"type": "object", "$defs": {"S": {"$anchor": "str", "type": "string"}}, "properties": {"x": {"$ref": "#str"}}},
        {
            "$id": "https://example.com/tool.json",
            "type": "object",
            "$defs": {"S": {"type": "string"}},
            "properties": {
                "x": {"$ref": "tool.json#/$defs/S"},
                "y": {"$ref": "https://example.com/tool.json#/$defs/S"},
            },
        },
        {"type": "object", "properties": {"tree": {"type": "array", "items": {"$ref": "#"}}}},
        {
            "type": "object",
            "properties": {"x": {"enum": [{"$ref": "not a schema, just data"}]}, "$ref": {"type": "string"}},
        },
    ],
)
@pytest.mark.usefixtures("openai_profile")
def test_local_refs_are_accepted_and_validate(schema):
    tool = _raw(schema)
    out = validate_tool_arguments(tool, "{}")
    assert out.ok, out.error


def test_description_limit_is_checked_at_definition():
    assert _raw({"type": "object"}, description="x" * 1024)
    with pytest.raises(ToolDefinitionError) as err:
        _raw({"type": "object"}, description="x" * 1025)
    assert "1024" in str(err.value) and "1025" in str(err.value)
