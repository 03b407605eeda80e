"""Issue 21 item 2: provider wire profiles (``worker.tooling.wire_profiles``).

Every tool of every catalog, the real schemas (fixtures/cases/schemas/), the provider rejections
(rounds 1 and 2) and our own cases go through each profile (``any``, ``openai``, ``anthropic``,
``gemini``); each wire copy is checked against that provider's rules by an independent checker
(``tests/support/provider_rules.py``), or the definition is refused naming the field's path and
the rule. Arguments are still validated against the tool's own schema, never the copy."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from tests.support import toolsets
from tests.support.profiles import any_profile, default_profile, openai_profile  # noqa: F401 (fixtures)
from tests.support.provider_rules import violations
from worker.settings import Settings
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, ToolServices, WorkerTool, define_worker_tool
from worker.tooling.errors import ToolDefinitionError
from worker.tooling.schemas import function_definition, parameters_schema, source_schema
from worker.tooling.tool_search import make_tool_search_tool
from worker.tooling.wire_profiles import PROVIDERS
from worker.tools.assembly import text_turn_tools, workflow_task_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnSupports

CASES_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "cases"
SCHEMA_FILES = sorted((CASES_DIR / "schemas").glob("*.json"))
REJECTIONS = json.loads((CASES_DIR / "provider-schema-rejections.json").read_text()) + json.loads(
    (CASES_DIR / "provider-schema-rejections-2.json").read_text()
)
OURS = json.loads((CASES_DIR / "ours-provider-profiles.json").read_text())
RESULT_SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


def _catalogs(tmp_path: Path) -> list[WorkerTool]:
    settings = Settings(web_search_url="http://search.invalid/s", web_fetch_enabled=True)
    services = ToolServices(
        enqueue_turn=lambda request, turn_id=None: "t",
        cancel_turn=lambda turn_id: True,
        save_schedule_entry=lambda record: None,
        delete_schedule_entry=lambda schedule_id: None,
    )

    def ctx(workflow_task: bool) -> TurnContext:
        return TurnContext(
            turn_id="t",
            agent_id="a",
            home=tmp_path,
            settings=settings,
            supports=TurnSupports(spawn_jobs=True, brain=True),
            redis=redis_lib.Redis(),  # never connected: building tools does not touch Redis
            services=services,
            metadata={"result_schema": RESULT_SCHEMA, "workflow_task_id": "w1"},
            workflow_task=workflow_task,
        )

    tools = text_turn_tools(ctx(False)) + workflow_task_tools(ctx(True)) + toolsets.testing_tools(ctx(False))
    tools.append(make_tool_search_tool([dataclasses.replace(t, defer_loading=True) for t in tools[:3]]))
    assert len({t.name for t in tools}) >= 30
    return tools


def _nodes(node: Any):
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def test_the_catalogs_hold_the_shapes_the_gemini_rules_rewrite(tmp_path):
    """The catalog test below covers G10 and G11 for real: tools without arguments, and pydantic's
    optional fields (an anyOf beside a title, a description and a default)."""
    tools = _catalogs(tmp_path)
    assert any(not source_schema(t).get("properties") for t in tools)  # G10
    assert any("anyOf" in n and {"title", "default"} <= set(n) for t in tools for n in _nodes(source_schema(t)))


def _check(tool: WorkerTool, provider: str) -> dict[str, Any] | None:
    if tool.strict and provider in ("gemini", "any"):  # strict mode is OpenAI's: refused, naming the setting
        with pytest.raises(ToolDefinitionError, match=f"AGENT_MODEL_PROVIDER={provider}.*G4"):
            function_definition(tool, provider)
        return None
    definition = function_definition(tool, provider)
    if "parameters" not in definition:  # G10: a tool without arguments, declared without parameters
        assert provider == "gemini" and not source_schema(tool).get("properties"), (tool.name, provider)
        return None
    params = definition["parameters"]
    problems = violations(params, provider, tool.strict)
    assert not problems, (tool.name, provider, problems)
    return params


@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_catalog_tool_keeps_every_provider_rules(provider, tmp_path):
    for tool in _catalogs(tmp_path):
        _check(tool, provider)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("path", SCHEMA_FILES, ids=[p.stem for p in SCHEMA_FILES])
@pytest.mark.usefixtures("openai_profile")
def test_real_schemas_through_each_profile(path, provider):
    """Defined under the openai profile (they all load there), then copied for each provider:
    each copy keeps that provider's rules, or the copy is refused naming the path and the rule."""
    doc = json.loads(path.read_text())
    original = json.loads(json.dumps(doc["parameters"]))
    tool = define_worker_tool(
        name=doc["name"], description=doc["description"] or doc["name"], execute=lambda p, c: ToolResult("ok"),
        json_schema=doc["parameters"],
    )  # fmt: skip
    try:
        _check(tool, provider)
    except ToolDefinitionError as exc:
        assert provider in ("any", "gemini"), (provider, str(exc))
        assert "schema path /" in str(exc) and "G" in str(exc).split(";")[1][:4], str(exc)
    assert doc["parameters"] == original  # the tool's own schema is never changed


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", REJECTIONS, ids=[c["id"] for c in REJECTIONS])
@pytest.mark.usefixtures("openai_profile")
def test_provider_rejections_through_each_profile(case, provider):
    assert case["id"] and case["source"]
    try:
        tool = define_worker_tool(
            name=(case.get("tool") or "t").replace("-", "_"), description="d", execute=lambda p, c: ToolResult("ok"),
            json_schema=case["schema"], strict=case["strict"],
        )  # fmt: skip
    except ToolDefinitionError:
        assert case["id"].startswith("S04")  # a root anyOf: refused under every profile (P1)
        return
    _check(tool, provider)


