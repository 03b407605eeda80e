"""Read-only Brain tools: ``recall`` (ranked search) and ``get_page`` (one page, paged).

Offered by ``create_brain_tools(ctx)`` when the turn supports Brain
(``ctx.supports.brain``; a workflow task turn gets them too, read-only, when
Brain is enabled). Both are ``parallel`` and
``is_read_only``. They read the agent's pages (``worker.records.brain.BrainStore``)
through the Redis client the runtime gives every tool
(``ToolContext.services.redis``).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel, Field

from worker.records.brain import BrainStore, rank
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.turn.context import TurnContext

DEFAULT_PAGE_CHARS = 4_000
MAX_PAGE_CHARS_PER_CALL = 20_000


class RecallParams(BaseModel):
    """Input of ``recall``."""

    query: str = Field(
        ..., min_length=1, max_length=500, description="Words to look for in the Brain pages' titles and text."
    )
    limit: int = Field(5, ge=1, le=20, description="Maximum number of pages to return (1-20).")


class GetPageParams(BaseModel):
    """Input of ``get_page``."""

    page_id: str = Field(..., min_length=1, max_length=128, description="Page id, as returned by recall.")
    offset: int = Field(0, ge=0, description="First character to return (0 = start of the page).")
    limit: int = Field(
        DEFAULT_PAGE_CHARS,
        ge=1,
        le=MAX_PAGE_CHARS_PER_CALL,
        description=f"Maximum characters to return (1-{MAX_PAGE_CHARS_PER_CALL}).",
    )


def _store(ctx: ToolContext) -> BrainStore:
    redis = ctx.services.redis
    if redis is None:
        raise RuntimeError("Brain is not reachable in this turn (no Redis client)")
    return BrainStore(redis, ctx.agent_id)


def _recall(params: RecallParams, ctx: ToolContext) -> ToolResult:
    """Shape of ``content`` (JSON): ``{"query", "results": [{"id", "title", "score", "matched",
    "snippet", "chars"}], "pages_searched"}``; results best first (BM25, ``worker.records.brain``)."""
    store = _store(ctx)
    pages = store.pages()
    hits = rank(pages, params.query, params.limit)
    body: dict[str, Any] = {"query": params.query, "results": [h.to_json() for h in hits], "pages_searched": len(pages)}
    if not hits:
        body["note"] = (
            "No page matched. Try other words (synonyms, a shorter query)." if pages else "The Brain has no pages."
        )
    return ToolResult(content=orjson.dumps(body).decode(), details={"hits": len(hits), "ids": [h.id for h in hits]})


def _get_page(params: GetPageParams, ctx: ToolContext) -> ToolResult:
    """Characters ``[offset, offset + limit)`` of the page's text, with a header saying what remains.

    Output (text): ``Page <id>: <title>`` then ``Characters a-b of n; r remaining
    (call get_page with offset=b to continue).`` (or ``End of page.``), a blank
    line, then the text slice. An unknown id or an offset past the end is an
    error output naming the problem.
    """
    page = _store(ctx).get(params.page_id)
    if page is None:
        return ToolResult(
            content=f"Error: no Brain page with id {params.page_id!r}. Use recall to find page ids.",
            is_error=True,
            details={"error": "not_found"},
        )
    total = len(page.text)
    if params.offset > total or (params.offset == total and total > 0):
        return ToolResult(
            content=f"Error: offset {params.offset} is past the end of page {page.id!r} ({total} characters).",
            is_error=True,
            details={"error": "offset"},
        )
    end = min(total, params.offset + params.limit)
    remaining = total - end
    more = f"{remaining} remaining (call get_page with offset={end} to continue)." if remaining else "End of page."
    header = f"Page {page.id}: {page.title}\nCharacters {params.offset}-{end} of {total}; {more}"
    return ToolResult(
        content=f"{header}\n\n{page.text[params.offset : end]}",
        details={"page_id": page.id, "offset": params.offset, "end": end, "total": total, "remaining": remaining},
    )


def create_brain_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """``[recall, get_page]`` when ``ctx.supports.brain``; otherwise ``[]``."""
    if not ctx.supports.brain:
        return []
    return [
        define_worker_tool(
            name="recall",
            description=(
                "Search the agent's Brain (its knowledge pages) and return the best matching pages: "
                "id, title, a snippet and a relevance score, best first. Ranking is BM25 over the "
                "page title (weighted double) and text. Use get_page to read a page."
            ),
            input_model=RecallParams,
            execute=_recall,
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=lambda p: f"Recalling '{p.query}'",
            describe_completed_activity=lambda p, r: (
                f"Recalled {r.details.get('hits', 0)} pages for '{p.query}'"
                if not r.is_error
                else f"Recall failed for '{p.query}'"
            ),
        ),
        define_worker_tool(
            name="get_page",
            description=(
                "Read one Brain page by id. Long pages are returned in slices: pass offset and limit "
                "(characters); the header says how many characters remain and the next offset."
            ),
            input_model=GetPageParams,
            execute=_get_page,
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=lambda p: f"Reading Brain page {p.page_id}",
            describe_completed_activity=lambda p, r: (
                f"Read characters {r.details['offset']}-{r.details['end']} of {r.details['total']} "
                f"of Brain page {p.page_id}"
                if not r.is_error
                else f"Could not read Brain page {p.page_id}"
            ),
        ),
    ]
