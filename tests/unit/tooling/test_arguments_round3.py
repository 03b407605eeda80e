"""Issue 21, arguments round 3: the shared cases (fixtures/cases/malformed-arguments-3.json) and
our own cases of each kind of fault from public reports (fixtures/cases/ours-arguments-round3.json),
each run on a raw-schema tool AND on a pydantic tool with the same fields and pydantic's default
config (unknown keys ignored): one rule for both kinds of tool.

Kinds: markup leaked into a value, stream artifacts, one rule for both kinds of tool, a Python
literal in a string for an object or array field, errors that name the cause. Plus the cap on a
call's arguments (issue 19) and attack tests for the properties the kinds protect."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from tests.support.schema_models import model_from_schema
from worker.tooling.arguments import DEFAULT_MAX_ARGUMENTS_BYTES, validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.markup import leaked_markup

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
SHARED = json.loads((CASES_DIR / "malformed-arguments-3.json").read_text())
OURS = json.loads((CASES_DIR / "ours-arguments-round3.json").read_text())
KINDS = {
    "markup-in-value",
    "stream-artifacts",
    "one-rule-for-both-kinds",
    "python-literal-in-string",
    "errors-name-the-cause",
}
# Where the shared file leaves a choice (``also_right``), the outcome our policy takes.
SHARED_REPAIRS = {"C07-leading-empty-object-stream-artifact": ["leading_empty_object"]}
SHARED_ERRORS = {"C01-ling-markup-swallowed-into-value": "</arg_value><arg_key>"}


def _tool(case: dict[str, Any], kind: str):
    schema = case["schema"]
    source = {"json_schema": schema} if kind == "raw" else {"input_model": model_from_schema(schema, open_extra=None)}
    return define_worker_tool(
        name=case.get("tool") or "case_tool", description="test tool", execute=lambda p, c: ToolResult("ok"), **source
    )


def _declared(data: dict[str, Any], expected: dict[str, Any]) -> dict[str, Any]:
    """``data`` without the ``None`` a pydantic dump adds for optional fields the case does not give."""
    return {k: v for k, v in data.items() if k in expected or v is not None}


def _check(case: dict[str, Any], kind: str, error_contains: str | None, repairs: list[str] | None) -> None:
    assert case["id"] and case["source"]  # every fixture keeps its id and source
    tool = _tool(case, kind)
    out = validate_tool_arguments(tool, case["raw"], response_status=case["response_status"])
    if case["expected"] is None:
        assert not out.ok, (case["id"], kind, out.data, out.repairs)
        assert out.params is None and out.error and tool.name in out.error
        if case["response_status"] == "incomplete":
            assert out.error_kind == "cut_off" and "output-token limit" in out.error, out.error
        if error_contains:
            assert error_contains in out.error, (case["id"], kind, out.error)
        return
    assert out.ok, (case["id"], kind, out.error)
    data = _declared(out.data, case["expected"])
    extra = set(case.get("extra_keys", []))
    if kind == "raw":
        assert extra <= set(data)  # an open schema passes an unknown key on
    else:
        assert not extra & set(data)  # a model that ignores extras drops it
    assert {k: v for k, v in data.items() if k not in extra} == case["expected"], (case["id"], kind)
    assert out.repairs == repairs, (case["id"], kind, out.repairs)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", SHARED, ids=[c["id"] for c in SHARED])
def test_shared_round3_case(case, kind):
    _check(case, kind, SHARED_ERRORS.get(case["id"]), SHARED_REPAIRS.get(case["id"]))


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize("case", OURS, ids=[c["id"] for c in OURS])
def test_our_round3_case(case, kind):
    _check(case, kind, case.get("error_contains"), case.get("repairs"))


def test_every_kind_has_cases_that_pass_and_cases_that_are_refused():
    assert {c["kind"] for c in OURS} == KINDS
    for kind in KINDS:
        mine = [c for c in OURS if c["kind"] == kind]
        assert len(mine) >= 5, kind
        assert any(c["expect_error"] for c in mine), kind
        assert all(c["source"].startswith("https://") or "(ours)" in c["source"] for c in mine)
    public = [c for c in OURS if c["source"].startswith("https://")]
    assert len(public) >= 0.9 * len(OURS)  # nearly all from public reports
    for c in OURS:
        if not c["expect_error"]:
            assert "repairs" in c, c["id"]


# ---- markup in a value: what is a leak and what is content ------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "a</arg_value><arg_key>b</arg_key><arg_value>c",
        "x</parameter>\n<parameter=path>\ny",
        "x</parameter>\n<parameter name='path'>y",
        'text</notes>\n<parameter name="tags">a',
        "ls<|tool_call_end|><|tool_call_begin|>functions.x:1",
        "done<|channel|>analysis",
        "ls -la<|call|>",
        "ls -la<|im_end|>",
        "<arg_value>100",
        "value</arg_value>",
        "print(1)\n</function>\n</tool_call>",
        "<\uff5ctool\u2581call\u2581end\uff5c>rest",
    ],
)
def test_leaked_structure_is_found(value):
    assert leaked_markup(value)


@pytest.mark.parametrize(
    "value",
    [
        "grep -n '</tool_call>' parser.py",
        "echo '<div>hi</div>' > a.html",
        "<config><parameter>x</parameter></config>",
        "r'<parameter=edits>\\n(.*?)\\n</parameter>'",
        "tokenizer.encode('<|tool_call_begin|>')",
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello<|im_end|>",
        "<|endoftext|>",
        "x < y and y > z",
        "a [TOOL_CALLS] b",
        "",
    ],
)
def test_markup_that_is_content_passes(value):
    assert leaked_markup(value) is None


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_markup_in_a_nested_value_is_found_and_located(kind):
    schema = {
        "type": "object",
        "properties": {
            "edits": {"type": "array", "items": {"type": "object", "properties": {"text": {"type": "string"}}}}
        },
    }
    tool = _tool({"schema": schema, "tool": "apply"}, kind)
    out = validate_tool_arguments(tool, json.dumps({"edits": [{"text": "ok"}, {"text": "a</arg_value><arg_key>b"}]}))
    assert not out.ok and "edits[1].text" in out.error


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_markup_hidden_behind_unicode_escapes_is_found(kind):
    tool = _tool({"schema": {"type": "object", "properties": {"q": {"type": "string"}}}, "tool": "s"}, kind)
    raw = json.dumps({"q": "a</arg_value><arg_key>b"}).replace("<", "\\u003c")
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and "markup" in out.error


# ---- one rule for both kinds of tool: attack tests ---------------------------------------------


class Query(BaseModel):
    """Default pydantic config: unknown keys are ignored (what the issue found bypassing the checks)."""

    query: str
    limit: int = 10


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
@pytest.mark.parametrize(
    "raw",
    [
        '{"query": "x", "<|channel|>": "commentary"}',
        '{"query": "x", "</parameter": ""}',
        '{"query": "x", "<parameter=limit>": "5"}',
        '{"query": "x", "[TOOL_CALLS]": []}',
        '{"query": "x", "limit": 1, "<\uff5cend\uff5c>": 1}',
        '{"query": "x", "Limit": 3}',
        '{"query": "x", "LIMIT": 3}',
    ],
)
def test_markup_and_respelled_keys_get_one_treatment(kind, raw):
    """Before: the pydantic tool ran these (its model dropped the key unseen); the raw tool refused
    the markup ones. Broken, one of the two kinds would run the call."""
    kwargs = {"input_model": Query} if kind == "pydantic" else {"json_schema": Query.model_json_schema()}
    tool = define_worker_tool(name="search", description="d", execute=lambda p, c: ToolResult("ok"), **kwargs)
    out = validate_tool_arguments(tool, raw)
    assert not out.ok and out.error_kind == "parse", (kind, raw, out.data)


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_an_alias_and_its_field_name_are_both_parameters(kind):
    from pydantic import ConfigDict, Field

    class Aliased(BaseModel):
        model_config = ConfigDict(populate_by_name=True)
        thread_id: str = Field(alias="threadId")

    kwargs = {"input_model": Aliased} if kind == "pydantic" else {"json_schema": Aliased.model_json_schema()}
    tool = define_worker_tool(name="t", description="d", execute=lambda p, c: ToolResult("ok"), **kwargs)
    assert validate_tool_arguments(tool, '{"threadId": "a"}').ok
    if kind == "pydantic":  # the model also takes its field name: not a respelling to refuse
        assert validate_tool_arguments(tool, '{"thread_id": "a"}').ok


def test_happy_path_still_takes_a_model_that_allows_extras():
    from pydantic import ConfigDict

    class Open(BaseModel):
        model_config = ConfigDict(extra="allow")
        q: str

    tool = define_worker_tool(name="o", description="d", execute=lambda p, c: ToolResult("ok"), input_model=Open)
    out = validate_tool_arguments(tool, '{"q": "a", "other": 1}')
    assert out.ok and out.data == {"q": "a", "other": 1}


# ---- the cap on a call's arguments (issue 19) ----------------------------------------------------


class WriteFile(BaseModel):
    path: str
    content: str


@pytest.mark.parametrize("kind", ["raw", "pydantic"])
def test_arguments_over_the_cap_are_refused_before_anything_runs(kind):
    """A 20 MB write_file was accepted (and cost Redis about 105 MB). Over the cap: refused, the
    error naming the size, the limit and the setting; at the cap: accepted."""
    kwargs = {"input_model": WriteFile} if kind == "pydantic" else {"json_schema": WriteFile.model_json_schema()}
    tool = define_worker_tool(name="write_file", description="d", execute=lambda p, c: ToolResult("ok"), **kwargs)
    big = json.dumps({"path": "a.txt", "content": "x" * (20 * 1024 * 1024)})
    out = validate_tool_arguments(tool, big)
    assert not out.ok and out.error_kind == "too_large"
    assert "AGENT_MAX_ARGUMENTS_BYTES" in out.error and f"{DEFAULT_MAX_ARGUMENTS_BYTES:,}" in out.error
    assert len(out.error) < 5_000  # the echo of the arguments stays capped
    cap = 1000
    fits = json.dumps({"path": "a.txt", "content": "é" * 100}, ensure_ascii=False)  # 2 bytes per character in UTF-8
    assert validate_tool_arguments(tool, fits, max_arguments_bytes=cap).ok
    over = json.dumps(
        {"path": "a.txt", "content": "é" * 490}, ensure_ascii=False
    )  # under 1000 characters, over 1000 bytes
    out = validate_tool_arguments(tool, over, max_arguments_bytes=cap)
    assert len(over) < cap and not out.ok and out.error_kind == "too_large"


def test_a_stream_artifact_never_hides_a_second_call():
    """Dropping a cut copy must never drop a different call: only a prefix of the one object goes."""
    tool = _tool({"schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}, "tool": "run"}, "raw")
    for raw in (
        '{"cmd": "ls"}{"cmd": "rm -rf /tmp/x',  # not a prefix of the first object
        '{"cmd": "ls"}{"other": 1',
        '{"cmd": "rm{"cmd": "ls"}',  # the leading piece is not a prefix of the object that follows
    ):
        assert not validate_tool_arguments(tool, raw).ok, raw
