"""Web tools: ``web_search`` (SearXNG-compatible JSON) and ``web_fetch`` (guarded page fetch).

``create_web_tools(ctx)`` offers each tool only when its provider profile is
bound (spec, "Web tools are created from the worker's web_search/web_fetch
provider availability — if the profiles are unbound, the tools are absent"):

- ``web_search`` when ``settings.web_search_url`` is set: ``GET
  {url}?q=<query>&format=json``; the optional ``settings.web_search_key`` is
  sent in a header (``settings.web_search_key_header``, default
  ``Authorization: Bearer <key>``) or, when ``settings.web_search_key_param``
  names one, as that query parameter. The key never appears in outputs,
  details or error messages.
- ``web_fetch`` when ``settings.web_fetch_enabled``: GET through
  ``worker.tools.netguard.GuardedTransport`` (addresses vetted after DNS and at
  connect time), redirects followed by hand (at most ``MAX_REDIRECTS``, each
  target vetted before any connection), body streamed and cut at
  ``settings.web_fetch_max_bytes`` (decoded bytes); one overall deadline of
  ``settings.web_fetch_timeout`` seconds covers DNS, connect, headers, body
  and every redirect hop (a watchdog cancels the transport when it passes);
  an unknown charset falls back to UTF-8; HTML becomes readable text with
  trafilatura.
"""

from __future__ import annotations

import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from pydantic import BaseModel, Field

from worker.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.settings import Settings
from worker.tools.netguard import BlockedAddressError, GuardedTransport, resolve_vetted
from worker.turn_context import TurnContext

MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
USER_AGENT = "agent-worker-web/0.1 (+tools runtime)"
SEARCH_TIMEOUT = 15.0  # seconds
SEARCH_SNIPPET_CHARS = 400
WATCH_INTERVAL = 0.05  # seconds between the fetch watchdog's deadline/abort checks
CANCEL_JOIN = 1.0  # seconds to let the request thread wind down after a cancel
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml+xml", "application/rss+xml",
              "application/atom+xml", "application/javascript", "application/ld+json")


def _fail(message: str, **details: Any) -> ToolResult:
    return ToolResult(content=message, details={"error": message, **details}, is_error=True)


