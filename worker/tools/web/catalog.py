"""Web tools: ``web_search`` (SearXNG-compatible JSON) and ``web_fetch`` (guarded page fetch).

``create_web_tools(ctx)`` offers each tool only when the worker has its provider
profile bound; with no profile the tool is absent rather than offered and failing:

- ``web_search`` when ``settings.web_search_url`` is set: ``GET
  {url}?q=<query>&format=json``; the optional ``settings.web_search_key`` is
  sent in a header (``settings.web_search_key_header``, default
  ``Authorization: Bearer <key>``) or, when ``settings.web_search_key_param``
  names one, as that query parameter. The key never appears in outputs,
  details or error messages.
- ``web_fetch`` when ``settings.web_fetch_enabled``: GET through
  ``worker.tools.web.address_guard.GuardedTransport`` (addresses vetted after DNS and at
  connect time), redirects followed by hand (at most ``MAX_REDIRECTS``, each
  target vetted before any connection), body streamed and cut at
  ``settings.web_fetch_max_bytes`` (decoded bytes); one overall deadline of
  ``settings.web_fetch_timeout`` seconds covers DNS, connect, headers, body
  and every redirect hop (a watchdog cancels the transport when it passes);
  an unknown charset falls back to UTF-8; HTML becomes readable text with
  trafilatura.
"""

from __future__ import annotations

from typing import Any

from worker.tooling.contract import WorkerTool, define_worker_tool
from worker.tools.web.common import size_label
from worker.tools.web.fetch import WebFetchParams, _describe_fetch, _describe_fetch_done, _fetch
from worker.tools.web.search import WebSearchParams, _describe_search, _describe_search_done, _search
from worker.turn.context import TurnContext

# --------------------------------------------------------------------------- creator


def create_web_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The web tools the worker's bound provider profiles allow: ``[]``, ``[web_search]``,
    ``[web_fetch]`` or both (in that order). Both are read-only and parallel."""
    settings = ctx.settings
    tools: list[WorkerTool[Any]] = []
    if settings.web_search_url:
        tools.append(
            define_worker_tool(
                name="web_search",
                description=(
                    "Search the web. Returns titles, URLs and snippets of the top results; read a page "
                    "with web_fetch when a snippet is not enough."
                ),
                input_model=WebSearchParams,
                execute=lambda p, c: _search(p, c, settings),
                execution_mode="parallel",
                is_read_only=True,
                describe_activity=_describe_search,
                describe_completed_activity=_describe_search_done,
            )
        )
    if settings.web_fetch_enabled:
        tools.append(
            define_worker_tool(
                name="web_fetch",
                description=(
                    "Fetch a public web page (http/https) and return its readable text. Private, local "
                    f"and cloud-metadata addresses are refused; pages are cut at "
                    f"{size_label(settings.web_fetch_max_bytes)}."
                ),
                input_model=WebFetchParams,
                execute=lambda p, c: _fetch(p, c, settings),
                execution_mode="parallel",
                is_read_only=True,
                describe_activity=_describe_fetch,
                describe_completed_activity=_describe_fetch_done,
            )
        )
    return tools
