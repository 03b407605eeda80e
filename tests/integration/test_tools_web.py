"""Web tools called directly against local servers (loopback only).

Every test runs under ``loopback_only``: ``socket.socket.connect`` is wrapped
so that a connection attempt to any non-loopback address fails the test
*without* being made. Refusals are therefore proven to happen before any
traffic leaves for a private or metadata address.
"""

from __future__ import annotations

import gzip
import ipaddress
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import orjson
import pytest

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, WorkerTool
from worker.tools.web import address_guard as netguard
from worker.tools.web.address_guard import BlockedAddressError, GuardedTransport, block_reason
from worker.tools.web.catalog import create_web_tools
from worker.turn.context import TurnContext

ARTICLE = """<!doctype html><html><head><title>Otters of the River</title></head><body>
<nav>Home | About | Contact</nav>
<article><h1>Otters of the River</h1>
<p>River otters are semi-aquatic mammals that live along waterways across North America.
They have long bodies, webbed feet and dense fur that keeps them warm in cold water.</p>
<p>Otters eat fish, crayfish and amphibians, and they are known for playful sliding on mud banks.
Conservation efforts have helped otter populations recover in many regions after decades of decline.</p>
<p>Researchers track otters by their tracks and scat, and by radio collars in some studies.</p>
</article><script>var tracking = "SHOULD-NOT-APPEAR";</script>
<footer>Copyright notice</footer></body></html>"""

SEARX = {
    "query": "otters",
    "results": [
        {"url": "https://example.org/otters", "title": "Otter facts", "content": "All about   otters.", "engine": "x"},
        {"url": "https://example.net/rivers", "title": "Rivers", "content": "Where otters live."},
        {"title": "no url, skipped"},
        {"url": "https://example.com/3", "title": "Third", "content": ""},
    ],
    "answers": [],
    "suggestions": [],
}


# The fake search provider's answers: path -> (body, content type, extra headers).
SEARCH_ANSWERS: dict[str, tuple[bytes, str, dict[str, str]]] = {
    "/search": (orjson.dumps(SEARX), "application/json", {}),
    "/search-html": (b"<html>not json</html>", "text/html; charset=utf-8", {}),
    # ~200 KB of gzip that inflates to 200 MB
    "/search-bomb": (
        gzip.compress(b'{"results": [' + b" " * 200_000_000, 9),
        "application/json",
        {"Content-Encoding": "gzip"},
    ),
    "/search-huge": (b'{"results": [' + b" " * 5_000_000 + b"]}", "application/json", {}),  # plain, but 5 MB
}


