"""Issue 9, web findings: decompression bomb, secrets in logs, the address guard's deny list.

Fetches go to the suite's local web server (tests/support/web_server.py) on loopback;
``loopback_only`` (from test_tools_web) fails any test that tries another address.
"""

from __future__ import annotations

import gzip
import ipaddress
import logging
import os
import subprocess
import sys
import uuid
import zlib
from pathlib import Path

import orjson
import pytest

from tests.conftest import ROOT
from tests.integration.conftest import start_worker_process, stop_process
from tests.integration.test_tools_web import call, fetch_tool, loopback_only, tools_for  # noqa: F401 (autouse fixture)
from tests.support.scripts import fc, msg
from worker.model.content_decoding import BLOCK, BoundedDecoder, ContentEncodingError, parse_content_encoding
from worker.tools.web.address_guard import SPECIAL_PURPOSE_V4, SPECIAL_PURPOSE_V6, block_reason
from worker.turn.request import TurnStatus

# ----------------------------------------------------------------- decompression bomb

_BOMB_RUN = """
import json, resource, sys
from pathlib import Path
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.web.catalog import create_web_tools
from worker.turn.context import TurnContext

base = sys.argv[1]
settings = Settings(web_search_url=None, web_fetch_enabled=True, web_fetch_allow_loopback=True)
ctx = TurnContext(turn_id="t", agent_id="a", home=Path("/tmp"), settings=settings)
tool = {t.name: t for t in create_web_tools(ctx)}["web_fetch"]
def fetch(path):
    p = tool.input_model.model_validate({"url": base + path})
    return tool.execute(p, ToolContext(turn_id="t", call_id="c", home=Path("/tmp"), abort=AbortSignal()))
fetch("/article")  # warm up: imports, first connection
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
r = fetch("/gzip-bomb")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"growth_kb": after - before, "is_error": r.is_error, "details": r.details,
                  "head": r.content[:300] if isinstance(r.content, str) else ""}))
"""


def test_gzip_of_gzip_bomb_is_capped_and_memory_stays_bounded(web_server):
    """1 KB on the wire, 600 MB decoded: the fetch returns the first 2 MB (cap) and the peak RSS
    of the fetching process grows by less than 200 MB (httpx's own decoding grew it by the
    whole 600 MB)."""
    from tests.support.web_server import BOMB_DECODED_BYTES, gzip_bomb

    assert len(gzip_bomb()) < 4096
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_RUN, web_server.base_url], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert not res["is_error"], res
    assert res["details"]["truncated"] is True
    assert res["details"]["bytes"] == 2_000_000 < BOMB_DECODED_BYTES
    assert "fetch size cap" in res["head"] or res["details"]["bytes"] == 2_000_000
    assert res["growth_kb"] < 200 * 1024, f"RSS grew by {res['growth_kb'] / 1024:.0f} MB"


def test_stacked_gzip_page_is_decoded(web_server):
    r = call(fetch_tool(web_fetch_allow_loopback=True), url=f"{web_server.base_url}/gzip-twice")
    assert not r.is_error, r.content
    assert "Celery barriers" in r.content and "Fencing drops stale step messages" in r.content


def test_unsupported_encoding_is_a_clear_error(web_server):
    r = call(fetch_tool(web_fetch_allow_loopback=True), url=f"{web_server.base_url}/brotli")
    assert r.is_error and "unsupported Content-Encoding 'br'" in r.content


def _chunks(data: bytes, n: int = 1000):
    return [data[i : i + n] for i in range(0, len(data), n)]


