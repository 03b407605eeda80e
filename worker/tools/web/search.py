"""The ``web_search`` tool: a SearXNG-compatible JSON search provider."""

from __future__ import annotations

import httpx
import orjson
from pydantic import BaseModel, Field

from worker.model.content_decoding import ACCEPT_ENCODING, BoundedDecoder, ContentEncodingError, parse_content_encoding
from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.web.common import SEARCH_MAX_BYTES, SEARCH_SNIPPET_CHARS, SEARCH_TIMEOUT, USER_AGENT, fail, short

# --------------------------------------------------------------------------- web_search


class WebSearchParams(BaseModel):
    """Input of ``web_search``."""

    query: str = Field(..., min_length=1, max_length=400, description="What to search for.")
    max_results: int = Field(8, ge=1, le=20, description="How many results to return.")
    time_range: str | None = Field(None, description="Optional recency filter: day, week, month or year.")
    language: str | None = Field(None, description="Optional language code, e.g. 'en'.")


def _read_capped(resp: httpx.Response) -> bytes | None:
    """The answer's body decoded with a bound per piece (``BoundedDecoder``: httpx would inflate
    each read whole, a decompression bomb), or None past ``SEARCH_MAX_BYTES`` (decoded or raw).
    Raises ``ContentEncodingError``."""
    decoder = BoundedDecoder(parse_content_encoding(resp.headers.get("content-encoding")))
    body = bytearray()
    raw_seen = 0
    for raw in resp.iter_raw():
        raw_seen += len(raw)
        for piece in decoder.feed(raw):
            body += piece
            if len(body) > SEARCH_MAX_BYTES:
                return None
        if raw_seen > SEARCH_MAX_BYTES:
            return None
    return bytes(body)


def _search(params: WebSearchParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    url = settings.web_search_url
    assert url  # the tool exists only when the profile is bound
    query: dict[str, str] = {"q": params.query, "format": "json"}
    if params.time_range in ("day", "week", "month", "year"):
        query["time_range"] = params.time_range
    if params.language:
        query["language"] = params.language
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT, "Accept-Encoding": ACCEPT_ENCODING}
    key = settings.web_search_key.get_secret_value() if settings.web_search_key else ""
    if key:
        param = settings.web_search_key_param
        if param:
            query[param] = key
        else:
            header = settings.web_search_key_header or "Authorization"
            headers[header] = f"Bearer {key}" if header.lower() == "authorization" else key
    try:
        with httpx.Client(timeout=SEARCH_TIMEOUT, trust_env=False, follow_redirects=False) as client:
            with client.stream("GET", url, params=query, headers=headers) as resp:
                if resp.status_code != 200:
                    return fail(f"the search provider answered HTTP {resp.status_code}", status=resp.status_code)
                body = _read_capped(resp)
    except httpx.TimeoutException:
        return fail("the search provider did not answer in time")
    except httpx.HTTPError as exc:
        # The exception text can carry the URL (and a key sent as a parameter): report its type only.
        return fail(f"the search provider could not be reached ({type(exc).__name__})")
    except ContentEncodingError as exc:
        return fail(f"the search provider's answer could not be decoded ({exc})")
    if body is None:
        return fail(
            f"the search provider's answer is larger than {SEARCH_MAX_BYTES // (1024 * 1024)} MB; not read further"
        )
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return fail("the search provider did not return JSON (is format=json enabled on it?)")
    raw_results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(raw_results, list):
        return fail("the search provider's answer has no results list")
    results: list[dict[str, str]] = []
    for item in raw_results:
        if not isinstance(item, dict) or not item.get("url"):
            continue
        snippet = " ".join(str(item.get("content") or "").split())
        if len(snippet) > SEARCH_SNIPPET_CHARS:
            snippet = snippet[: SEARCH_SNIPPET_CHARS - 1] + "…"
        results.append({"title": str(item.get("title") or item["url"]), "url": str(item["url"]), "snippet": snippet})
        if len(results) >= params.max_results:
            break
    lines = []
    for d in data.get("answers") or []:
        text = d.get("answer") if isinstance(d, dict) else d
        if text:
            lines.append(f"Answer: {text}")
    if not results:
        lines.append(f"No results for {params.query!r}.")
    for i, r in enumerate(results, start=1):
        lines.append(f"{i}. {r['title']}\n   {r['url']}" + (f"\n   {r['snippet']}" if r["snippet"] else ""))
    return ToolResult(content="\n".join(lines), details={"query": params.query, "results": results})


def _describe_search(p: WebSearchParams) -> str:
    return f"Searching the web for '{short(p.query, 50)}'"


def _describe_search_done(p: WebSearchParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Web search for '{short(p.query, 50)}' failed"
    n = len(r.details.get("results", []))
    return f"Found {n} {'result' if n == 1 else 'results'} for '{short(p.query, 50)}'"
