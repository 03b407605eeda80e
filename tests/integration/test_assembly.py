"""Per-turn assembly differs by the turn's context as docs/architecture.md ("Which files a change takes") says."""

from __future__ import annotations

import pytest
import redis as redis_lib

from worker.settings import Settings
from worker.tooling.contract import ToolServices
from worker.tools.assembly import TEXT_TURN_CATEGORIES, text_turn_tools, workflow_task_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnSupports

WEB = {"web_search_url": "http://search.invalid/search", "web_fetch_enabled": True}
NO_WEB = {"web_search_url": None, "web_fetch_enabled": False}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}},
    "required": ["answer"],
    "additionalProperties": False,
}
COMPUTER = {"run_command", "read_file", "write_file", "edit_file", "list_files", "search_files"}
JOBS = {"job_start", "job_status", "job_list", "job_cancel"}
SCHEDULES = {"schedule_create", "schedule_list", "schedule_cancel"}
WORKFLOW = {"workflow_start", "workflow_show", "workflow_list", "workflow_cancel"}


@pytest.fixture
def ctx(tmp_path, redis_url):
    def make(*, web=False, spawn_jobs=False, brain=False, workflow_task=False):
        return TurnContext(
            turn_id="t",
            agent_id="a",
            home=tmp_path,
            settings=Settings(**(WEB if web else NO_WEB)),
            supports=TurnSupports(spawn_jobs=spawn_jobs, brain=brain),
            redis=redis_lib.Redis.from_url(redis_url),
            services=ToolServices(
                enqueue_turn=lambda request, turn_id=None: "turn-id",
                cancel_turn=lambda turn_id: True,
                save_schedule_entry=lambda record: None,
                delete_schedule_entry=lambda schedule_id: None,
            ),
            metadata={"result_schema": SCHEMA, "workflow_task_id": "w1"},
            workflow_task=workflow_task,
        )

    return make


def names(tools):
    return [t.name for t in tools]


def test_full_text_catalog_is_in_the_spec_order(ctx):
    got = names(text_turn_tools(ctx(web=True, spawn_jobs=True)))
    assert len(got) == len(set(got)), got
    # The built-in categories are all there, in their fixed order (a new category adds its tools
    # without changing this test: next test).
    order = [["todo_write"], COMPUTER, {"web_search", "web_fetch"}, SCHEDULES, JOBS, WORKFLOW]
    category = {n: i for i, group in enumerate(order) for n in group}
    assert set(category) <= set(got), set(category) - set(got)
    known = [n for n in got if n in category]
    assert [category[n] for n in known] == sorted(category[n] for n in known), got


def test_a_category_is_one_entry_of_the_catalog(ctx, monkeypatch):
    """docs/architecture.md, "Which files a change takes": a category registered by one entry of
    ``TEXT_TURN_CATEGORIES`` (its module and its test being the other two files) is in the ``text``
    toolset, at its place, with nothing else changed; it is also how a missing prerequisite leaves
    it out (its creator returns nothing)."""
    from worker.tooling.contract import ToolResult, define_worker_tool
    from worker.tools import assembly
    from worker.tools.toolsets import toolset_resolver

    def create_planted_tools(turn: TurnContext):
        if not turn.supports.brain:  # a prerequisite of its own
            return []
        return [
            define_worker_tool(
                name="planted", description="A planted category's tool.", execute=lambda p, c: ToolResult("ok")
            )
        ]

    monkeypatch.setattr(assembly, "TEXT_TURN_CATEGORIES", (*TEXT_TURN_CATEGORIES, create_planted_tools))
    text = toolset_resolver(Settings())("text")
    with_it = names(text(ctx(web=True, spawn_jobs=True, brain=True)))
    assert with_it[-1] == "planted" and with_it[:-1] == names(text_turn_tools(ctx(web=True, spawn_jobs=True)))
    assert "planted" not in names(text(ctx(web=True, spawn_jobs=True)))


def test_no_web_tools_without_a_provider_profile(ctx):
    assert not {"web_search", "web_fetch"} & set(names(text_turn_tools(ctx(web=False))))
    assert not {"web_search", "web_fetch"} & set(names(workflow_task_tools(ctx(web=False, workflow_task=True))))


def test_no_job_tools_unless_the_turn_may_spawn_jobs(ctx):
    assert not JOBS & set(names(text_turn_tools(ctx(spawn_jobs=False))))
    assert JOBS <= set(names(text_turn_tools(ctx(spawn_jobs=True))))


def test_workflow_task_turn_has_its_fixed_catalog_only(ctx):
    assert names(workflow_task_tools(ctx(workflow_task=True))) == ["submit_result"]
    assert names(workflow_task_tools(ctx(web=True, brain=True, workflow_task=True, spawn_jobs=True))) == [
        "web_search",
        "web_fetch",
        "recall",
        "get_page",
        "submit_result",
    ]
    # the main catalog inside a workflow task turn never offers workflow tools
    assert not WORKFLOW & set(names(text_turn_tools(ctx(workflow_task=True))))


def test_every_tool_has_modes_flags_and_labels(ctx):
    tools = text_turn_tools(ctx(web=True, spawn_jobs=True)) + workflow_task_tools(
        ctx(web=True, brain=True, workflow_task=True)
    )
    for t in tools:
        assert t.describe_activity is not None, t.name
        if t.is_read_only:
            assert t.execution_mode == "parallel", t.name
        if t.is_destructive:
            assert t.execution_mode == "sequential", t.name
    by = {t.name: t for t in tools}
    assert by["read_file"].is_read_only and by["write_file"].is_destructive and by["run_command"].is_destructive
