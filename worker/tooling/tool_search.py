"""Deferred tool loading through a client-side ``tool_search`` function tool.

Tools defined with ``defer_loading=True`` are left out of the request
(``collect_tool_definitions`` skips them unless loaded). When a turn has any,
``with_tool_search`` adds one ordinary function tool, ``tool_search``, whose
description names what can be loaded; the model calls it with a query, gets
the matching definitions back as the call's output, and the loop adds
``ToolResult.details["loaded"]`` to the turn's ``loaded`` set so those tools
are sent (without ``defer_loading``) for the rest of the turn.

Wire format note. The Responses API also has a native form: deferred
functions are *sent* with ``defer_loading: true`` next to a
``{"type": "tool_search"}`` tool (hosted, or ``execution: "client"`` with
``tool_search_call`` / ``tool_search_output`` items), supported only by
gpt-5.4 and later (OpenAI guide "Tool search"). A plain function tool works
with every model and every OpenAI-compatible provider, which is why it is
used here; a deferred tool in a namespace is loaded as part of its
``{"type": "namespace"}`` group, as the guide describes (``defer_loading``
applies to the functions inside the namespace, not to the namespace).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import replace
from typing import Any, Iterable, Sequence

from pydantic import BaseModel, Field

from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.tooling.schemas import current_provider, function_definition
from worker.tooling.wire_profiles import strict_refusal

TOOL_SEARCH_NAME = "tool_search"
_CATALOG_NAMES_IN_DESCRIPTION = 60
_WORD = re.compile(r"[A-Za-z][a-z]*|[0-9]+|[A-Z]+(?![a-z])")


class ToolSearchInput(BaseModel):
    """Input of ``tool_search``."""

    query: str = Field(
        ..., min_length=1, description="What you want to do, in a few keywords (e.g. 'create github issue')."
    )
    limit: int = Field(5, ge=1, le=20, description="Maximum number of tools to load.")


def _words(text: str) -> list[str]:
    """Lower-case words of ``text``; splits snake_case, kebab-case and camelCase."""
    return [w.lower() for w in _WORD.findall(text or "")]


def _stem(word: str) -> str:
    for suffix in ("ing", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def rank_tools(query: str, tools: Sequence[WorkerTool[Any]]) -> list[tuple[float, WorkerTool[Any]]]:
    """Score ``tools`` against ``query``; return ``(score, tool)`` with score > 0, best first.

    Ranking (simple and predictable, no index needed for tens of tools):

    - the query and each tool are split into lower-case words (snake_case,
      kebab-case and camelCase split; plural ``s``/``es`` and ``ing`` stripped);
    - the exact tool name in the query: +10;
    - each distinct query word found among the tool's *name* words (its
      namespace counts as part of the name): +3;
    - found among its *description* words (or the namespace description): +1;
    - a query word that is a prefix (3+ letters) of a name word: +1.5.

    Ties keep the catalogue order (stable sort).
    """
    q_words = {_stem(w) for w in _words(query)}
    q_lower = query.lower()
    scored: list[tuple[float, int, WorkerTool[Any]]] = []
    for index, tool in enumerate(tools):
        name_words = {_stem(w) for w in _words(tool.name) + _words(tool.namespace or "")}
        desc_words = {_stem(w) for w in _words(tool.description) + _words(tool.namespace_description or "")}
        score = 10.0 if tool.name.lower() in q_lower else 0.0
        for w in q_words:
            if w in name_words:
                score += 3
            elif len(w) >= 3 and any(n.startswith(w) for n in name_words):
                score += 1.5
            if w in desc_words:
                score += 1
        if score > 0:
            scored.append((score, index, tool))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [(score, tool) for score, _, tool in scored]


def make_tool_search_tool(deferred_tools: Iterable[WorkerTool[Any]]) -> WorkerTool[Any]:
    """The ``tool_search`` tool for ``deferred_tools`` (a parallel, read-only function tool).

    Input: ``{"query": str, "limit": int}`` (``limit`` 1-20, default 5).
    Output (``ToolResult``): ``content`` is a JSON object ``{"loaded": [{"name",
    "description", "parameters", "namespace"?}], "message"}`` listing the
    loaded tools' definitions (the model may call them from now on);
    ``details == {"loaded": [names]}`` for the loop, which must add these names
    to the turn's ``loaded`` set. No match: ``loaded`` is empty and the
    message lists the names that can be loaded. See ``rank_tools`` for the
    ranking.
    """
    catalogue = [t for t in deferred_tools]
    names = [t.name for t in catalogue]
    shown = ", ".join(names[:_CATALOG_NAMES_IN_DESCRIPTION])
    more = (
        f" and {len(names) - _CATALOG_NAMES_IN_DESCRIPTION} more" if len(names) > _CATALOG_NAMES_IN_DESCRIPTION else ""
    )
    namespaces = sorted({f"{t.namespace} ({t.namespace_description or t.namespace})" for t in catalogue if t.namespace})
    ns_text = f" Namespaces: {'; '.join(namespaces)}." if namespaces else ""
    description = (
        "Load more tools. Some tools are not loaded yet; search them by what you want to do, and the "
        f"best matches become callable for the rest of this turn. Loadable tools: {shown}{more}.{ns_text}"
    )

    def execute(params: ToolSearchInput, ctx: ToolContext) -> ToolResult:
        ranked = rank_tools(params.query, catalogue)[: params.limit]
        loaded = []
        for _, tool in ranked:
            definition = function_definition(tool)
            entry = {"name": tool.name, "description": tool.description}
            if "parameters" in definition:  # absent for a tool without arguments under gemini (G10)
                entry["parameters"] = definition["parameters"]
            if tool.namespace:
                entry["namespace"] = tool.namespace
            loaded.append(entry)
        if loaded:
            message = f"Loaded {len(loaded)} tool(s); you can call them now."
        else:
            message = f"No tool matched {params.query!r}. Loadable tools: {', '.join(names)}."
        return ToolResult(
            content={"loaded": loaded, "message": message}, details={"loaded": [e["name"] for e in loaded]}
        )

    common: dict[str, Any] = dict(
        name=TOOL_SEARCH_NAME,
        description=description,
        execute=execute,
        input_model=ToolSearchInput,
        execution_mode="parallel",
        is_read_only=True,
        describe_activity=lambda p: f"Searching tools for {p.query!r}",
        describe_completed_activity=lambda p, r: f"Loaded {len(r.details.get('loaded', []))} tool(s) for {p.query!r}",
    )
    if strict_refusal(TOOL_SEARCH_NAME, current_provider()):  # strict mode only where the profile carries it
        return define_worker_tool(**common, strict=False)
    return define_worker_tool(**common, strict=True)


def deferred_by_name(tools: Iterable[WorkerTool[Any]], patterns: str) -> list[WorkerTool[Any]]:
    """``tools`` with those ``patterns`` name deferred (``defer_loading``, loaded through
    ``tool_search``); the others as they are. ``patterns``: comma-separated ``fnmatch`` patterns of
    tool names, each ``!pattern`` taking names back out, the last match winning
    (``AGENT_DEFER_TOOLS="*,!run_command,!read_file"``: every tool but those two). A deployment
    defers tools to keep a small model's prompt small: each deferred tool costs the prompt one
    name in ``tool_search``'s description instead of its whole definition."""
    rules = [(p.startswith("!"), p.removeprefix("!")) for p in (e.strip() for e in patterns.split(",")) if p.strip("!")]
    if not rules:
        return list(tools)
    out = []
    for tool in tools:
        defer = tool.defer_loading
        for negated, pattern in rules:
            if fnmatch.fnmatchcase(tool.name, pattern):
                defer = not negated
        out.append(tool if defer == tool.defer_loading else replace(tool, defer_loading=defer))
    return out


def with_tool_search(tools: Iterable[WorkerTool[Any]]) -> list[WorkerTool[Any]]:
    """``tools`` plus a ``tool_search`` tool over the deferred ones, only when some tool is deferred.

    The result is a new list; the search tool comes last. With no deferred
    tool the list is returned unchanged (no search tool is offered).
    """
    tools = list(tools)
    deferred = [t for t in tools if t.defer_loading]
    if not deferred:
        return tools
    return tools + [make_tool_search_tool(deferred)]