class Handler(BaseHTTPRequestHandler):
    seen: list[dict] = []

    def log_message(self, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes = b"", ctype: str = "text/html; charset=utf-8", headers=None):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        parts = urlsplit(self.path)
        q = parse_qs(parts.query)
        Handler.seen.append({"path": parts.path, "query": q, "headers": dict(self.headers)})
        if parts.path == "/page":
            return self._send(200, ARTICLE.encode())
        if parts.path == "/plain":
            return self._send(200, b"just text\n", "text/plain")
        if parts.path == "/big":
            return self._send(200, b"z" * 300_000, "text/plain")
        if parts.path == "/image":
            return self._send(200, b"\x89PNG....", "image/png")
        if parts.path == "/missing":
            return self._send(404, b"nope")
        if parts.path == "/to":
            return self._send(302, b"", headers={"Location": q["u"][0]})
        if parts.path == "/loop":
            return self._send(302, b"", headers={"Location": "/loop"})
        if parts.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            try:
                for _ in range(40):
                    self.wfile.write(b"tick\n")
                    self.wfile.flush()
                    time.sleep(0.25)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return
        if parts.path == "/badcs":
            body = b"<html><body><p>hello caf\xc3\xa9</p></body></html>"
            return self._send(200, body, "text/html; charset=x-no-such")
        if parts.path == "/slowhdr":
            # Headers trickle in: one line every 0.4s, never a read timeout, never done in time.
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self.wfile.flush()
                for i in range(int(q.get("n", ["15"])[0])):
                    time.sleep(0.4)
                    self.wfile.write(f"X-Slow-{i}: yes\r\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"Content-Type: text/plain\r\nContent-Length: 2\r\n\r\nok")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True
            return
        if parts.path == "/slowhop":
            # Each redirect hop takes 0.6s: fine per hop, too slow in total.
            n = int(q.get("n", ["0"])[0])
            time.sleep(0.6)
            if n <= 0:
                return self._send(200, b"arrived\n", "text/plain")
            return self._send(302, b"", headers={"Location": f"/slowhop?n={n - 1}"})
        if parts.path in SEARCH_ANSWERS:
            body, ctype, headers = SEARCH_ANSWERS[parts.path]
            return self._send(200, body, ctype, headers=headers)
        return self._send(404, b"unknown")


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Fail (without connecting) on any client connection to a non-loopback address."""
    attempts: list[tuple] = []
    real_connect = socket.socket.connect

    def guarded(self, address):
        host = address[0] if isinstance(address, tuple) else address
        attempts.append(address)
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
        if not ok:
            raise AssertionError(f"test tried to connect to non-loopback address {address!r}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    yield attempts
    assert all(ipaddress.ip_address(a[0]).is_loopback for a in attempts if isinstance(a, tuple))


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


# Explicit values: the suite's environment binds web profiles for the worker tests.
UNBOUND = {
    "web_search_url": None,
    "web_search_key": None,
    "web_fetch_enabled": False,
    "web_fetch_allow_loopback": False,
}


def tools_for(**settings) -> dict[str, WorkerTool]:
    ctx = TurnContext(turn_id="t", agent_id="a", home=Path("/tmp"), settings=Settings(**{**UNBOUND, **settings}))
    return {t.name: t for t in create_web_tools(ctx)}


def fetch_tool(**settings) -> WorkerTool:
    return tools_for(web_fetch_enabled=True, **settings)["web_fetch"]


def call(tool: WorkerTool, abort: AbortSignal | None = None, **params) -> ToolResult:
    p = tool.input_model.model_validate(params)
    return tool.execute(p, ToolContext(turn_id="t", call_id="c", home=Path("/tmp"), abort=abort or AbortSignal()))


# ----------------------------------------------------------------- assembly


def test_tools_absent_without_profiles():
    assert tools_for() == {}
    assert list(tools_for(web_fetch_enabled=True)) == ["web_fetch"]
    assert list(tools_for(web_search_url="http://127.0.0.1:1/search")) == ["web_search"]
    both = tools_for(web_fetch_enabled=True, web_search_url="http://127.0.0.1:1/search")
    assert list(both) == ["web_search", "web_fetch"]
    for t in both.values():
        assert t.is_read_only and t.execution_mode == "parallel"


# ----------------------------------------------------------------- address rules


@pytest.mark.parametrize(
    "ip",
    [
        "127.0.0.1",
        "::1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "169.254.169.254",
        "169.254.1.1",
        "fd00:ec2::254",
        "fe80::1",
        "224.0.0.1",
        "ff02::1",
        "0.0.0.0",
        "240.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:127.0.0.1",
        "64:ff9b::a00:1",
        "2002:a00:1::",
        "100.100.100.200",
    ],
)
def test_block_reason_refuses(ip):
    assert block_reason(ip) is not None


def test_block_reason_allows_public_and_loopback_only_with_flag():
    assert block_reason("93.184.215.14") is None
    assert block_reason("2606:4700::1111") is None
    assert block_reason("127.0.0.1", allow_loopback=True) is None
    assert block_reason("::1", allow_loopback=True) is None
    for ip in ("10.0.0.1", "169.254.169.254", "fd00:ec2::254", "192.168.0.1", "100.64.0.1", "0.0.0.0"):
        assert block_reason(ip, allow_loopback=True) is not None
    assert "metadata" in block_reason("169.254.169.254", allow_loopback=True)


# ----------------------------------------------------------------- web_fetch happy path


def test_fetch_page_readable_text_and_labels(server):
    tool = fetch_tool(web_fetch_allow_loopback=True)
    r = call(tool, url=f"{server}/page")
    assert not r.is_error, r.content
    assert "Title: Otters of the River" in r.content
    assert "semi-aquatic mammals" in r.content
    assert "SHOULD-NOT-APPEAR" not in r.content
    assert r.details["status"] == 200 and r.details["bytes"] == len(ARTICLE.encode())
    port = server.rsplit(":", 1)[1]
    p = tool.input_model.model_validate({"url": f"{server}/page"})
    assert tool.activity(p) == f"Fetching 127.0.0.1:{port}/page"
    assert tool.completed_activity(p, r) == f"Fetched {len(ARTICLE.encode())} B from 127.0.0.1:{port}/page"


def test_fetch_plain_and_allowed_redirect(server):
    tool = fetch_tool(web_fetch_allow_loopback=True)
    r = call(tool, url=f"{server}/to?u=/plain")
    assert not r.is_error and "just text" in r.content
    assert r.details["redirects"] == [f"{server}/plain"]


def test_fetch_size_cap(server):
    tool = fetch_tool(web_fetch_allow_loopback=True, web_fetch_max_bytes=10_000)
    r = call(tool, url=f"{server}/big")
    assert not r.is_error
    assert r.details["bytes"] == 10_000 and r.details["truncated"]
    assert "body cut at 10,000 bytes" in r.content


def test_fetch_time_cap(server):
    tool = fetch_tool(web_fetch_allow_loopback=True, web_fetch_timeout=1.0)
    t0 = time.monotonic()
    r = call(tool, url=f"{server}/slow")
    assert time.monotonic() - t0 < 4
    assert not r.is_error and "tick" in r.content
    assert "fetch time cap" in r.content


def test_fetch_errors(server):
    tool = fetch_tool(web_fetch_allow_loopback=True)
    r = call(tool, url=f"{server}/missing")
    assert r.is_error and "HTTP 404" in r.content
    r = call(tool, url=f"{server}/image")
    assert r.is_error and "image/png" in r.content
    r = call(tool, url=f"{server}/loop")
    assert r.is_error and "too many redirects" in r.content
    assert len(r.details["redirects"]) == 5
    r = call(tool, url="file:///etc/passwd")
    assert r.is_error and "only http and https" in r.content
    r = call(tool, url="ftp://127.0.0.1/x")
    assert r.is_error and "only http and https" in r.content


# ----------------------------------------------------------------- web_fetch refusals


@pytest.mark.parametrize(
    "url, why",
    [
        ("http://127.0.0.1:9/", "loopback"),
        ("http://[::1]:9/", "loopback"),
        ("http://localhost:9/", "loopback"),
        ("http://10.0.0.1/", "private"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://[fd00:ec2::254]/", "metadata"),
        ("http://100.64.0.1/", "carrier-grade NAT"),
        ("http://0.0.0.0:9/", "unspecified"),
    ],
)
def test_fetch_refuses_without_loopback_flag(url, why, loopback_only):
    tool = fetch_tool()
    r = call(tool, url=url)
    assert r.is_error
    assert why in r.content
    assert loopback_only == []  # refused before any connection attempt


@pytest.mark.parametrize("target", ["http://10.0.0.1/admin", "http://169.254.169.254/latest/meta-data/"])
def test_redirect_to_private_refused_before_connecting(server, target, loopback_only):
    tool = fetch_tool(web_fetch_allow_loopback=True)
    r = call(tool, url=f"{server}/to?u={target}")
    assert r.is_error
    assert ("private" in r.content) or ("metadata" in r.content)
    assert r.details["redirects"] == [target]
    # Only the local server was ever connected to.
    assert loopback_only and all(a[0] == "127.0.0.1" for a in loopback_only)


def test_private_refused_even_with_loopback_flag(loopback_only):
    tool = fetch_tool(web_fetch_allow_loopback=True)
    for url in ("http://10.0.0.1/", "http://192.168.1.1/", "http://169.254.169.254/"):
        r = call(tool, url=url)
        assert r.is_error
    assert loopback_only == []


def test_transport_vets_at_connect_time(loopback_only):
    """The transport alone (no pre-check) refuses, so nothing bypasses it."""
    with httpx.Client(transport=GuardedTransport(allow_loopback=True)) as client:
        with pytest.raises(BlockedAddressError):
            client.get("http://10.0.0.1/")
        with pytest.raises(BlockedAddressError):
            client.get("http://[fd00:ec2::254]/")
    assert loopback_only == []


def test_dns_rebinding_is_caught_at_connect(monkeypatch, loopback_only):
    """A name that resolves public for the pre-check, then private, is refused at connect time."""
    answers = iter(["93.184.215.14", "10.0.0.7"])
    real = socket.getaddrinfo

    def fake_getaddrinfo(host, port, *args, **kwargs):
        if host == "rebind.test":
            ip = next(answers)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(netguard.socket, "getaddrinfo", fake_getaddrinfo)
    r = call(fetch_tool(), url="http://rebind.test/")
    assert r.is_error and "10.0.0.7" in r.content and "private" in r.content
    assert loopback_only == []


def test_mixed_public_private_answers_refused(monkeypatch, loopback_only):
    def fake_getaddrinfo(host, port, *args, **kwargs):
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.215.14", port)),
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("192.168.0.5", port)),
        ]

    monkeypatch.setattr(netguard.socket, "getaddrinfo", fake_getaddrinfo)
    r = call(fetch_tool(), url="https://mixed.test/")
    assert r.is_error and "192.168.0.5" in r.content
    assert loopback_only == []


# ----------------------------------------------------------------- web_search


def test_search_against_fake_searxng(server):
    Handler.seen.clear()
    tools = tools_for(web_search_url=f"{server}/search", web_search_key="search-key-not-in-output")
    tool = tools["web_search"]
    r = call(tool, query="otters", max_results=2)
    assert not r.is_error, r.content
    assert r.content.splitlines() == [
        "1. Otter facts",
        "   https://example.org/otters",
        "   All about otters.",
        "2. Rivers",
        "   https://example.net/rivers",
        "   Where otters live.",
    ]
    req = Handler.seen[-1]
    assert req["path"] == "/search" and req["query"]["q"] == ["otters"] and req["query"]["format"] == ["json"]
    assert req["headers"].get("Authorization") == "Bearer search-key-not-in-output"
    assert "search-key-not-in-output" not in r.content
    assert "search-key-not-in-output" not in orjson.dumps(r.details).decode()
    p = tool.input_model.model_validate({"query": "otters"})
    assert tool.activity(p) == "Searching the web for 'otters'"
    assert tool.completed_activity(p, r) == "Found 2 results for 'otters'"
    r = call(tool, query="otters")
    assert len(r.details["results"]) == 3  # the item without a url is skipped


def test_a_search_answer_is_read_only_up_to_its_cap_decoded_in_bounded_pieces(server):
    """A search provider's answer is capped (``SEARCH_MAX_BYTES``, decoded): a plain answer above it
    and a gzip bomb (200 KB inflating to 200 MB; httpx would inflate each read whole) fail the
    search with the cap in the message, holding a few MB at most."""
    import tracemalloc

    for path in ("/search-huge", "/search-bomb"):
        tracemalloc.start()
        try:
            r = call(tools_for(web_search_url=f"{server}{path}")["web_search"], query="x")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert r.is_error and "larger than 4 MB" in r.content, (path, r.content)
        assert peak < 40_000_000, (path, peak)


def test_search_errors(server):
    r = call(tools_for(web_search_url=f"{server}/search-html")["web_search"], query="x")
    assert r.is_error and "did not return JSON" in r.content
    r = call(tools_for(web_search_url=f"{server}/nowhere")["web_search"], query="x")
    assert r.is_error and "HTTP 404" in r.content
    r = call(tools_for(web_search_url="http://127.0.0.1:1/search", web_search_key="k-secret")["web_search"], query="x")
    assert r.is_error and "could not be reached" in r.content and "k-secret" not in r.content


# ----------------------------------------------------------------- regressions: charset, overall deadline


def test_fetch_unknown_charset_falls_back_to_utf8(server):
    r = call(fetch_tool(web_fetch_allow_loopback=True), url=f"{server}/badcs")
    assert not r.is_error
    assert "hello café" in r.content


def test_fetch_deadline_covers_slow_headers(server):
    tool = fetch_tool(web_fetch_allow_loopback=True, web_fetch_timeout=1.5)
    t0 = time.monotonic()
    r = call(tool, url=f"{server}/slowhdr")
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed
    assert r.is_error and "timed out after 1.5s" in r.content


def test_fetch_deadline_spans_redirect_hops(server):
    tool = fetch_tool(web_fetch_allow_loopback=True, web_fetch_timeout=1.5)
    t0 = time.monotonic()
    r = call(tool, url=f"{server}/slowhop?n=4")  # 5 hops x 0.6s: each fine alone, 3s in all
    elapsed = time.monotonic() - t0
    assert elapsed < 3.0, elapsed
    assert r.is_error and "timed out" in r.content
    assert r.details["redirects"]  # it did follow some hops before the deadline
    ok = call(fetch_tool(web_fetch_allow_loopback=True, web_fetch_timeout=5), url=f"{server}/slowhop?n=1")
    assert not ok.is_error and "arrived" in ok.content


def test_fetch_abort_during_slow_headers(server):
    tool = fetch_tool(web_fetch_allow_loopback=True, web_fetch_timeout=30)
    abort = AbortSignal()
    timer = threading.Timer(0.5, abort.abort)
    timer.start()
    try:
        t0 = time.monotonic()
        r = call(tool, abort=abort, url=f"{server}/slowhdr")
        assert time.monotonic() - t0 < 3.0
        assert r.is_error and "cancelled" in r.content
    finally:
        timer.cancel()
