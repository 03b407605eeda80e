"""Round 4 of real malformed calls and provider schemas: each kind fixed as a kind.

Arguments (fixtures/cases/malformed-arguments-4.json, shared; ours-arguments-round4.json, ours from
public reports), each run on a raw-schema tool AND on a pydantic tool with the same fields: integral
floats for integer fields, no arguments at all, refusals the model can act on. Schemas
(provider-schema-rejections-3.json, shared; ours-provider-round4.json), each through every provider
profile and checked by the independent checker (tests/support/provider_rules.py): Gemini's object
nodes at every level, OpenAI strict mode's documented limits, a root "at least one of these fields"."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.provider_rules import violations
from tests.support.schema_models import model_from_schema
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.errors import ToolDefinitionError
from worker.tooling.schemas import function_definition, parameters_schema
from worker.tooling.wire_profiles import PROVIDERS

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
SHARED_ARGS = json.loads((CASES_DIR / "malformed-arguments-4.json").read_text())
OUR_ARGS = json.loads((CASES_DIR / "ours-arguments-round4.json").read_text())
SHARED_SCHEMAS = json.loads((CASES_DIR / "provider-schema-rejections-3.json").read_text())
OUR_SCHEMAS = json.loads((CASES_DIR / "ours-provider-round4.json").read_text())
ARG_KINDS = {"integral-float-for-integer", "null-arguments", "actionable-messages"}
SCHEMA_KINDS = {"gemini-objects", "openai-strict-limits", "presence-only-root"}


def _tool(schema: dict[str, Any], kind: str, name: str = "case_tool", strict: bool = False):
    source = {"json_schema": schema} if kind == "raw" else {"input_model": model_from_schema(schema, open_extra=None)}
    return define_worker_tool(
        name=name, description="test tool", execute=lambda p, c: ToolResult("ok"), strict=strict, **source
    )


def _types(value: Any) -> Any:
    """``value`` with every number replaced by its Python type's name (``exact_types``)."""
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value).__name__


def _check_arguments(case: dict[str, Any], kind: str) -> None:
    assert case["id"] and case["source"].startswith("https://")  # every fixture keeps its id and source
    tool = _tool(case["schema"], kind, case.get("tool") or "case_tool")
    out = validate_tool_arguments(tool, case["raw"], response_status=case["response_status"])
    if case["expected"] is None:
        assert not out.ok and out.params is None and tool.name in out.error, (case["id"], kind, out.data)
        for text in case.get("error_contains_all", [case.get("error_contains") or ""]):
            assert text in out.error, (case["id"], kind, out.error)
        return
    assert out.ok, (case["id"], kind, out.error)
    data = {k: v for k, v in out.data.items() if k in case["expected"] or v is not None}
    assert data == case["expected"], (case["id"], kind, data)
    assert _types(data) == _types(case["expected"]), (case["id"], kind, data)  # 3 is an int, 2.0 a float
    assert out.repairs == case.get("repairs", ["coerced:upstream_depth", "coerced:downstream_depth"]), out.repairs


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", SHARED_ARGS, ids=[c["id"] for c in SHARED_ARGS])
def test_shared_round4_arguments(case, kind):
    _check_arguments(case, kind)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", OUR_ARGS, ids=[c["id"] for c in OUR_ARGS])
def test_our_round4_arguments(case, kind):
    _check_arguments(case, kind)


def test_every_argument_kind_has_passing_and_refused_cases():
    assert {c["kind"] for c in OUR_ARGS} == ARG_KINDS
    for kind in ARG_KINDS:
        mine = [c for c in OUR_ARGS if c["kind"] == kind]
        assert len(mine) >= 5 and any(c["expect_error"] for c in mine) and not all(c["expect_error"] for c in mine)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_an_integral_float_in_an_incomplete_response_is_cut_off_for_both_kinds(kind):
    """One rule: a call that needs a repair in a response cut at the token limit does not run."""
    tool = _tool({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}, kind)
    out = validate_tool_arguments(tool, '{"n": 3.0}', response_status="incomplete")
    assert not out.ok and out.error_kind == "cut_off"


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_no_arguments_read_as_empty_on_every_input_form(kind):
    tool = _tool({"type": "object", "properties": {}}, kind)
    for raw in (None, "", "  "):
        out = validate_tool_arguments(tool, raw)
        assert out.ok and out.data == {} and out.repairs == [], raw


def test_a_reply_without_arguments_is_recorded_with_empty_arguments():
    """Every wire path hands validation the same thing: the Responses item's missing or null
    ``arguments`` is recorded as "" (replayable: the API takes only a string back)."""
    from worker.model.items import normalize_reply_calls

    items, calls = normalize_reply_calls(
        [
            {"type": "function_call", "call_id": "a", "name": "t", "arguments": None},
            {"type": "function_call", "call_id": "b", "name": "t"},
            {"type": "function_call", "call_id": "c", "name": "t", "arguments": {"x": 1}},
        ],
        set(),
    )
    assert [i["arguments"] for i in items] == ["", "", '{"x":1}']
    assert [c["arguments"] for c in calls] == ["", "", '{"x":1}']


# ---- schemas ----------------------------------------------------------------------------------


