"""Workflow tasks through a real Celery worker and a real Redis, with scripted model conversations."""

from __future__ import annotations

import json
import threading
import uuid
from pathlib import Path

import orjson
import pytest

from tests.support.profiles import any_profile, openai_profile  # noqa: F401 (fixtures)
from tests.support.scripts import fc, msg
from tests.support.scripts import output_texts as outputs
from worker.turn.request import TurnStatus

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "population": {"type": "integer", "minimum": 0},
        "note": {"type": "string"},
    },
    "required": ["city", "population"],
    "additionalProperties": False,
}
GOOD = {"city": "Lyon", "population": 522_000}


def submit(value):
    return {"output": [fc("submit_result", {"result": value})]}


@pytest.fixture(scope="module")
def client(control):
    from control.workflow import WorkflowClient

    return WorkflowClient(control)


@pytest.fixture(scope="module")
def any_stack():
    """A worker with ``AGENT_MODEL_PROVIDER=any`` (``--pool solo -c 1``) on a Redis of its own: one copy
    for several providers, which carries no strict mode (Gemini refuses it, rule G4). The suite's
    worker runs with the defaults (the Responses API's own rules: strict mode end to end)."""
    from tests.support.private_stack import PrivateStack

    stack = PrivateStack(AGENT_MODEL_PROVIDER="any")
    try:
        stack.start_worker(pool="solo", concurrency=1)
        yield stack
    finally:
        stack.close()


@pytest.fixture
def any_client(any_stack, request):
    """A workflow client whose tasks run on ``any_stack``; this process plans them under any too."""
    from control.workflow import WorkflowClient

    request.getfixturevalue("any_profile")

    return WorkflowClient(any_stack.control)


@pytest.fixture
def agent():
    return f"wf-{uuid.uuid4().hex[:8]}"


def start(client, gateway, script_name, steps, agent, **kw):
    gateway.add_script(script_name, steps)
    kw.setdefault("result_schema", SCHEMA)
    return client.start_workflow_task(
        agent_id=agent, title="Biggest city", instructions="Find it.", model=script_name, **kw
    )


def non_web(names):
    """Tool names without the web tools (the test environment binds web provider profiles)."""
    return [n for n in names if n not in ("web_search", "web_fetch")]


def requests_for(gateway, model):
    return [r for r in gateway.requests if r["model"] == model]


def test_accepted_submission_commits_the_result(control, gateway, client, script_name, agent):
    """With the defaults (no AGENT_MODEL_PROVIDER), submit_result goes to the model strict: the request
    body the gateway received carries strict: true and the strict copy of the schema."""
    task = start(client, gateway, script_name, [submit(GOOD), {"output": [msg("never asked")]}], agent)
    assert task.status == "queued" and len(task.attempts) == 1
    done = client.wait(task.task_id)
    assert done.status == "succeeded" and done.has_result and done.result == GOOD and done.error is None
    att = done.attempts[0]
    assert att["status"] == "succeeded" and att["turn_status"] == "terminated" and att["submitted"] == GOOD
    turn = control.status(att["turn_id"])
    assert turn.status == TurnStatus.terminated and turn.model_calls == 1
    # the turn: workflow queue, fresh input, finish tool, metadata with the schema
    req = control.store.load(att["turn_id"]).request
    assert req["toolset"] == "workflow_task" and req["queue"] == "workflow" and req["finish_tool"] == "submit_result"
    assert req["metadata"] == {"workflow_task_id": task.task_id, "attempt": 1, "result_schema": SCHEMA}
    # what the model saw: the fixed catalog, submit_result strict with the wrapped schema
    body = requests_for(gateway, script_name)[0]
    assert non_web([t["name"] for t in body["tools"]]) == ["submit_result"]
    sub = body["tools"][-1]
    assert sub["strict"] is True
    assert sub["parameters"]["required"] == ["result"] and sub["parameters"]["additionalProperties"] is False
    # strict copy: the optional 'note' became required + nullable
    assert sub["parameters"]["properties"]["result"]["required"] == ["city", "population", "note"]
    assert outputs(control, att["turn_id"]) == ["Result accepted. The task is complete; no further action is needed."]


