"""No client of the HTTP API can hurt another: attacks on a real API server (uvicorn, its own
Redis database, no worker: turns stay ``queued`` and their event streams stay open, the test
appending their events as a worker would).

- a poisoned event id (beyond Redis's 64-bit range, non-ASCII digits) is refused with 400 before
  it reaches Redis, and the process's shared ``XREAD`` keeps serving everyone else;
- a stream the hub cannot read (a key that is no stream) is dropped alone: the hub goes on;
- one token cannot hold more than its cap of streams, feeds included, however many it opens at once;
- failed authentication is throttled per client address;
- errors keep their one shape, 500s included.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections import Counter

import httpx
import orjson
import pytest
import redis.asyncio

from control.api.hub import StreamHub
from control.client import ControlPlane
from tests.support.api_server import ApiServer
from tests.support.scripts import wait_for

DB = 12  # a database of its own: no worker runs these turns
CAP = 32  # AGENT_API_MAX_STREAMS_PER_TOKEN's default


def _db_url(name: str, db: int = DB) -> str:
    return os.environ[name].rsplit("/", 1)[0] + f"/{db}"


@pytest.fixture(scope="module")
def api(redis_url):
    srv = ApiServer(_db_url("CONTROL_REDIS_URL"), AGENT_API_HEARTBEAT="1").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cp(redis_url) -> ControlPlane:
    return ControlPlane(_db_url("CONTROL_REDIS_URL"))


def _agent() -> str:
    return f"atk-{uuid.uuid4().hex[:8]}"


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param", "code"}, body
    return body["error"]


def _turn(api: ApiServer, token: str, agent: str) -> str:
    resp = api.client(token).post("/v1/turns", json={"agent_id": agent, "input": "wait here"})
    assert resp.status_code == 201, resp.text
    return resp.json()["turn_id"]


class Follower(threading.Thread):
    """Reads a turn's event stream in the background: ``kinds`` seen so far."""

    def __init__(self, client: httpx.Client, turn_id: str):
        super().__init__(daemon=True)
        self.client, self.turn_id, self.kinds, self.status = client, turn_id, [], None

    def run(self) -> None:
        try:
            with self.client.stream("GET", f"/v1/turns/{self.turn_id}/events", timeout=60) as resp:
                self.status = resp.status_code
                for line in resp.iter_lines():
                    if line.startswith("event: "):
                        self.kinds.append(line[7:])
        except httpx.HTTPError:
            pass


POISONED = [
    "99999999999999999999-0",  # past 2**64 - 1
    "18446744073709551616-0",  # 2**64
    "0-18446744073709551616",
    "\u0661\u0662\u0663-0",  # Arabic-Indic digits: str.isdigit() says yes, Redis says no
    "abc",
    "1-2-3",
    "-1-0",
    "+5-0",
    "5 -0",
]


def test_a_poisoned_event_id_is_refused_and_never_stops_anyone_elses_stream(api, cp):
    victim_agent, attacker_agent = _agent(), _agent()
    victim_tok, attacker_tok = api.token([victim_agent]), api.token([attacker_agent])
    victim_turn, attacker_turn = _turn(api, victim_tok, victim_agent), _turn(api, attacker_tok, attacker_agent)
    victim = Follower(api.client(victim_tok), victim_turn)
    victim.start()
    wait_for(lambda: "turn_queued" in victim.kinds, timeout=10)
    attacker = api.client(attacker_tok, timeout=5)
    answers = []
    for bad in POISONED:
        for how in ("header", "query"):
            if how == "header":
                kw: dict = {"headers": {"Last-Event-ID": bad.encode()}}
            else:
                kw = {"params": {"after": bad}}
            with attacker.stream("GET", f"/v1/turns/{attacker_turn}/events", **kw) as resp:
                body = orjson.loads(resp.read()) if resp.status_code == 400 else None
                answers.append((bad, how, resp.status_code, body))  # a 200 stream is closed here
    # The victim's stream goes on, while the attacker holds its poisoned request open: the event a
    # worker appends now reaches it.
    poisoned = {"Last-Event-ID": POISONED[0]}
    with attacker.stream("GET", f"/v1/turns/{attacker_turn}/events", headers=poisoned):
        time.sleep(0.5)
        cp.store.event(victim_turn, "note", text="still here")
        wait_for(lambda: "note" in victim.kinds, timeout=10)
    for bad, how, status, body in answers:
        assert status == 400, (bad, how, status)
        assert body["error"]["param"] == ("Last-Event-ID" if how == "header" else "after"), body
    cp.cancel(victim_turn)
    victim.join(10)
    assert victim.kinds[-1] == "turn_finished"


