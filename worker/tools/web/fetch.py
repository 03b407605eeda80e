"""The ``web_fetch`` tool: a page fetched through the address guard, turned into text."""

from __future__ import annotations

import threading
import time

import httpx
from pydantic import BaseModel, Field

from worker.model.content_decoding import ACCEPT_ENCODING, BoundedDecoder, ContentEncodingError, parse_content_encoding
from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.web.address_guard import BlockedAddressError, GuardedTransport, resolve_vetted
from worker.tools.web.common import (
    CANCEL_JOIN,
    MAX_REDIRECTS,
    REDIRECT_STATUSES,
    TEXT_TYPES,
    USER_AGENT,
    WATCH_INTERVAL,
    fail,
    size_label,
    url_label,
)

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


def _read_body(run: _FetchRun, resp: httpx.Response, decoder: BoundedDecoder, cap: int) -> None:
    """Append the decoded body to ``run.body`` up to ``cap`` bytes (then ``run.truncated``), or
    until the watchdog sets ``run.stop``. Raw bytes, decoded here with a bound per stage: httpx's
    own decoding of stacked encodings is unbounded per chunk (a decompression bomb: docs/isolation.md, "Web")."""
    raw_seen = 0
    for raw in resp.iter_raw():
        raw_seen += len(raw)
        for piece in decoder.feed(raw):
            with run.lock:
                if run.stop:
                    return
                run.body += piece
                if len(run.body) >= cap:
                    del run.body[cap:]
                    run.truncated = True
                    return
        if raw_seen >= cap:  # a body that decodes to (almost) nothing is capped too
            with run.lock:
                run.truncated = True
            return


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
                "Accept-Encoding": ACCEPT_ENCODING,
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
                            run.error = fail(
                                f"too many redirects (more than {MAX_REDIRECTS})", redirects=list(run.redirects)
                            )
                            return
                        try:
                            url = url.join(resp.headers["location"])
                        except (httpx.InvalidURL, ValueError):
                            run.error = fail(
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
                        run.error = fail(f"HTTP {status} from {url_label(final_url)}", status=status, url=final_url)
                        return
                    if content_type and not content_type.startswith(TEXT_TYPES):
                        run.error = fail(
                            f"{url_label(final_url)} is {content_type}, not a text page; not fetched",
                            status=status,
                            url=final_url,
                        )
                        return
                    try:
                        decoder = BoundedDecoder(parse_content_encoding(resp.headers.get("content-encoding")))
                    except ContentEncodingError as exc:
                        run.error = fail(f"{url_label(final_url)}: {exc}; not fetched", status=status, url=final_url)
                        return
                    with run.lock:
                        run.status = status
                        run.content_type = content_type
                        run.charset = resp.charset_encoding
                        run.final_url = final_url
                        run.headers_done = True
                    _read_body(run, resp, decoder, cap)
                    return
    except BlockedAddressError as exc:
        run.error = fail(str(exc), redirects=list(run.redirects))
    except ContentEncodingError as exc:
        run.error = fail(f"could not decode {url_label(str(url))}: {exc}", redirects=list(run.redirects))
    except httpx.TimeoutException:
        run.timed_out = True
    except httpx.HTTPError as exc:
        if not run.stop:
            run.error = fail(
                f"could not fetch {url_label(str(url))}: {type(exc).__name__}", redirects=list(run.redirects)
            )
    except Exception as exc:  # never let the thread die silently: the tool reports it
        if not run.stop:
            run.error = fail(
                f"could not fetch {url_label(str(url))}: {type(exc).__name__}", redirects=list(run.redirects)
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
        return fail(f"invalid URL: {exc}")
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
        return fail("fetch cancelled: the turn was aborted", redirects=redirects)
    if error is not None and not (timed_out and headers_done):
        return error
    if timed_out and not headers_done:
        return fail(f"timed out after {budget:g}s fetching {url_label(current)}", redirects=redirects)

    raw_text = _decode(body, charset)
    title = None
    if not params.raw and (
        content_type in ("text/html", "application/xhtml+xml")
        or (not content_type and raw_text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")))
    ):
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
    return f"Fetching {url_label(p.url)}"


def _describe_fetch_done(p: WebFetchParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not fetch {url_label(p.url)}"
    return f"Fetched {size_label(r.details.get('bytes', 0))} from {url_label(r.details.get('url', p.url))}"