def test_the_profile_any_sends_submit_result_not_strict_and_says_why(
    any_stack, gateway, any_client, script_name, agent
):
    """Under the profile any strict mode cannot be sent (Gemini refuses its closed objects, rule G4):
    the task records why, the model gets the copy every provider takes, the submission is still
    validated against the task's schema, and the worker said at start which tools lost strict mode."""
    control, client = any_stack.control, any_client
    task = start(client, gateway, script_name, [submit({"city": "Lyon"}), submit(GOOD)], agent)
    assert task.strict is False and "AGENT_MODEL_PROVIDER=any" in task.strict_note and "G4" in task.strict_note
    done = client.wait(task.task_id)
    assert done.status == "succeeded" and done.result == GOOD
    assert "result.population" in outputs(control, done.attempts[0]["turn_id"])[0]
    sub = requests_for(gateway, script_name)[0]["tools"][-1]
    assert sub["name"] == "submit_result" and sub["strict"] is False
    assert "additionalProperties" not in json.dumps(sub["parameters"])
    log = any_stack.logs[-1].read_text()
    assert "strict mode is off under profile any" in log and "submit_result, tool_search" in log


def test_schema_rejection_names_fields_then_corrected_submission(control, gateway, client, script_name, agent):
    steps = [submit({"city": 7, "population": -3}), submit(GOOD)]
    done = client.wait(start(client, gateway, script_name, steps, agent).task_id)
    assert done.status == "succeeded" and done.result == GOOD
    turn_id = done.attempts[0]["turn_id"]
    first = outputs(control, turn_id)[0]
    assert "result.city" in first and "result.population" in first and "submit_result" in first
    assert "did not run" in first
    assert control.status(turn_id).model_calls == 2


def test_prose_gets_one_repair_instruction_then_submission(control, gateway, client, script_name, agent):
    steps = [{"output": [msg("The answer is Lyon.")]}, submit(GOOD)]
    done = client.wait(start(client, gateway, script_name, steps, agent).task_id)
    assert done.status == "succeeded" and done.result == GOOD
    second = requests_for(gateway, script_name)[1]
    last = second["input"][-1]
    assert last["role"] == "user" and "submit_result" in str(last["content"])
    assert [e["kind"] for e in control.events(done.attempts[0]["turn_id"])].count("repair_instruction") == 1


def test_prose_twice_fails_the_task_with_the_reason(control, gateway, client, script_name, agent):
    steps = [{"output": [msg("Lyon.")]}, {"output": [msg("I said Lyon.")]}, submit(GOOD)]
    done = client.wait(start(client, gateway, script_name, steps, agent).task_id)
    assert done.status == "failed" and not done.has_result
    assert "without calling submit_result twice" in done.error
    att = done.attempts[0]
    assert att["status"] == "failed" and att["turn_status"] == "failed" and "submitted" not in att
    assert len(requests_for(gateway, script_name)) == 2


def test_commit_revalidates_against_the_persisted_schema(control, gateway, client, script_name, agent):
    """The schema changes between start and submit: the provider-side gate passes, the commit refuses."""
    task_id = f"wf_test_{uuid.uuid4().hex[:8]}"
    changed = {
        **SCHEMA,
        "required": ["city", "population", "country"],
        "properties": {**SCHEMA["properties"], "country": {"type": "string"}},
    }

    def change_then_submit(body):
        control.redis.hset(f"workflow:{task_id}", "result_schema", orjson.dumps(changed))
        return submit(GOOD)

    done = client.wait(start(client, gateway, script_name, [change_then_submit], agent, task_id=task_id).task_id)
    assert done.status == "failed" and not done.has_result
    assert "persisted result schema" in done.error and "country" in done.error
    att = done.attempts[0]
    assert att["turn_status"] == "terminated" and att["submitted"] == GOOD  # kept for inspection
    # the turn itself accepted the value (validated against the schema in its metadata)
    assert control.status(att["turn_id"]).status == TurnStatus.terminated