@pytest.mark.parametrize(
    "encoding, encode",
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send it
        ("deflate, gzip", lambda b: gzip.compress(zlib.compress(b))),
        ("gzip", lambda b: gzip.compress(b[:777]) + gzip.compress(b[777:])),  # two members
        ("identity", lambda b: b),
        ("", lambda b: b),
    ],
)
def test_bounded_decoder_round_trips(encoding, encode):
    data = os.urandom(50_000) + b"text " * 40_000
    dec = BoundedDecoder(parse_content_encoding(encoding))
    pieces = [p for c in _chunks(encode(data)) for p in dec.feed(c)]
    assert b"".join(pieces) == data
    assert max(len(p) for p in pieces) <= max(BLOCK, 1000)


def test_bounded_decoder_yields_bounded_pieces_from_one_small_chunk():
    bomb = gzip.compress(gzip.compress(bytes(50 * 1024 * 1024)))  # ~ 50 MB from a few KB
    dec = BoundedDecoder(parse_content_encoding("gzip, gzip"))
    pieces = dec.feed(bomb)
    first = [next(pieces) for _ in range(3)]  # the caller stops pulling: nothing more is decoded
    assert all(len(p) <= BLOCK for p in first)


@pytest.mark.parametrize("header", ["br", "zstd", "compress", "gzip, br", "gzip, gzip, gzip, gzip, gzip"])
def test_unsupported_or_too_many_encodings_are_refused(header):
    with pytest.raises(ContentEncodingError):
        parse_content_encoding(header)


def test_corrupt_gzip_is_a_content_encoding_error():
    dec = BoundedDecoder(["gzip"])
    with pytest.raises(ContentEncodingError, match="corrupt gzip"):
        list(dec.feed(b"\x1f\x8b\x08\x00garbage-garbage-garbage"))


# ----------------------------------------------------------------- secrets never logged

SEARCH_KEY = "search-key-must-not-be-logged-7731"


