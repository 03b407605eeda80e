"""Issue 10, arguments round 2: the public cases (fixtures/cases/malformed-arguments-2.json) and
our own cases of each kind of fault (fixtures/cases/ours-arguments-round2.json), each run on a
raw-schema tool AND on a pydantic tool built from the same schema: one policy for both kinds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
from pydantic import BaseModel

from tests.support.schema_models import model_from_schema
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.schemas import validation_info

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
PUBLIC = json.loads((CASES_DIR / "malformed-arguments-2.json").read_text())
OURS = json.loads((CASES_DIR / "ours-arguments-round2.json").read_text())

# Where the public file leaves the choice open, the outcome our policy chose (and why).
POLICY = {
    "B13-name-arguments-envelope-collides-with-param": {
        "expected": {"name": "John"},
        "repairs": ["unwrapped_envelope:arguments"],
        "why": "the note allows refusing or unwrapping when the envelope names this tool; issue 10 item 1 unwraps",
    }
}
PUBLIC_REPAIRS = {
    "B02-three-identical-copies": ["duplicate_objects_collapsed"],
    "B07-gpt-oss-harmony-missing-final-brace": ["closed_delimiters"],
    "B08-arguments-as-object": [],
    "B09-number-sent-as-string": ["coerced:pull_number"],
    "B11-deepseek-fence-and-text-after-object": ["trailing_text"],
}


def _tool(case: dict[str, Any], kind: str):
    name = case.get("tool") or "case_tool"
    if kind == "raw":
        return define_worker_tool(
            name=name, description="test tool", execute=lambda p, c: ToolResult("ok"), json_schema=case["schema"]
        )
    return define_worker_tool(
        name=name,
        description="test tool",
        execute=lambda p, c: ToolResult("ok"),
        input_model=model_from_schema(case["schema"], "Args"),
    )


def _prune(data: Any, expected: Any) -> Any:
    """``data`` without the ``None`` a pydantic dump adds for optional fields the case does not give."""
    if isinstance(data, dict) and isinstance(expected, dict):
        return {k: _prune(v, expected.get(k)) for k, v in data.items() if k in expected or v is not None}
    if isinstance(data, list) and isinstance(expected, list) and len(data) == len(expected):
        return [_prune(d, e) for d, e in zip(data, expected)]
    return data


def _check(case: dict[str, Any], kind: str) -> None:
    assert case["source"] and case["id"]  # every fixture keeps its id and source
    tool = _tool(case, kind)
    policy = POLICY.get(case["id"], {})
    expected = policy.get("expected", case["expected"])
    out = validate_tool_arguments(tool, case["raw"], response_status=case["response_status"])
    if expected is None:
        assert not out.ok, (case["id"], kind, out.data, out.repairs)
        assert out.params is None and out.error and tool.name in out.error
        if case["response_status"] == "incomplete":
            assert out.error_kind == "cut_off" and "cut off" in out.error
        if "error_contains" in case:
            assert case["error_contains"] in out.error, out.error
        return
    assert out.ok, (case["id"], kind, out.error)
    assert _prune(out.data, expected) == expected
    repairs = policy.get("repairs", case.get("repairs", PUBLIC_REPAIRS.get(case["id"])))
    assert repairs is not None, f"{case['id']}: give the expected repairs"
    assert out.repairs == repairs, (case["id"], kind, out.repairs)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", PUBLIC, ids=[c["id"] for c in PUBLIC])
def test_public_round2_case(case, kind):
    _check(case, kind)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", OURS, ids=[c["id"] for c in OURS])
def test_our_case_of_each_kind(case, kind):
    _check(case, kind)


def test_every_kind_has_cases_of_ours():
    kinds = {c["kind"] for c in OURS}
    assert kinds == {"markup-or-envelope", "invalid-escapes", "mismatched-closers", "composed-repairs", "coercion"}
    for kind in kinds:
        mine = [c for c in OURS if c["kind"] == kind]
        assert any(c["expect_error"] for c in mine) and any(not c["expect_error"] for c in mine), kind
        assert all("(ours)" in c["source"] for c in mine)


# ---- attack tests: a property that, broken, would run the wrong call --------------------------


class AllOptional(BaseModel):
    sql_query: Optional[str] = None
    limit: Optional[int] = None


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_envelope_for_another_tool_never_runs_an_all_optional_tool(kind):
    """Before: a multi_tool_use envelope ran a pydantic tool with all fields None (fast path)."""
    kwargs = (
        {"input_model": AllOptional}
        if kind == "pydantic"
        else {"json_schema": AllOptional.model_json_schema() | {"additionalProperties": True}}
    )
    tool = define_worker_tool(name="ask_database", description="d", execute=lambda p, c: ToolResult("ok"), **kwargs)
    for raw in (
        '{"tool_uses": [{"recipient_name": "functions.drop_table", "parameters": {"sql_query": "x"}}]}',
        '{"function": {"name": "drop_table", "arguments": "{}"}}',
        '{"name": "drop_table", "arguments": {"sql_query": "DROP TABLE t"}}',
    ):
        out = validate_tool_arguments(tool, raw)
        assert not out.ok and out.error_kind == "parse", (kind, raw, out.data)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_markup_key_never_reaches_an_open_tool(kind):
    schema = {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}
    tool = _tool({"schema": schema, "tool": "exec_command"}, kind)
    for key in ("</parameter", "<|im_start|>", "<tool_call>", "<parameter=cmd>", "[TOOL_CALLS]", "<\uff5cend\uff5c>"):
        raw = json.dumps({"cmd": "ls", key: "x"})
        out = validate_tool_arguments(tool, raw)
        assert not out.ok and "markup" in out.error and repr(key)[1:-1][:10] in out.error, (kind, key, out.error)
        # the same key escaped as \\u003c is caught too
        out = validate_tool_arguments(tool, raw.replace("<", "\\u003c"))
        assert not out.ok and "markup" in out.error, (kind, key)


def test_pydantic_tools_follow_the_one_rule_not_lax_mode():
    class M(BaseModel):
        flag: bool
        n: int

    tool = define_worker_tool(name="m", description="d", execute=lambda p, c: ToolResult("ok"), input_model=M)
    out = validate_tool_arguments(tool, '{"flag": "true", "n": "4"}')
    assert out.ok and out.params == M(flag=True, n=4) and out.repairs == ["coerced:flag", "coerced:n"]
    for raw in ('{"flag": 1, "n": 4}', '{"flag": "yes", "n": 4}', '{"flag": true, "n": "4.5"}'):
        out = validate_tool_arguments(tool, raw)
        assert not out.ok and out.error_kind == "validation", raw  # lax mode accepted all three


def test_coercion_errors_name_the_field_after_lossless_fixes():
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "m": {"type": "string"}},
        "required": ["n", "m"],
    }
    for kind in ("raw", "pydantic"):
        out = validate_tool_arguments(_tool({"schema": schema}, kind), '{"n": "5"}')
        assert not out.ok and [e.loc for e in out.errors] == ["m"], (kind, out.errors)


# ---- raw-schema validation engine -------------------------------------------------------------


def test_raw_schema_tools_use_the_compiled_validator_and_name_each_field():
    schema = {
        "type": "object",
        "$defs": {"item": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
        "properties": {"files": {"type": "array", "items": {"$ref": "#/$defs/item"}}, "n": {"maximum": 3}},
        "required": ["files"],
    }
    tool = _tool({"schema": schema}, "raw")
    assert validation_info(tool).engine == "jsonschema-rs"
    out = validate_tool_arguments(tool, '{"files": [{"path": "a"}, {}], "n": 9}')
    assert not out.ok
    assert [e.loc for e in out.errors] == ["files[1].path", "n"]
    assert out.errors[0].msg == "required property is missing"


def test_a_schema_jsonschema_rs_cannot_compile_falls_back_and_says_so():
    schema = {
        "$schema": "http://json-schema.org/draft-03/schema#",
        "type": "object",
        "properties": {"q": {"type": "string", "required": True}},
    }
    tool = _tool({"schema": schema}, "raw")
    engine = validation_info(tool).engine
    assert engine.startswith("jsonschema (fallback: jsonschema-rs cannot compile this schema")
    assert validate_tool_arguments(tool, '{"q": "x"}').ok
    out = validate_tool_arguments(tool, "{}")
    assert not out.ok and out.errors and "q" in out.errors[0].msg