def test_invalid_arguments_budget_fails_the_attempt(control, gateway, client, script_name, agent):
    bad = submit({"city": "Lyon"})
    done = client.wait(start(client, gateway, script_name, [bad, bad, bad, submit(GOOD)], agent).task_id)
    assert done.status == "failed" and "invalid_arguments" in done.error and "submit_result" in done.error


def test_retry_runs_a_fresh_attempt_after_a_failure(control, gateway, client, script_name, agent):
    calls = {"n": 0}

    def first_step(body):
        calls["n"] += 1
        return {"output": [msg("no")]} if calls["n"] == 1 else submit(GOOD)

    task = start(client, gateway, script_name, [first_step, {"output": [msg("still no")]}], agent)
    failed = client.wait(task.task_id)
    assert failed.status == "failed"
    with pytest.raises(ValueError, match="is failed; expected"):
        client.service._launch(task.task_id)  # only retry may start a new attempt of a failed task
    retried = client.retry(task.task_id)
    assert retried.status == "queued" and [a["attempt"] for a in retried.attempts] == [1, 2]
    done = client.wait(task.task_id)
    assert done.status == "succeeded" and done.result == GOOD and done.error is None
    a1, a2 = done.attempts
    assert (a1["status"], a2["status"]) == ("failed", "succeeded")
    assert a1["turn_id"] != a2["turn_id"]
    # isolation: the second attempt's conversation starts from the task input only
    items = control.items(a2["turn_id"])
    assert items[0]["role"] == "user" and "Find it." in str(items[0]["content"])
    assert not any("no" == str(i.get("content")) for i in items)
    req2 = control.store.load(a2["turn_id"]).request
    assert req2["metadata"]["attempt"] == 2 and req2["idempotency_key"] == f"workflow:{task.task_id}:2"
    listed = client.list(agent)
    assert [(t.task_id, t.status, len(t.attempts)) for t in listed] == [(task.task_id, "succeeded", 2)]
    with pytest.raises(ValueError, match="is succeeded"):
        client.retry(task.task_id)


def test_cancel_stops_the_running_attempt(control, gateway, client, script_name, agent):
    entered, release = threading.Event(), threading.Event()

    def slow(body):
        entered.set()
        release.wait(10)
        return submit(GOOD)

    task = start(client, gateway, script_name, [slow], agent)
    assert entered.wait(20)
    assert client.show(task.task_id).status == "running"
    cancelled = client.cancel(task.task_id)
    release.set()
    assert cancelled.status == "cancelled"
    done = client.wait(task.task_id)
    assert done.status == "cancelled" and not done.has_result
    att = done.attempts[0]
    assert att["status"] == "cancelled" and att["turn_status"] == "cancelled"


def test_hook_is_idempotent(control, gateway, client, script_name, agent):
    from tasks.hooks import on_turn_finished
    from tasks.runtime import get_engine

    done = client.wait(start(client, gateway, script_name, [submit(GOOD)], agent).task_id)
    engine = get_engine()
    state = engine.store.load(done.attempts[0]["turn_id"])
    assert on_turn_finished(engine, state)["action"] == "duplicate"
    assert client.show(done.task_id).result == GOOD


def test_start_refuses_bad_schemas(client, agent):
    from worker.records.workflow import WorkflowError

    with pytest.raises(WorkflowError, match="not a valid JSON Schema"):
        client.start_workflow_task(agent_id=agent, title="x", instructions="y", result_schema={"type": "nope"})
    with pytest.raises(WorkflowError, match="does not resolve"):
        client.start_workflow_task(
            agent_id=agent,
            title="x",
            instructions="y",
            result_schema={"type": "object", "properties": {"a": {"$ref": "#/$defs/nope"}}},
        )
    with pytest.raises(WorkflowError, match="only local refs"):
        client.start_workflow_task(
            agent_id=agent,
            title="x",
            instructions="y",
            result_schema={"type": "object", "properties": {"a": {"$ref": "o.json#/a"}}},
        )
    assert client.list(agent) == []