async def _hub_survives_a_bad_stream(url: str) -> None:
    client = redis.asyncio.Redis.from_url(url)
    hub = StreamHub(client, block_ms=500)
    hub.start()
    good, bad = f"api-test:{uuid.uuid4().hex}", f"api-test:{uuid.uuid4().hex}"
    try:
        await client.set(bad, "not a stream")  # XREAD on it fails: WRONGTYPE
        good_sub = hub.subscribe(good, "0-0")
        bad_sub = hub.subscribe(bad, "0-0")
        await asyncio.sleep(0.3)
        await client.xadd(good, {"e": b'{"kind": "note"}'})
        key, _eid, ev = await asyncio.wait_for(good_sub.queue.get(), timeout=5)
        assert key == good and ev == {"kind": "note"}
        assert bad_sub.lagging and hub.streams == 1  # the bad one was dropped alone
        assert bad_sub.queue.get_nowait() == ("", "0-0", {})  # and its reader woken to end now
        await client.xadd(good, {"e": b"{not json"})  # entries that are no event: skipped
        await client.xadd(good, {"x": b"1"})
        await client.xadd(good, {"e": b'{"kind": "again"}'})
        assert (await asyncio.wait_for(good_sub.queue.get(), timeout=5))[2] == {"kind": "again"}
        assert hub.running and good_sub.queue.empty()
    finally:
        await hub.stop()
        await client.delete(good, bad)
        await client.aclose()


def test_one_bad_read_never_stops_the_shared_hub(redis_url):
    asyncio.run(_hub_survives_a_bad_stream(_db_url("REDIS_URL")))


async def _open_at_once(base_url: str, token: str, path: str, n: int) -> Counter:
    """Open ``n`` streams on ``path`` at once and hold the admitted ones until all were answered;
    counts of their status codes (429s whose message is not the stream cap count as ``other``)."""
    statuses: list[int | str] = []
    release = asyncio.Event()
    limits = httpx.Limits(max_connections=n + 10, max_keepalive_connections=0)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=60, limits=limits) as client:

        async def one() -> None:
            async with client.stream("GET", path) as resp:
                if resp.status_code == 429:
                    text = (await resp.aread()).decode()
                    statuses.append(429 if "streams" in text else f"other: {text}")
                    return
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    await release.wait()

        tasks = [asyncio.create_task(one()) for _ in range(n)]
        deadline = time.monotonic() + 60
        while len(statuses) < n and time.monotonic() < deadline:
            done = [t for t in tasks if t.done() and t.exception()]
            if done:
                raise done[0].exception()  # type: ignore[misc]
            await asyncio.sleep(0.05)
        counts = Counter(statuses)
        release.set()
        await asyncio.gather(*tasks)
    return counts


def test_forty_concurrent_stream_opens_admit_exactly_the_cap(api):
    agent = _agent()
    token = api.token([agent], rate=10_000, burst=10_000)
    turn = _turn(api, token, agent)
    counts = asyncio.run(_open_at_once(api.base_url, token, f"/v1/turns/{turn}/events", 40))
    assert counts == Counter({200: CAP, 429: 40 - CAP}), counts
    # Released on disconnect: the token can open its streams again.
    c = api.client(token, timeout=5)

    def admitted() -> bool:
        with c.stream("GET", f"/v1/turns/{turn}/events") as resp:
            return resp.status_code == 200

    wait_for(admitted, timeout=10)


def test_six_hundred_feeds_on_one_token_admit_exactly_the_cap(api):
    token = api.token(None, rate=10_000, burst=10_000)
    counts = asyncio.run(_open_at_once(api.base_url, token, "/v1/approvals/events", 600))
    assert counts == Counter({200: CAP, 429: 600 - CAP}), counts
    # Another token is not affected by the first one's cap.
    other = api.client(api.token(None), timeout=5)
    with other.stream("GET", "/v1/approvals/events") as resp:
        assert resp.status_code == 200


def test_failed_authentication_is_throttled_per_client_address(redis_url):
    srv = ApiServer(
        _db_url("CONTROL_REDIS_URL", 13), AGENT_API_AUTH_FAILURES="5", AGENT_API_AUTH_FAILURE_WINDOW="3"
    ).start()
    try:
        good = srv.client(srv.token(None))
        assert good.get("/v1/approvals").status_code == 200
        forged = srv.client("atr_00000000_forged")
        codes = [forged.get("/v1/approvals").status_code for _ in range(5)]
        assert codes == [401] * 5
        resp = forged.get("/v1/approvals")
        err = _error(resp, 429)
        assert "authentication" in err["message"] and 1 <= int(resp.headers["Retry-After"]) <= 3
        _error(srv.client("not-even-a-token").get("/v1/approvals"), 429)
        _error(good.get("/v1/approvals"), 429)  # the address is throttled, whatever it sends next
        time.sleep(3.2)
        assert good.get("/v1/approvals").status_code == 200
    finally:
        srv.stop()


def test_errors_keep_their_shape_even_for_text_that_is_not_unicode(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    body = b'{"agent_id": "' + agent.encode() + b'", "input": "x \\ud800 y"}'
    err = _error(c.post("/v1/turns", content=body, headers={"content-type": "application/json"}), 400)
    assert "Unicode" in err["message"]
    assert c.get("/v1/turns", params={"agent_id": agent}).json()["data"] == []


def test_event_ids_are_parsed_to_redis_exact_range():
    from control.api.hub import parse_event_id

    top = str(2**64 - 1)
    assert parse_event_id(f"{top}-{top}") == f"{top}-{top}"
    assert parse_event_id("1700000000000") == "1700000000000-0"
    assert parse_event_id("0-0") == "0-0" and parse_event_id("007-01") == "7-1"
    assert all(parse_event_id(bad) is None for bad in [*POISONED, "", "-", "1-", f"{2**64}", "1" * 21])