@pytest.fixture
def debug_logs(caplog):
    for name in (None, "httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=name)
    return caplog


@pytest.mark.parametrize("as_param", [False, True], ids=["header", "query-parameter"])
def test_search_key_never_appears_in_logs(web_server, debug_logs, as_param):
    settings = {"web_search_url": f"{web_server.base_url}/search", "web_search_key": SEARCH_KEY}
    if as_param:
        settings["web_search_key_param"] = "key"
    r = call(tools_for(**settings)["web_search"], query="otters")
    assert not r.is_error, r.content
    text = debug_logs.text
    assert "HTTP Request: GET" in text  # httpx did log the request (at DEBUG capture)
    assert SEARCH_KEY not in text
    assert "/search?***" in text  # the query string is redacted, not dropped with the line


def test_openai_key_never_appears_in_model_client_logs(gateway, debug_logs, script_name):
    from worker.model.interface import ModelRequest
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient

    key = "sk-must-not-be-logged-4242"
    gateway.add_script(script_name, [{"output": [msg("hi")]}])
    client = SyncModelClient(RESPONSES, gateway.base_url, key)
    try:
        reply = client.create(ModelRequest(model=script_name, input=[]))
    finally:
        client.close()
    assert reply.text == "hi"
    assert "HTTP Request: POST" in debug_logs.text
    assert key not in debug_logs.text


def test_search_key_not_in_a_debug_worker_log(urls_db, web_server, gateway, script_name):
    """Through a real worker logging at DEBUG, with the key sent as a query parameter (the
    filter itself is proven above, with httpx's logger forced to DEBUG)."""
    worker_url, control_url = urls_db
    from control.client import ControlPlane

    proc = start_worker_process(
        "--pool",
        "solo",
        "-c",
        "1",
        "-l",
        "DEBUG",
        env={"REDIS_URL": worker_url, "AGENT_WEB_SEARCH_KEY": SEARCH_KEY, "AGENT_WEB_SEARCH_KEY_PARAM": "key"},
        broker_url=worker_url,
    )
    try:
        gateway.add_script(
            script_name, [{"output": [fc("web_search", '{"query": "otters"}')]}, {"output": [msg("done")]}]
        )
        cp = ControlPlane(control_url)
        turn_id = cp.enqueue({"agent_id": f"w-{uuid.uuid4().hex[:6]}", "input": "search", "model": script_name})
        assert cp.wait(turn_id, timeout=60).status == TurnStatus.completed
        out = [i for i in cp.items(turn_id) if i["type"] == "function_call_output"][0]["output"]
        assert "Result 0 for otters" in out
    finally:
        stop_process(proc)
    log = Path(proc.log_path).read_text()
    assert "DEBUG/" in log  # the worker did log at DEBUG (httpx stays at WARNING unless set)
    assert SEARCH_KEY not in log
    assert os.environ["OPENAI_API_KEY"] not in log


@pytest.fixture
def urls_db():
    db = 9
    return tuple(os.environ[n].rsplit("/", 1)[0] + f"/{db}" for n in ("REDIS_URL", "CONTROL_REDIS_URL"))


# ----------------------------------------------------------------- address guard deny list


def _samples(net: ipaddress.IPv4Network | ipaddress.IPv6Network) -> list[str]:
    first, last = net.network_address, net.broadcast_address
    middle = type(first)(int(first) + (int(last) - int(first)) // 2)
    return sorted({str(first), str(middle), str(last)})


V4_CASES = [(str(net), ip) for net, _ in SPECIAL_PURPOSE_V4 for ip in _samples(net)]
V6_CASES = [(str(net), ip) for net, _ in SPECIAL_PURPOSE_V6 for ip in _samples(net)]


@pytest.mark.parametrize("net, ip", V4_CASES + V6_CASES)
def test_every_special_purpose_block_is_refused(net, ip):
    loopback = ipaddress.ip_address(ip).is_loopback
    assert block_reason(ip) is not None, f"{ip} in {net} passed"
    if not loopback:
        assert block_reason(ip, allow_loopback=True) is not None


@pytest.mark.parametrize("net, ip", V4_CASES)
def test_every_v4_block_is_refused_inside_ipv6(net, ip):
    v4 = ipaddress.IPv4Address(ip)
    for wrapped in (
        f"::ffff:{ip}",  # mapped
        str(ipaddress.IPv6Address((0x64FF9B << 96) | int(v4))),  # NAT64 well-known prefix
        str(ipaddress.IPv6Address((0x2002 << 112) | (int(v4) << 80))),  # 6to4
        str(ipaddress.IPv6Address((0x20010000 << 96) | (~int(v4) & 0xFFFFFFFF))),  # Teredo client
    ):
        assert block_reason(wrapped) is not None, f"{wrapped} ({ip} in {net}) passed"


@pytest.mark.parametrize(
    "ip",
    ["192.0.0.8", "192.0.0.9", "192.0.0.170", "192.88.99.1", "fec0::1", "fed0::abcd", "2001:db8::1", "3fff::1",
     "2001:2::1", "2001:20::1", "5f00::1", "100::1", "64:ff9b:1::1", "4000::1", "::2", "198.19.255.255", "255.255.255.255"],
)  # fmt: skip
def test_named_residue_is_refused(ip):
    assert block_reason(ip) is not None


@pytest.mark.parametrize(
    "ip", ["93.184.215.14", "8.8.8.8", "1.1.1.1", "2606:4700::1111", "2a00:1450:4001::1", "::ffff:8.8.8.8",
           "64:ff9b::808:808", "2002:808:808::1", "192.0.1.1", "192.88.100.1", "198.20.0.1"],
)  # fmt: skip
def test_public_addresses_still_pass(ip):
    assert block_reason(ip) is None


@pytest.mark.parametrize("url", ["http://192.0.0.8/", "http://192.88.99.1/", "http://[fec0::1]/", "http://[2001::1]/"])
def test_fetch_of_residue_is_refused_before_connecting(url, loopback_only):  # noqa: F811
    r = call(fetch_tool(web_fetch_allow_loopback=True), url=url)
    assert r.is_error and "refused to fetch" in r.content
    assert loopback_only == []