@pytest.mark.usefixtures("any_profile")
def test_start_refuses_a_schema_the_profile_cannot_send(client, agent):
    """A recursive result schema under the profile any: no strict mode (G4), and Gemini has no $ref
    (G3), so the task is refused at start, naming the rule, not at its first step."""
    from worker.records.workflow import WorkflowError

    with pytest.raises(WorkflowError, match="cannot be sent to the model.*G3.*AGENT_MODEL_PROVIDER"):
        client.start_workflow_task(agent_id=agent, title="x", instructions="y", result_schema=TREE)
    assert client.list(agent) == []


def test_recursive_result_schema_commits(control, gateway, client, script_name, agent):
    """A root self-reference ({"$ref": "#"}) survives the wrapper: strict submit_result, accepted, committed
    (under the default profile, openai: Gemini has no recursive schema, rule G3)."""
    steps = [submit({"name": "root", "children": [{"name": 7, "children": []}]}), submit(TREE_VALUE)]
    task = start(client, gateway, script_name, steps, agent, result_schema=TREE)
    assert task.strict is True and task.strict_note is None
    done = client.wait(task.task_id)
    assert done.status == "succeeded", done.error
    assert done.result == TREE_VALUE and done.result_schema == TREE
    assert "result.children[0].name" in outputs(control, done.attempts[0]["turn_id"])[0]
    params = requests_for(gateway, script_name)[0]["tools"][-1]["parameters"]
    assert params["$defs"]["result"]["properties"]["children"]["items"] == {"$ref": "#/$defs/result"}


def test_open_map_schema_falls_back_to_non_strict_and_says_why(control, gateway, client, script_name, agent):
    schema = {"type": "object", "additionalProperties": {"type": "integer"}}
    task = start(client, gateway, script_name, [submit({"a": 1, "b": 2})], agent, result_schema=schema)
    assert task.strict is False and "open map" in task.strict_note
    done = client.wait(task.task_id)
    assert done.status == "succeeded" and done.result == {"a": 1, "b": 2}
    assert requests_for(gateway, script_name)[0]["tools"][-1]["strict"] is False


def test_defs_are_hoisted_so_refs_keep_resolving(control, gateway, client, script_name, agent):
    schema = {
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}}},
        "required": ["items"],
        "additionalProperties": False,
        "$defs": {
            "item": {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
            }
        },
    }
    steps = [submit({"items": [{"n": "x"}]}), submit({"items": [{"n": 1}]})]
    done = client.wait(start(client, gateway, script_name, steps, agent, result_schema=schema).task_id)
    assert done.status == "succeeded" and done.strict is True  # the default profile (openai) carries strict mode
    assert "result.items[0].n" in outputs(control, done.attempts[0]["turn_id"])[0]


# ----- the submit_result wrapper (no worker) -----------------------------------------------