def _short(text: str, limit: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _url_label(url: str) -> str:
    """``example.com/page`` from ``https://example.com/page?x=1`` (no scheme, no query)."""
    parts = urlsplit(url)
    host = parts.hostname or url
    if parts.port and parts.port not in (80, 443):
        host = f"{host}:{parts.port}"
    return _short(host + (parts.path if parts.path not in ("", "/") else ""), 70)


def _size_label(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{round(n / 1024)} KB"
    return f"{n / (1024 * 1024):.1f} MB"


# --------------------------------------------------------------------------- web_search


class WebSearchParams(BaseModel):
    """Input of ``web_search``."""

    query: str = Field(..., min_length=1, max_length=400, description="What to search for.")
    max_results: int = Field(8, ge=1, le=20, description="How many results to return.")
    time_range: str | None = Field(None, description="Optional recency filter: day, week, month or year.")
    language: str | None = Field(None, description="Optional language code, e.g. 'en'.")


def _search(params: WebSearchParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    url = settings.web_search_url
    assert url  # the tool exists only when the profile is bound
    query: dict[str, str] = {"q": params.query, "format": "json"}
    if params.time_range in ("day", "week", "month", "year"):
        query["time_range"] = params.time_range
    if params.language:
        query["language"] = params.language
    headers = {"Accept": "application/json", "User-Agent": USER_AGENT}
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
            resp = client.get(url, params=query, headers=headers)
    except httpx.TimeoutException:
        return _fail("the search provider did not answer in time")
    except httpx.HTTPError as exc:
        # The exception text can carry the URL (and a key sent as a parameter): report its type only.
        return _fail(f"the search provider could not be reached ({type(exc).__name__})")
    if resp.status_code != 200:
        return _fail(f"the search provider answered HTTP {resp.status_code}", status=resp.status_code)
    try:
        data = orjson.loads(resp.content)
    except orjson.JSONDecodeError:
        return _fail("the search provider did not return JSON (is format=json enabled on it?)")
    raw_results = data.get("results") if isinstance(data, dict) else None
    if not isinstance(raw_results, list):
        return _fail("the search provider's answer has no results list")
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
    return f"Searching the web for '{_short(p.query, 50)}'"


def _describe_search_done(p: WebSearchParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Web search for '{_short(p.query, 50)}' failed"
    n = len(r.details.get("results", []))
    return f"Found {n} {'result' if n == 1 else 'results'} for '{_short(p.query, 50)}'"


# --------------------------------------------------------------------------- web_fetch


class WebFetchParams(BaseModel):
    """Input of ``web_fetch``."""

    url: str = Field(..., min_length=1, max_length=4000, description="http(s) URL of the page to read.")
    raw: bool = Field(False, description="Return the raw body instead of extracted readable text.")


def _check_url(url: httpx.URL, allow_loopback: bool) -> None:
    """Refuse non-http(s) URLs and hosts whose addresses are refused (raises ``BlockedAddressError``)."""
    if url.scheme not in ("http", "https"):
        raise BlockedAddressError(f"only http and https URLs can be fetched, not {url.scheme or 'a bare path'!r}")
    if not url.host:
        raise BlockedAddressError("the URL has no host")
    port = url.port or (443 if url.scheme == "https" else 80)
    resolve_vetted(url.host, port, allow_loopback=allow_loopback)


def html_to_text(html: str, url: str | None = None) -> tuple[str, str | None]:
    """Readable text and title of an HTML page: trafilatura, with a plain lxml fallback.

    Returns ``(text, title)``; ``title`` is ``None`` when the page has none.
    """
    import trafilatura
    from lxml import html as lxml_html

    title = None
    try:
        meta = trafilatura.extract_metadata(html)
        title = meta.title if meta is not None else None
    except Exception:
        title = None
    text = None
    try:
        text = trafilatura.extract(
            html, url=url, output_format="markdown", include_tables=True, include_comments=False, favor_recall=True
        )
    except Exception:
        text = None
    if not text:
        try:
            tree = lxml_html.fromstring(html)
            for bad in tree.xpath("//script|//style|//noscript"):
                bad.drop_tree()
            if title is None:
                found = tree.findtext(".//title")
                title = found.strip() if found else None
            text = "\n".join(line.strip() for line in tree.text_content().splitlines() if line.strip())
        except Exception:
            text = ""
    return text or "", title


class _FetchRun:
    """State shared by ``_fetch`` and its request thread (``lock`` guards the fields the thread writes)."""

    def __init__(self, url: httpx.URL):
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.url = url  # the URL being fetched (changes on redirects)
        self.redirects: list[str] = []
        self.body = bytearray()
        self.headers_done = False  # the final response's status and headers are in
        self.status = 0
        self.content_type = ""
        self.charset: str | None = None
        self.final_url = str(url)
        self.truncated = False
        self.timed_out = False  # an httpx timeout inside the thread
        self.error: ToolResult | None = None
        self.stop = False  # set by the watchdog: keep no more body


def _fetch_in_thread(run: _FetchRun, transport: GuardedTransport, settings: Settings, deadline: float) -> None:
    """GET ``run.url`` following redirects by hand; every hop's timeouts are what is left of ``deadline``."""
    allow_loopback = bool(settings.web_fetch_allow_loopback)
    cap = settings.web_fetch_max_bytes
    url = run.url
    try:
        with httpx.Client(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,*/*;q=0.5",
            },
        ) as client:
            while True:
                _check_url(url, allow_loopback)  # before any connection (the transport checks again)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise httpx.TimeoutException("fetch deadline reached")
                with client.stream("GET", url, timeout=httpx.Timeout(left)) as resp:
                    if resp.status_code in REDIRECT_STATUSES and resp.headers.get("location"):
                        if len(run.redirects) >= MAX_REDIRECTS:
                            run.error = _fail(
                                f"too many redirects (more than {MAX_REDIRECTS})", redirects=list(run.redirects)
                            )
                            return
                        try:
                            url = url.join(resp.headers["location"])
                        except (httpx.InvalidURL, ValueError):
                            run.error = _fail(
                                "the server sent an invalid redirect location", redirects=list(run.redirects)
                            )
                            return
                        with run.lock:
                            run.url = url
                            run.redirects.append(str(url))
                        continue
                    status = resp.status_code
                    content_type = resp.headers.get("content-type", "").split(";")[0].strip().lower()
                    final_url = str(resp.url)
                    if status >= 400:
                        run.error = _fail(f"HTTP {status} from {_url_label(final_url)}", status=status, url=final_url)
                        return
                    if content_type and not content_type.startswith(TEXT_TYPES):
                        run.error = _fail(
                            f"{_url_label(final_url)} is {content_type}, not a text page; not fetched",
                            status=status,
                            url=final_url,
                        )
                        return
                    with run.lock:
                        run.status = status
                        run.content_type = content_type
                        run.charset = resp.charset_encoding
                        run.final_url = final_url
                        run.headers_done = True
                    for chunk in resp.iter_bytes():
                        with run.lock:
                            if run.stop:
                                return
                            run.body += chunk
                            if len(run.body) >= cap:
                                del run.body[cap:]
                                run.truncated = True
                                return
                    return
    except BlockedAddressError as exc:
        run.error = _fail(str(exc), redirects=list(run.redirects))
    except httpx.TimeoutException:
        run.timed_out = True
    except httpx.HTTPError as exc:
        if not run.stop:
            run.error = _fail(
                f"could not fetch {_url_label(str(url))}: {type(exc).__name__}", redirects=list(run.redirects)
            )
    except Exception as exc:  # never let the thread die silently: the tool reports it
        if not run.stop:
            run.error = _fail(
                f"could not fetch {_url_label(str(url))}: {type(exc).__name__}", redirects=list(run.redirects)
            )
    finally:
        run.done.set()


def _decode(body: bytes, charset: str | None) -> str:
    """``body`` as text in ``charset``; an unknown or non-text charset falls back to UTF-8 (errors replaced)."""
    if charset:
        try:
            return body.decode(charset, errors="replace")
        except (LookupError, ValueError, TypeError):
            pass
    return body.decode("utf-8", errors="replace")


def _fetch(params: WebFetchParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    """Fetch under one overall deadline (``settings.web_fetch_timeout``) across DNS, connect,
    headers, body and every redirect hop.

    The request runs in a daemon thread; this thread is the watchdog. At the
    deadline (or on abort) it cancels the transport, which shuts the sockets
    down and wakes the request thread. A body already streaming is returned
    cut, with a note; a fetch whose headers never arrived is an error.
    """
    budget = settings.web_fetch_timeout
    deadline = time.monotonic() + budget
    cap = settings.web_fetch_max_bytes
    try:
        url = httpx.URL(params.url.strip())
    except (httpx.InvalidURL, ValueError) as exc:
        return _fail(f"invalid URL: {exc}")
    transport = GuardedTransport(allow_loopback=bool(settings.web_fetch_allow_loopback))
    run = _FetchRun(url)
    worker = threading.Thread(
        target=_fetch_in_thread, args=(run, transport, settings, deadline), name="web_fetch", daemon=True
    )
    worker.start()
    aborted = hit_deadline = False
    while not run.done.wait(min(WATCH_INTERVAL, max(deadline - time.monotonic(), 0.0))):
        if ctx.abort.aborted:
            aborted = True
            break
        if time.monotonic() >= deadline:
            hit_deadline = True
            break
    if not run.done.is_set():
        with run.lock:
            run.stop = True
        transport.cancel()
        run.done.wait(CANCEL_JOIN)
    with run.lock:
        run.stop = True
        body = bytes(run.body)
        headers_done = run.headers_done
        redirects = list(run.redirects)
        error = run.error
        timed_out = hit_deadline or run.timed_out
        truncated = run.truncated
        status, content_type, charset, final_url = run.status, run.content_type, run.charset, run.final_url
        current = str(run.url)
    if aborted:
        return _fail("fetch cancelled: the turn was aborted", redirects=redirects)
    if error is not None and not (timed_out and headers_done):
        return error
    if timed_out and not headers_done:
        return _fail(f"timed out after {budget:g}s fetching {_url_label(current)}", redirects=redirects)

    raw_text = _decode(body, charset)
    title = None
    if not params.raw and (content_type in ("text/html", "application/xhtml+xml") or (
        not content_type and raw_text.lstrip()[:15].lower().startswith(("<!doctype html", "<html"))
    )):
        text, title = html_to_text(raw_text, url=final_url)
    else:
        text = raw_text
    limit = settings.max_output_chars
    header = [f"URL: {final_url}"]
    if title:
        header.insert(0, f"Title: {title}")
    notes = []
    if truncated:
        notes.append(f"[body cut at {cap:,} bytes (fetch size cap)]")
    if timed_out:
        notes.append(f"[body cut after {budget:g}s (fetch time cap)]")
    if len(text) > limit:
        notes.append(f"[text cut at {limit:,} characters of {len(text):,}]")
        text = text[:limit]
    content = "\n".join(header) + "\n\n" + (text or "(no readable text)") + ("\n" + "\n".join(notes) if notes else "")
    return ToolResult(
        content=content,
        details={
            "url": final_url,
            "status": status,
            "content_type": content_type,
            "bytes": len(body),
            "truncated": truncated or timed_out,
            "redirects": redirects,
            "title": title,
        },
    )


def _describe_fetch(p: WebFetchParams) -> str:
    return f"Fetching {_url_label(p.url)}"


def _describe_fetch_done(p: WebFetchParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not fetch {_url_label(p.url)}"
    return f"Fetched {_size_label(r.details.get('bytes', 0))} from {_url_label(r.details.get('url', p.url))}"


# --------------------------------------------------------------------------- creator


def create_web_tools(ctx: TurnContext) -> list[WorkerTool]:
    """The web tools the worker's bound provider profiles allow: ``[]``, ``[web_search]``,
    ``[web_fetch]`` or both (in that order). Both are read-only and parallel."""
    settings = ctx.settings
    tools: list[WorkerTool] = []
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
                    f"{_size_label(settings.web_fetch_max_bytes)}."
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