def _refusal_mark(rule: str) -> str:
    return {"P1": "the root schema uses anyOf", "G4": "rule G4"}.get(
        rule, f"({rule})" if rule[0] == "L" else f"{rule}:"
    )


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", OUR_SCHEMAS, ids=[c["id"] for c in OUR_SCHEMAS])
def test_our_round4_schema(case, provider):
    assert case["id"] and case["source"].startswith("https://")
    expected = case["outcome"][provider]
    try:  # defined plain, then strict as the case says, so each profile's own outcome shows
        tool = dataclasses.replace(_tool(case["schema"], "raw", case["tool"]), strict=case["strict"])
        params = parameters_schema(tool, provider)
    except ToolDefinitionError as exc:
        assert expected != "ok", (case["id"], provider, str(exc))
        assert _refusal_mark(expected) in str(exc), (case["id"], provider, str(exc))
        return
    assert expected == "ok", (case["id"], provider, params)
    assert not violations(params, provider, case["strict"]), (case["id"], provider, violations(params, provider, True))
    if "valid_args" in case:  # the copy's form (JSON text for a free-form object) validates to the object
        out = validate_tool_arguments(tool, json.dumps(case["valid_args"]))
        assert out.ok and out.data == case["expected_data"], (case["id"], out.error)
    if "invalid_args" in case:  # what the copy states in a description, validation still holds
        out = validate_tool_arguments(tool, json.dumps(case["invalid_args"]))
        assert not out.ok and case["error_contains"] in out.error, (case["id"], out.error)


@pytest.mark.parametrize("provider", ["gemini", "any"])
@pytest.mark.parametrize("case", SHARED_SCHEMAS, ids=[c["id"] for c in SHARED_SCHEMAS])
def test_shared_round4_schema_has_properties_at_every_level(case, provider):
    tool = _tool(case["schema"], "raw", case["tool"])
    params = parameters_schema(tool, provider)
    assert not violations(params, provider, False), violations(params, provider, False)
    query = params["properties"]["query"]
    assert query["type"] == "string" and "JSON" in query["description"] and "JsonLogic" in query["description"]
    logic = {"glob": ["*.md", {"var": "path"}]}
    out = validate_tool_arguments(tool, json.dumps({"query": json.dumps(logic)}))
    assert out.ok and out.data == {"query": logic} and out.repairs == ["decoded_field:query"]
    assert validate_tool_arguments(tool, json.dumps({"query": logic})).data == {"query": logic}  # as sent, too
    assert parameters_schema(tool, "openai")["properties"]["query"]["type"] == "object"  # OpenAI takes it as it is


def test_every_schema_kind_has_cases_kept_and_refused():
    assert {c["kind"] for c in OUR_SCHEMAS} == SCHEMA_KINDS
    for kind in SCHEMA_KINDS:
        outcomes = [o for c in OUR_SCHEMAS if c["kind"] == kind for o in c["outcome"].values()]
        assert "ok" in outcomes and set(outcomes) - {"ok"}, kind


def test_submit_result_falls_back_to_not_strict_naming_the_limit():
    """A result schema over an OpenAI strict limit: the task's submit_result is sent without strict
    mode, its note naming the limit and its source, rather than every request being refused."""
    from worker.records.result_schema import strict_plan

    deep = next(c for c in OUR_SCHEMAS if c["id"].startswith("R4S07"))["schema"]
    strict, note = strict_plan(deep, "openai")
    assert strict is False and "(L2)" in note and "Structured Outputs" in note


def test_a_presence_only_root_reaches_openai_unchanged_and_others_in_words():
    schema = next(c for c in OUR_SCHEMAS if c["id"].startswith("R4S12"))["schema"]
    tool = _tool(schema, "raw", "check_index_coverage")
    assert function_definition(tool, "openai")["parameters"]["anyOf"] == schema["anyOf"]
    for provider in ("anthropic", "gemini", "any"):
        params = function_definition(tool, provider)["parameters"]
        assert "anyOf" not in params and "send at least one of: paths; scopes" in params["description"]
    strict = parameters_schema(dataclasses.replace(tool, strict=True), "openai")
    assert "anyOf" not in strict and "send at least one of: paths; scopes" in strict["description"]


def test_the_pydantic_happy_path_skips_the_bracket_count_only_where_the_model_bounds_depth():
    """Text nested deeper than the limit is refused on every path: a model whose schema bounds the
    depth refuses it itself, any other (recursive, Any) gets the bracket count."""
    from pydantic import BaseModel

    from worker.tooling.model_flags import _bounded_depth

    class Leaf(BaseModel):
        n: int

    class Flat(BaseModel):
        items: list[Leaf]

    class Tree(BaseModel):
        children: list[Tree]

    class Loose(BaseModel):
        value: Any

    assert _bounded_depth(Flat) and not _bounded_depth(Tree) and not _bounded_depth(Loose)
    deep = '{"children": ' + '[{"children": ' * 150 + "[]" + "}]" * 150 + "}"
    for model, raw in ((Tree, deep), (Loose, '{"value": ' + "[" * 150 + "]" * 150 + "}")):
        tool = define_worker_tool(name="t", description="d", execute=lambda p, c: ToolResult("ok"), input_model=model)
        out = validate_tool_arguments(tool, raw)
        assert not out.ok and "nest" in out.error, out.error