TREE = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["name", "children"],
    "additionalProperties": False,
}
TREE_VALUE = {"name": "root", "children": [{"name": "leaf", "children": []}]}
POINTER = {
    "type": "object",
    "properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
# hoisted definitions that point back at the root, and a task-defined "result" the wrapper must not clobber
DEFS_BACK_TO_ROOT = {
    "type": "object",
    "properties": {"label": {"$ref": "#/$defs/result"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/kid"}}},
    "required": ["label", "kids"],
    "additionalProperties": False,
    "$defs": {
        "result": {"type": "string", "minLength": 1},
        "kid": {
            "type": "object",
            "properties": {"of": {"$ref": "#"}},
            "required": ["of"],
            "additionalProperties": False,
        },
    },
}
DRAFT7 = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "$id": "https://example.com/t.json",
    "type": "object",
    "properties": {
        "n": {"$ref": "#/definitions/n"},
        "m": {"$ref": "#/properties/n"},
        "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
    },
    "required": ["n", "m", "next"],
    "additionalProperties": False,
    "definitions": {"n": {"type": "integer", "minimum": 0}},
}
# a "$ref" inside const is data: never rewritten
CONST_REF = {
    "type": "object",
    "properties": {"tag": {"const": {"$ref": "#"}}, "more": {"type": "array", "items": {"$ref": "#"}}},
    "required": ["tag", "more"],
    "additionalProperties": False,
}

WRAPPER_CASES = {
    "root-self-ref": (
        TREE,
        [TREE_VALUE, {"name": "x", "children": []}],
        [
            {"name": "root", "children": [{"name": "leaf"}]},
            {"name": "root", "children": [{"name": "leaf", "children": [], "extra": 1}]},
            {"result": TREE_VALUE},
        ],
    ),
    "pointer-into-schema": (POINTER, [{"a": "x", "b": "y"}], [{"a": "x", "b": 2}, {"a": "x"}]),
    "defs-back-to-root": (
        DEFS_BACK_TO_ROOT,
        [{"label": "t", "kids": [{"of": {"label": "u", "kids": []}}]}],
        [{"label": "", "kids": []}, {"label": "t", "kids": [{"of": {"label": 3, "kids": []}}]}],
    ),
    "draft7-id-definitions": (
        DRAFT7,
        [{"n": 1, "m": 2, "next": {"n": 0, "m": 0, "next": None}}],
        [{"n": -1, "m": 2, "next": None}, {"n": 1, "m": 2, "next": {"n": 0, "m": "x", "next": None}}],
    ),
    "const-ref-is-data": (
        CONST_REF,
        [{"tag": {"$ref": "#"}, "more": [{"tag": {"$ref": "#"}, "more": []}]}],
        [{"tag": {"$ref": "#/$defs/result"}, "more": []}],
    ),
}


@pytest.mark.parametrize("case", sorted(WRAPPER_CASES))
def test_wrapper_accepts_exactly_what_the_task_schema_accepts(case):
    import jsonschema

    from worker.records.result_schema import check_result_schema, result_errors, submit_result_schema
    from worker.tooling.strict import strict_violations, to_strict_schema

    schema, good, bad = WRAPPER_CASES[case]
    assert check_result_schema(schema) == schema
    wrapper = submit_result_schema(schema)
    task_v = jsonschema.validators.validator_for(schema)(schema)
    wrap_v = jsonschema.validators.validator_for(wrapper)(wrapper)
    strict = to_strict_schema(wrapper, tool_name="submit_result")
    assert strict_violations(strict) == []
    strict_v = jsonschema.validators.validator_for(strict)(strict)
    for value in good:
        assert task_v.is_valid(value) and wrap_v.is_valid({"result": value})
        assert strict_v.is_valid({"result": value})  # the provider-side copy admits it too
        assert result_errors(schema, value) == []  # commit-time check, against the persisted schema
    for value in bad:
        assert not task_v.is_valid(value) and not wrap_v.is_valid({"result": value})
        assert result_errors(schema, value)
    assert submit_result_schema(schema) == wrapper and schema == WRAPPER_CASES[case][0]  # input untouched


def test_wrapper_rewrites_refs_into_defs_result():
    from worker.records.result_schema import submit_result_schema

    tree = submit_result_schema(TREE)
    assert tree["properties"]["result"]["$ref"] == "#/$defs/result"
    assert tree["$defs"]["result"]["properties"]["children"]["items"] == {"$ref": "#/$defs/result"}
    assert submit_result_schema(POINTER)["$defs"]["result"]["properties"]["b"] == {
        "$ref": "#/$defs/result/properties/a"
    }
    back = submit_result_schema(DEFS_BACK_TO_ROOT)
    assert back["properties"]["result"]["$ref"] == "#/$defs/result_1"
    assert back["$defs"]["result"] == {"type": "string", "minLength": 1}  # the task's own, kept
    assert back["$defs"]["kid"]["properties"]["of"] == {"$ref": "#/$defs/result_1"}
    assert back["$defs"]["result_1"]["properties"]["label"] == {"$ref": "#/$defs/result"}
    draft7 = submit_result_schema(DRAFT7)
    assert "$id" not in draft7["$defs"]["result"] and draft7["$schema"] == DRAFT7["$schema"]
    assert draft7["$defs"]["result"]["properties"]["n"] == {"$ref": "#/definitions/n"}
    assert draft7["$defs"]["result"]["properties"]["m"] == {"$ref": "#/$defs/result/properties/n"}
    assert submit_result_schema(CONST_REF)["$defs"]["result"]["properties"]["tag"] == {"const": {"$ref": "#"}}
    # no ref into the task root: the task schema stays inline under properties.result, as before
    plain = submit_result_schema(SCHEMA)
    assert "$defs" not in plain and plain["properties"]["result"]["properties"] == SCHEMA["properties"]


@pytest.mark.parametrize("strict", [True, False])
@pytest.mark.parametrize("case", ["root-self-ref", "pointer-into-schema", "defs-back-to-root"])
@pytest.mark.usefixtures("openai_profile")  # recursive schemas not strict: a provider that takes $ref
def test_submit_result_tool_validates_like_the_task_schema(case, strict):
    """The worker's own argument validation (worker.tooling.arguments) on the built tool, strict and not."""
    from worker.settings import Settings
    from worker.tooling.arguments import validate_tool_arguments
    from worker.tooling.contract import define_worker_tool
    from worker.tools.submit_result import create_submit_result_tool

    schema, good, bad = WRAPPER_CASES[case]
    ctx = _ctx(Settings(web_search_url=None, web_fetch_enabled=False), False)
    ctx.metadata = {"workflow_task_id": "wf_x", "result_schema": schema}
    tool = create_submit_result_tool(ctx)
    assert tool.strict is True
    if not strict:
        tool = define_worker_tool(
            name=tool.name,
            description=tool.description,
            json_schema=tool.json_schema,
            execute=lambda p, c: None,
            strict=False,
        )
    for value in good:
        out = validate_tool_arguments(tool, orjson.dumps({"result": value}).decode())
        assert out.ok, out.error
    for value in bad:
        out = validate_tool_arguments(tool, orjson.dumps({"result": value}).decode())
        assert not out.ok and "result" in out.error


@pytest.mark.parametrize(
    "schema, match",
    [
        (
            {"type": "object", "properties": {"a": {"$ref": "#/properties/zz"}}},
            "'#/properties/zz' at /properties/a that does not resolve",
        ),
        (
            {"type": "object", "properties": {"a": {"$ref": "#/$defs/zz"}}},
            "'#/\\$defs/zz' at /properties/a that does not resolve",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "#/definitions/a"}}, "$defs": {"a": {}}}, "does not resolve"),
        ({"type": "object", "properties": {"a": {"items": {"$ref": "#/properties/a/items/0"}}}}, "does not resolve"),
        (
            {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/required"}}},
            "points to a list, not a schema",
        ),
        ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "non-local \\$ref"),
        ({"type": "object", "properties": {"a": {"$ref": "#foo"}}}, "anchor \\$ref"),
        (
            {"type": "object", "properties": {"a": {"$id": "https://x/a", "type": "string"}}},
            "declares an \\$id at /properties/a",
        ),
        ({"type": "object", "properties": {"a": {"$dynamicRef": "#meta"}}}, "uses \\$dynamicRef"),
    ],
)
def test_check_result_schema_refuses_refs_it_cannot_carry(schema, match):
    from worker.records.result_schema import WorkflowError, check_result_schema

    with pytest.raises(WorkflowError, match=match):
        check_result_schema(schema)


