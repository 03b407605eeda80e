"""Brain: the per-agent page store, BM25 ranking, and the read-only recall / get_page tools."""

from __future__ import annotations

import uuid
from pathlib import Path

import orjson
import pytest
import redis

from worker.records.brain import BrainError, BrainStore, Page, rank, snippet, tokenize
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext, ToolServices
from worker.tools.brain import GetPageParams, RecallParams, create_brain_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnSupports


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def agent():
    return f"brain-{uuid.uuid4().hex[:8]}"


def tools(brain: bool = True):
    ctx = TurnContext(
        turn_id="t", agent_id="a", home=Path("/tmp"), settings=Settings(), supports=TurnSupports(brain=brain)
    )
    return {t.name: t for t in create_brain_tools(ctx)}


def tctx(r, agent):
    return ToolContext(
        turn_id="t1",
        call_id="c1",
        home=Path("/tmp"),
        abort=AbortSignal(),
        agent_id=agent,
        services=ToolServices(redis=r),
    )


def test_tokenize_lowercases_and_drops_stop_words():
    assert tokenize("The Tide, and the TIDES of Fundy!") == ["tide", "tides", "fundy"]


def test_rank_prefers_rare_terms_title_matches_and_leaves_out_non_matches():
    pages = [
        Page("a", "Ocean notes", "water water water moon"),
        Page("b", "Moon", "the moon moves the water"),
        Page("c", "Fundy", "highest tides in the world; water again"),
        Page("d", "Cooking", "bread and butter"),
    ]
    hits = rank(pages, "moon")
    # 'b' has the term in its title (weight 2) and a short text: it beats 'a'
    assert [h.id for h in hits] == ["b", "a"]
    assert hits[0].score > hits[1].score > 0
    # a rare term ('fundy', one page) outweighs a common one ('water', three pages)
    hits = rank(pages, "water fundy")
    assert hits[0].id == "c" and hits[0].matched == ("water", "fundy")
    assert "d" not in [h.id for h in hits]
    assert rank(pages, "the and of") == []  # stop words only: nothing searchable
    assert rank(pages, "zebra") == []


def test_rank_is_deterministic_on_ties_and_respects_limit():
    pages = [Page(f"p{i}", "Same", "same words here") for i in range(5)]
    hits = rank(pages, "words", limit=3)
    assert [h.id for h in hits] == ["p0", "p1", "p2"]


def test_snippet_centres_on_first_match_and_marks_cuts():
    text = "intro " * 100 + "the Moon raises tides " + "outro " * 100
    s = snippet(text, {"moon"}, width=80)
    assert "Moon" in s and s.startswith("…") and s.endswith("…") and len(s) <= 82
    assert snippet("short text", {"zzz"}) == "short text"


def test_store_add_get_replace_and_isolation(r, agent):
    store = BrainStore(r, agent)
    page = store.add_page("Tides", "the moon", page_id="tides")
    assert store.get("tides") == Page("tides", "Tides", "the moon", page.updated_at)
    store.add_page("Tides v2", "the sun too", page_id="tides")
    assert store.get("tides").title == "Tides v2" and store.count() == 1
    assert BrainStore(r, agent + "-other").get("tides") is None  # per agent
    generated = store.add_page("Other", "x")
    assert generated.id.startswith("p_")
    assert store.delete_page("tides") is True and store.get("tides") is None


@pytest.mark.parametrize(
    "kwargs, match",
    [({"page_id": "../x", "title": "t", "text": ""}, "page id"), ({"title": "  ", "text": "x"}, "title")],
)
def test_store_refuses_bad_pages(r, agent, kwargs, match):
    with pytest.raises(BrainError, match=match):
        BrainStore(r, agent).add_page(**kwargs)


def test_tools_present_only_with_brain_and_read_only_parallel():
    assert tools(brain=False) == {}
    got = tools()
    assert sorted(got) == ["get_page", "recall"]
    assert all(t.is_read_only and t.execution_mode == "parallel" for t in got.values())


def test_recall_returns_ranked_ids_titles_snippets(r, agent):
    store = BrainStore(r, agent)
    store.add_page("Bay of Fundy", "highest tidal range in the world", page_id="fundy")
    store.add_page("Tides", "tides follow the moon; the tidal range varies", page_id="tides")
    store.add_page("Bread", "flour water salt", page_id="bread")
    tool = tools()["recall"]
    res = tool.execute(RecallParams(query="highest tidal range"), tctx(r, agent))
    body = orjson.loads(res.content)
    assert [h["id"] for h in body["results"]] == ["fundy", "tides"]
    assert body["results"][0]["title"] == "Bay of Fundy"
    assert "tidal range" in body["results"][0]["snippet"]
    assert body["pages_searched"] == 3
    assert tool.completed_activity(RecallParams(query="x"), res) == "Recalled 2 pages for 'x'"
    empty = orjson.loads(tool.execute(RecallParams(query="zebra"), tctx(r, agent)).content)
    assert empty["results"] == [] and "No page matched" in empty["note"]


def test_get_page_pages_long_text_and_says_what_remains(r, agent):
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    BrainStore(r, agent).add_page("Long", text, page_id="long")
    tool = tools()["get_page"]
    first = tool.execute(GetPageParams(page_id="long", limit=4000), tctx(r, agent))
    header, body = first.content.split("\n\n", 1)
    assert header == (
        "Page long: Long\nCharacters 0-4000 of 10000; 6000 remaining (call get_page with offset=4000 to continue)."
    )
    assert body == text[:4000]
    second = tool.execute(GetPageParams(page_id="long", offset=4000, limit=4000), tctx(r, agent))
    assert second.details == {"page_id": "long", "offset": 4000, "end": 8000, "total": 10000, "remaining": 2000}
    last = tool.execute(GetPageParams(page_id="long", offset=8000, limit=4000), tctx(r, agent))
    assert "End of page." in last.content and last.content.endswith(text[8000:])
    assert (
        first.content.split("\n\n", 1)[1] + second.content.split("\n\n", 1)[1] + last.content.split("\n\n", 1)[1]
        == text
    )
    past = tool.execute(GetPageParams(page_id="long", offset=10_000), tctx(r, agent))
    assert past.is_error and "past the end" in past.content
    missing = tool.execute(GetPageParams(page_id="nope"), tctx(r, agent))
    assert missing.is_error and "no Brain page with id 'nope'" in missing.content
