"""Issue 10 item 6: wire schemas a provider accepts (rules P1-P4, ``worker.tooling.wire``).

The provider rejections (fixtures/cases/provider-schema-rejections.json) and cases of our own
(fixtures/cases/ours-provider-rules.json): each wire copy passes its ``wire_check``, or the tool
is refused at definition with a reason naming the real cause; arguments are still validated
against the tool's own schema (a dropped look-around pattern still holds)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.profiles import openai_profile  # noqa: F401 (a fixture)
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.errors import ToolDefinitionError
from worker.tooling.schemas import function_definition
from worker.tooling.strict import strict_violations
from worker.tooling.wire import has_lookaround

# P1-P4 are the rules of OpenAI and OpenAI-compatible relays, strict copies included (the default profile,
# any, refuses strict tools: rule G4): under openai.
pytestmark = pytest.mark.usefixtures("openai_profile")

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
PROVIDER = json.loads((CASES_DIR / "provider-schema-rejections.json").read_text())
OURS = json.loads((CASES_DIR / "ours-provider-rules.json").read_text())

# The provider file lets the runtime either send a fixed copy or refuse at definition; ours:
PROVIDER_OUTCOME = {
    "S01-regex-lookaround-pattern": {"wire_checks": ["no_lookaround_pattern", "has_required_array", "strict_valid"]},
    "S03-nested-multi-entry-allOf-strict": {"wire_checks": ["no_allOf", "has_required_array", "strict_valid"]},
    "S04-root-anyOf-without-type": {"refused_with": "the root schema uses anyOf"},
    "S05-no-required-array-on-no-arg-tool": {"wire_checks": ["has_required_array", "root_type_object"]},
}


def _nodes(schema: Any):
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _is_object(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t)


WIRE_CHECKS = {
    "no_lookaround_pattern": lambda p, src: not any(has_lookaround(n.get("pattern")) for n in _nodes(p)),
    "pattern_kept": lambda p, src: json.dumps(p) == json.dumps(src) or "pattern" in json.dumps(p),
    "no_allOf": lambda p, src: not any("allOf" in n for n in _nodes(p)),
    "root_type_object": lambda p, src: (
        p.get("type") == "object"
        and not any(k in p for k in ("anyOf", "oneOf", "allOf", "not", "if", "then", "else", "enum"))
    ),
    "has_required_array": lambda p, src: all(isinstance(n.get("required"), list) for n in _nodes(p) if _is_object(n)),
    "strict_valid": lambda p, src: strict_violations(p) == [],
    "presence_kept": lambda p, src: p.get("oneOf", p.get("anyOf")) == src.get("oneOf", src.get("anyOf")),
    "presence_in_description": lambda p, src: "one of: a; b" in p.get("description", ""),
}


def _define(name: str, schema: dict[str, Any], strict: bool):
    return define_worker_tool(
        name=name, description="test tool", execute=lambda p, c: ToolResult("ok"), json_schema=schema, strict=strict
    )


def _run(case: dict[str, Any], outcome: dict[str, Any]) -> None:
    assert case["source"] and case["id"]
    name = (case.get("tool") or "case_tool").replace("-", "_")
    if "refused_with" in outcome:
        with pytest.raises(ToolDefinitionError) as err:
            _define(name, case["schema"], case["strict"])
        assert outcome["refused_with"] in str(err.value), str(err.value)
        return
    original = json.loads(json.dumps(case["schema"]))
    params = function_definition(_define(name, case["schema"], case["strict"]))["parameters"]
    assert case["schema"] == original  # the tool's own schema is never changed
    for check in outcome["wire_checks"]:
        assert WIRE_CHECKS[check](params, case["schema"]), (case["id"], check, params)


@pytest.mark.parametrize("case", PROVIDER, ids=[c["id"] for c in PROVIDER])
def test_provider_rejection_case(case):
    outcome = PROVIDER_OUTCOME[case["id"]]
    if "wire_checks" in outcome:
        assert case["wire_check"] in outcome["wire_checks"]  # the file's own check is among ours
    _run(case, outcome)


@pytest.mark.parametrize("case", OURS, ids=[c["id"] for c in OURS])
def test_our_provider_rule_case(case):
    _run(case, case)


def test_every_provider_rule_has_cases():
    assert {c["rule"] for c in OURS} == {"P1", "P2", "P3", "P4", "P5"}
    assert set(PROVIDER_OUTCOME) == {c["id"] for c in PROVIDER}


@pytest.mark.parametrize("strict", [False, True])
def test_dropped_lookaround_is_stated_and_still_enforced(strict):
    case = next(c for c in PROVIDER if c["id"].startswith("S01"))
    tool = _define("bitbucket_create", case["schema"], strict)
    prop = function_definition(tool)["parameters"]["properties"]["bitbucketEmail"]
    assert "pattern" not in prop and "pattern=^(?!" in prop["description"]
    assert validate_tool_arguments(tool, '{"bitbucketEmail": "ann.lee@example.com"}').ok
    out = validate_tool_arguments(tool, '{"bitbucketEmail": "ann..lee@example.com"}')  # the look-ahead refuses it
    assert not out.ok and {e.loc for e in out.errors} == {"bitbucketEmail"}
    assert any("(?!" in e.msg for e in out.errors)  # the pattern error, next to the email format's


def test_merged_allOf_still_validates_against_the_tool_schema():
    case = next(c for c in PROVIDER if c["id"].startswith("S03"))
    tool = _define("notion_update_page", case["schema"], True)
    data = function_definition(tool)["parameters"]["properties"]["data"]
    assert set(data["required"]) == {"page_id", "command"} and data["additionalProperties"] is False
    assert validate_tool_arguments(tool, '{"data": {"page_id": "p", "command": "replace_content"}}').ok
    out = validate_tool_arguments(tool, '{"data": {"page_id": "p"}}')
    assert not out.ok and [e.loc for e in out.errors] == ["data.command"]


def test_root_allOf_is_merged_on_the_wire_and_validated_as_written():
    case = next(c for c in OURS if c["id"].startswith("W08"))
    tool = _define("merged_root", case["schema"], False)
    params = function_definition(tool)["parameters"]
    assert params["type"] == "object" and set(params["properties"]) == {"a", "b"} and params["required"] == ["a"]
    assert not validate_tool_arguments(tool, '{"a": "x", "b": "not an integer"}').ok


def test_schema_already_acceptable_is_sent_as_the_same_object():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert function_definition(_define("same", schema, False))["parameters"] is schema