def test_start_refuses_an_unresolvable_ref_before_any_attempt():
    from worker.records.workflow import WorkflowError, WorkflowService

    enqueued = []
    svc = WorkflowService(redis=None, enqueue_turn=lambda req, turn_id: enqueued.append(turn_id))
    with pytest.raises(WorkflowError, match="does not resolve"):
        svc.start(
            agent_id="a",
            title="t",
            instructions="i",
            result_schema={"type": "object", "properties": {"b": {"$ref": "#/properties/a"}}},
        )
    assert enqueued == []


# ----- the catalog --------------------------------------------------------------------------


def _ctx(settings, brain, workflow_task=True, services=None, redis=None):
    from worker.tooling.contract import ToolServices
    from worker.turn.context import TurnContext
    from worker.turn.request import TurnSupports

    return TurnContext(
        turn_id="t",
        agent_id="a",
        home=Path("/tmp"),
        settings=settings,
        supports=TurnSupports(brain=brain),
        workflow_task=workflow_task,
        metadata={"workflow_task_id": "wf_x", "result_schema": SCHEMA},
        services=services or ToolServices(),
        redis=redis,
    )


def _enqueue_only():
    from worker.tooling.contract import ToolServices

    return ToolServices(enqueue_turn=lambda request, turn_id=None: "x")


