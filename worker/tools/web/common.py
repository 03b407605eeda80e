"""Shared by the web tools: limits, the user agent, error results and labels."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from worker.tooling.contract import ToolResult

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "agent-worker-web/0.1 (+tools runtime)"
SEARCH_TIMEOUT = 15.0  # seconds
SEARCH_SNIPPET_CHARS = 400
# Cap on a search provider's answer, decoded (bytes): results lists are a few KB; a bigger answer
# (or a compressed one that inflates without end) fails the search instead of a worker's memory.
SEARCH_MAX_BYTES = 4 * 1024 * 1024
WATCH_INTERVAL = 0.05  # seconds between the fetch watchdog's deadline/abort checks
CANCEL_JOIN = 1.0  # seconds to let the request thread wind down after a cancel
TEXT_TYPES = (
    "text/",
    "application/json",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/javascript",
    "application/ld+json",
)


def fail(message: str, **details: Any) -> ToolResult:
    return ToolResult(content=message, details={"error": message, **details}, is_error=True)


def short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def url_label(url: str) -> str:
    """``example.com/page`` from ``https://example.com/page?x=1`` (no scheme, no query)."""
    parts = urlsplit(url)
    host = parts.hostname or url
    if parts.port and parts.port not in (80, 443):
        host = f"{host}:{parts.port}"
    return short(host + (parts.path if parts.path not in ("", "/") else ""), 70)


def size_label(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{round(n / 1024)} KB"
    return f"{n / (1024 * 1024):.1f} MB"