@pytest.mark.parametrize("case", [c for c in REJECTIONS if c["id"].startswith(("C13", "C15"))])
@pytest.mark.usefixtures("any_profile")
def test_round2_rejections_are_fixed_in_the_copy_for_several_providers(case):
    """C13 (const in anyOf) and C15 (a root $schema): Gemini refused both behind an OpenAI-compatible
    proxy; the profile any sends a copy without the keyword, and validation still holds."""
    tool = define_worker_tool(
        name=case["tool"], description="d", execute=lambda p, c: ToolResult("ok"), json_schema=case["schema"]
    )
    params = function_definition(tool)["parameters"]
    keyword = case["wire_check"].split(":", 1)[1]
    assert keyword not in json.dumps(params)
    if case["id"].startswith("C13"):
        assert params["properties"]["mode"]["anyOf"][0]["enum"] == ["single"]
        assert validate_tool_arguments(tool, '{"mode": "parallel"}').ok
        assert not validate_tool_arguments(tool, '{"mode": "serial"}').ok
    else:
        assert validate_tool_arguments(tool, '{"filePath": "a.txt"}').ok


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("case", OURS, ids=[c["id"] for c in OURS])
@pytest.mark.usefixtures("openai_profile")
def test_our_profile_case(case, provider):
    assert case["source"].startswith("https://")
    tool = define_worker_tool(
        name="case_tool", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=case["schema"]
    )
    expected = case["outcome"][provider]
    if expected != "ok":
        with pytest.raises(ToolDefinitionError) as err:
            parameters_schema(tool, provider)
        assert f"{expected}:" in str(err.value) and "schema path /" in str(err.value), str(err.value)
        return
    _check(tool, provider)
    if "invalid_args" in case:  # the copy may state a constraint in a description: validation still holds it
        assert not validate_tool_arguments(tool, json.dumps(case["invalid_args"])).ok


def test_every_rule_has_a_case():
    assert {c["rule"] for c in OURS} >= {"G2", "G3", "G4", "G5", "G6", "G7", "G8", "G9", "G10", "G11", "A1"}


@pytest.mark.usefixtures("any_profile")
def test_the_profile_any_refuses_at_definition_naming_path_and_rule():
    schema = next(c for c in OURS if c["id"].startswith("G06"))["schema"]
    with pytest.raises(ToolDefinitionError) as err:
        define_worker_tool(name="tree_tool", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema)
    text = str(err.value)
    assert "tree_tool" in text and "/properties/tree" in text and "G3" in text and "AGENT_MODEL_PROVIDER" in text


def test_submit_result_falls_back_to_not_strict_under_gemini(tmp_path, monkeypatch):
    from worker.settings import get_settings

    monkeypatch.setenv("AGENT_MODEL_PROVIDER", "gemini")
    get_settings.cache_clear()
    try:
        tool = next(t for t in _catalogs(tmp_path) if t.name == "submit_result")
        assert not tool.strict and not violations(function_definition(tool)["parameters"], "gemini", False)
    finally:
        get_settings.cache_clear()