@pytest.mark.parametrize(
    "web, brain, expected",
    [
        (False, False, ["submit_result"]),
        (False, True, ["recall", "get_page", "submit_result"]),
        (True, False, ["web_search", "submit_result"]),
        (True, True, ["web_search", "recall", "get_page", "submit_result"]),
    ],
)
@pytest.mark.usefixtures("openai_profile")  # submit_result strict: a profile that carries strict mode
def test_workflow_task_catalog(web, brain, expected):
    from worker.settings import Settings
    from worker.tools.assembly import workflow_task_tools

    settings = Settings(web_search_url="http://search.invalid/search" if web else None, web_fetch_enabled=False)
    tools = workflow_task_tools(_ctx(settings, brain, services=_enqueue_only(), redis=object()))
    assert [t.name for t in tools] == expected
    by = {t.name: t for t in tools}
    assert by["submit_result"].strict is True and by["submit_result"].json_schema["properties"]["result"]["type"]
    for name in ("recall", "get_page"):
        if name in by:
            assert by[name].is_read_only and by[name].execution_mode == "parallel"


def test_catalog_without_result_schema_refuses():
    from worker.settings import Settings
    from worker.tools.assembly import workflow_task_tools

    ctx = _ctx(Settings(web_search_url=None, web_fetch_enabled=False), False)
    ctx.metadata = {}
    with pytest.raises(ValueError, match="metadata.result_schema"):
        workflow_task_tools(ctx)


def test_main_turn_gets_workflow_tools_and_task_turn_does_not():
    from worker.settings import Settings
    from worker.tools.assembly import text_turn_tools
    from worker.tools.workflow import create_workflow_tools

    svc = _enqueue_only()
    main = [t.name for t in text_turn_tools(_ctx(Settings(), True, workflow_task=False, services=svc, redis=object()))]
    assert main[-4:] == ["workflow_start", "workflow_show", "workflow_list", "workflow_cancel"]
    assert create_workflow_tools(_ctx(Settings(), True, workflow_task=True, services=svc, redis=object())) == []
    no_enqueue = create_workflow_tools(_ctx(Settings(), True, workflow_task=False, redis=object()))
    assert [t.name for t in no_enqueue] == ["workflow_show", "workflow_list", "workflow_cancel"]


# ----- the main turn's tools ----------------------------------------------------------------


def test_main_turn_starts_shows_and_lists_a_task(control, gateway, client, script_name, agent):
    task_script = script_name + "-task"
    gateway.add_script(task_script, [submit(GOOD)])
    seen = {}

    def show_started(body):
        out = next(i for i in reversed(body["input"]) if i.get("type") == "function_call_output")
        seen["task_id"] = orjson.loads(out["output"])["task_id"]
        return {"output": [fc("workflow_show", {"task_id": seen["task_id"]}), fc("workflow_list", {})]}

    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc(
                        "workflow_start",
                        {
                            "title": "Biggest city",
                            "instructions": "Find it.",
                            "result_schema": SCHEMA,
                            "use_brain": True,
                        },
                    )
                ]
            },
            show_started,
            {"output": [msg("started")]},
        ],
    )
    turn_id = control.enqueue(
        {"agent_id": agent, "input": "go", "model": script_name, "metadata": {"workflow_model": task_script}}
    )
    assert control.wait(turn_id).status == TurnStatus.completed
    start_out, show_out, list_out = [orjson.loads(o) for o in outputs(control, turn_id)]
    task_id = seen["task_id"]
    assert start_out["task_id"] == task_id and start_out["created"] is True
    assert show_out["task_id"] == task_id and show_out["status"] in ("queued", "running", "succeeded")
    assert show_out["result_schema"] == SCHEMA
    assert list_out["count"] == 1 and list_out["tasks"][0]["task_id"] == task_id
    done = client.wait(task_id)
    assert done.status == "succeeded" and done.result == GOOD and done.use_brain
    assert done.origin == f"turn:{turn_id}" and done.agent_id == agent
    # labels before/after
    events = control.events(turn_id)
    planned = next(e for e in events if e["kind"] == "call_planned" and e["name"] == "workflow_start")
    completed = next(e for e in events if e["kind"] == "call_completed" and e["name"] == "workflow_start")
    assert planned["activity"] == "Starting workflow task 'Biggest city'"
    assert completed["activity"] == f"Started workflow task 'Biggest city' (id {task_id})"
    # the task turn got the fixed catalog (Brain on), never the main-turn tools
    task_tools = [t["name"] for t in requests_for(gateway, task_script)[0]["tools"]]
    assert non_web(task_tools) == ["recall", "get_page", "submit_result"]
    main_tools = [t.get("name") for t in requests_for(gateway, script_name)[0]["tools"]]
    assert {"workflow_start", "workflow_show", "workflow_list", "workflow_cancel"} <= set(main_tools)


def test_workflow_cancel_tool_and_show_of_unknown_task(control, gateway, client, script_name, agent):
    entered, release = threading.Event(), threading.Event()

    def slow(body):
        entered.set()
        release.wait(10)
        return submit(GOOD)

    task = start(client, gateway, script_name + "-t", [slow], agent)
    assert entered.wait(20)
    gateway.add_script(
        script_name,
        [
            {"output": [fc("workflow_cancel", {"task_id": task.task_id}), fc("workflow_show", {"task_id": "wf_nope"})]},
            {"output": [msg("ok")]},
        ],
    )
    # the solo worker is busy in the task's model call: the main turn queues behind it, so let it go first
    turn_id = control.enqueue({"agent_id": agent, "input": "go", "model": script_name})
    release.set()
    assert control.wait(turn_id).status == TurnStatus.completed
    cancel_out, show_out = outputs(control, turn_id)
    # the slow submit may have committed before the cancel ran: both outcomes are consistent
    done = client.wait(task.task_id)
    if done.status == "cancelled":
        assert orjson.loads(cancel_out)["status"] == "cancelled"
    else:
        assert done.status == "succeeded" and "already succeeded" in cancel_out
    assert show_out == "Error: unknown workflow task 'wf_nope'"


# ----- the demo -----------------------------------------------------------------------------


def test_workflow_demo(styled_control, gateway):
    """``make run DEMO=workflow`` in both wire styles (``styled_control``)."""
    control = styled_control
    from devtools.workflow_demo import load_demo_scripts, run_workflow_demo

    load_demo_scripts(gateway)
    lines: list[str] = []
    report = run_workflow_demo(control, timeout=60, out=lines.append)
    assert report  # true: task succeeded and the follow-up turn completed
    task = report.task
    assert task.status == "succeeded", task.error
    assert task.result["tides_per_day"] == 2 and "Fundy" in task.result["highest_tide_place"]
    turn_id = task.attempts[0]["turn_id"]
    outs = outputs(control, turn_id)
    recall = orjson.loads(outs[0])
    assert [h["id"] for h in recall["results"]][:2] == ["tides", "bay-of-fundy"]
    assert "remaining (call get_page with offset=600" in outs[1]
    assert "End of page." in outs[2]
    assert "did not run" in outs[4] and "result.tides_per_day" in outs[4]  # rejected, then corrected
    assert "succeeded" in report.followup_output or "Fundy" in report.followup_output
    follow = outputs(control, report.followup_turn)
    assert orjson.loads(follow[0])["result"] == task.result
    assert any("succeeded" in line for line in lines)