@pytest.mark.usefixtures("any_profile")
def test_a_strict_tool_is_refused_under_gemini_and_any_and_kept_under_openai_and_anthropic():
    """Strict mode closes every object (additionalProperties: false), which Gemini refuses (G4); the
    profile any keeps Gemini's rules too, so it refuses strict tools, naming the path and the rule."""
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    tool = define_worker_tool(
        name="s", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema, strict=False
    )
    strict = dataclasses.replace(tool, strict=True)
    for provider in ("gemini", "any"):
        with pytest.raises(ToolDefinitionError) as err:
            parameters_schema(strict, provider)
        assert "/additionalProperties" in str(err.value) and "G4" in str(err.value)
        assert f"AGENT_MODEL_PROVIDER={provider}" in str(err.value)
    for provider in ("openai", "anthropic"):
        assert parameters_schema(strict, provider)["additionalProperties"] is False
    with pytest.raises(ToolDefinitionError, match="AGENT_MODEL_PROVIDER=any"):  # the profile in force
        define_worker_tool(name="s2", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema,
                           strict=True)  # fmt: skip


@pytest.mark.usefixtures("any_profile")
def test_tool_search_and_submit_result_fall_back_to_not_strict_under_the_profile_any(tmp_path):
    from worker.records.result_schema import strict_plan
    from worker.tooling.tool_search import make_tool_search_tool

    deferred = [dataclasses.replace(t, defer_loading=True) for t in _catalogs(tmp_path)[:2]]
    assert make_tool_search_tool(deferred).strict is False
    assert next(t for t in _catalogs(tmp_path) if t.name == "submit_result").strict is False
    strict, note = strict_plan(RESULT_SCHEMA)
    assert strict is False and "AGENT_MODEL_PROVIDER=any" in note and "G4" in note
    assert strict_plan(RESULT_SCHEMA, "openai") == (True, None)


@pytest.mark.usefixtures("openai_profile")
def test_tool_search_and_submit_result_are_strict_under_openai(tmp_path):
    from worker.tooling.tool_search import make_tool_search_tool

    deferred = [dataclasses.replace(t, defer_loading=True) for t in _catalogs(tmp_path)[:2]]
    assert make_tool_search_tool(deferred).strict is True
    assert next(t for t in _catalogs(tmp_path) if t.name == "submit_result").strict is True


def test_an_acceptable_schema_is_sent_as_the_same_object_under_every_profile():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    tool = define_worker_tool(
        name="same_everywhere", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema
    )
    for provider in PROVIDERS:
        assert parameters_schema(tool, provider) is schema


@pytest.mark.usefixtures("default_profile")
def test_the_default_profile_is_openai_and_sends_strict_tools_strict(tmp_path):
    """Unset, the profile is the Responses API's own rules (the wire the runtime speaks): a strict
    tool is sent strict, and so are tool_search and submit_result."""
    from worker.records.result_schema import strict_plan
    from worker.tooling.provider_choice import current_choice

    assert current_choice().provider == "openai" and "default" in current_choice().why
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    tool = define_worker_tool(
        name="s3", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema, strict=True
    )
    definition = function_definition(tool)
    assert definition["strict"] is True and definition["parameters"]["additionalProperties"] is False
    deferred = [dataclasses.replace(t, defer_loading=True) for t in _catalogs(tmp_path)[:2]]
    assert make_tool_search_tool(deferred).strict is True
    assert next(t for t in _catalogs(tmp_path) if t.name == "submit_result").strict is True
    assert strict_plan(RESULT_SCHEMA) == (True, None)


@pytest.mark.parametrize(
    ("url", "provider"),
    [
        ("https://api.openai.com/v1", "openai"),
        ("http://127.0.0.1:8080/v1", "openai"),
        ("https://generativelanguage.googleapis.com/v1beta/openai/", "gemini"),
        ("https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/l/endpoints/openapi", "gemini"),
        ("https://api.anthropic.com/v1/", "anthropic"),
        ("https://evil-generativelanguage.googleapis.com.example/v1", "openai"),
    ],
)
def test_a_guess_from_the_endpoint_is_said_with_its_reason(url, provider):
    from worker.tooling.provider_choice import choose, describe

    choice = choose(Settings(openai_base_url=url))
    assert choice.provider == provider
    assert ("guessed" in choice.why) is (provider != "openai")
    lines = describe(choice, ("submit_result", "tool_search"))
    assert lines[0].startswith(f"model provider profile {provider} (")
    assert (len(lines) == 2) is (provider == "gemini")  # only a profile without strict mode names the tools
    explicit = choose(Settings(openai_base_url=url, model_provider="any"))
    assert explicit.provider == "any" and explicit.why == "AGENT_MODEL_PROVIDER=any"
    assert "submit_result, tool_search" in describe(explicit, ("submit_result", "tool_search"))[1]
