"""The HTTP edge's fast paths (issue 34) against a real API server and Redis, on a database of their
own where no worker consumes, so queued messages stay to be read back:

- an enqueue over HTTP runs on the event loop: one script stores the turn and queues its first
  step (``ControlPlane.create_call``), the same message ``ControlPlane.create`` sends, and a
  repeated idempotency key queues nothing;
- live events are decoded and framed once per entry by the hub: a stored event whose JSON spans
  lines still goes out as one ``data:`` line, and one hub serves a thousand streams with its own
  packed ``XREAD``;
- keep-alives come from the hub's one timer, and an idle stream whose turn is gone ends;
- the server runs on uvloop and httptools.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import orjson
import pytest
import redis
import redis.asyncio

from control.api.hub import StreamHub
from control.api.tokens import digest, token_key
from control.client import ControlPlane
from devtools.embedded_redis import EmbeddedRedis
from tests.support.api_server import ApiServer
from worker.turn.async_reads import AsyncTurnReads
from worker.turn.guard import CREATE_LUA
from worker.turn.request import TurnRequest

DB = 10  # a database of its own: no worker consumes its queues


@contextlib.contextmanager
def _own_api(**env: str) -> Iterator[tuple[EmbeddedRedis, ApiServer]]:
    """A Redis and an API process of the test's own (``env``: the API's settings), stopped after."""
    with EmbeddedRedis() as emb:
        srv = ApiServer(emb.control_url, **env).start()
        try:
            yield emb, srv
        finally:
            srv.stop()


def _db_url(name: str) -> str:
    return os.environ[name].rsplit("/", 1)[0] + f"/{DB}"


@pytest.fixture(scope="module")
def api(redis_url):
    srv = ApiServer(_db_url("CONTROL_REDIS_URL"), AGENT_API_HEARTBEAT="1").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cp(redis_url) -> ControlPlane:
    return ControlPlane(_db_url("CONTROL_REDIS_URL"))


@pytest.fixture(scope="module")
def r(redis_url) -> redis.Redis:
    return redis.Redis.from_url(_db_url("REDIS_URL"))


def _agent() -> str:
    return f"fast-{uuid.uuid4().hex[:8]}"


def _messages(r: redis.Redis, turn_id: str) -> list[dict]:
    """The ``turns`` queue's messages for ``turn_id``, decoded: ``{"args", "headers", "properties"}``."""
    out = []
    for raw in r.lrange("turns", 0, -1):
        msg = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(msg["body"]))
        if args and args[0] == turn_id:
            out.append({"args": args, "headers": msg["headers"], "properties": msg["properties"], "raw": msg})
    return out


def test_create_call_queues_the_first_step_in_the_creation_script_as_create_does(cp, r):
    agent = _agent()
    call = cp.create_call(TurnRequest(agent_id=agent, input="hello"))
    assert call.sends_message  # the message rides in the script: no second round trip, no turn without it
    script = r.register_script(CREATE_LUA)
    turn_id, created = call.result(script(keys=call.keys, args=call.args))
    assert (turn_id, created) == (call.turn_id, True)
    assert cp.status(turn_id).status.value == "queued"
    (mine,) = _messages(r, turn_id)

    other, _ = cp.create({"agent_id": agent, "input": "hello"})  # the Python client's own publish
    (theirs,) = _messages(r, other)
    assert mine["args"] == [turn_id, 0] and theirs["args"] == [other, 0]
    assert mine["headers"]["task"] == theirs["headers"]["task"] == "tasks.turns.turn_step"
    assert set(mine["headers"]) == set(theirs["headers"]) and set(mine["raw"]) == set(theirs["raw"])
    assert mine["properties"]["delivery_info"] == theirs["properties"]["delivery_info"]
    assert mine["headers"]["argsrepr"] == theirs["headers"]["argsrepr"].replace(other, turn_id)

    # The same call again (a retried script): the turn exists, nothing more is queued.
    assert call.result(script(keys=call.keys, args=call.args)) == (turn_id, False)
    assert len(_messages(r, turn_id)) == 1


def test_an_http_enqueue_queues_one_step_and_a_repeated_key_queues_nothing(api, r):
    agent = _agent()
    c = api.client(api.token([agent]))
    body = {"agent_id": agent, "input": "hello"}
    first = c.post("/v1/turns", json=body, headers={"Idempotency-Key": "k-1"})
    assert first.status_code == 201, first.text
    turn_id = first.json()["turn_id"]
    assert first.json()["status"] == "queued" and first.json()["created"] is True
    (msg,) = _messages(r, turn_id)
    assert msg["headers"]["task"] == "tasks.turns.turn_step" and msg["args"] == [turn_id, 0]
    again = c.post("/v1/turns", json=body, headers={"Idempotency-Key": "k-1"})
    assert again.status_code == 200 and again.json()["turn_id"] == turn_id and again.json()["created"] is False
    assert len(_messages(r, turn_id)) == 1
    other = c.post("/v1/turns", json={**body, "input": "something else"}, headers={"Idempotency-Key": "k-1"})
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key"
    assert len(_messages(r, turn_id)) == 1


def _events(c: httpx.Client, turn_id: str, until: float, stop_at: int = 0) -> list[str]:
    lines: list[str] = []
    with c.stream("GET", f"/v1/turns/{turn_id}/events", timeout=until + 5) as resp:
        assert resp.status_code == 200
        deadline = time.monotonic() + until
        for line in resp.iter_lines():
            lines.append(line)
            if time.monotonic() > deadline or (
                stop_at and len([x for x in lines if x.startswith("data: ")]) >= stop_at
            ):
                break
    return lines


def test_an_event_stored_over_several_lines_still_goes_out_as_one_data_line(api, r):
    agent = _agent()
    c = api.client(api.token([agent]))
    turn_id = c.post("/v1/turns", json={"agent_id": agent, "input": "x"}).json()["turn_id"]
    events_key = AsyncTurnReads.events_key(turn_id)

    def add_later() -> None:  # live: once the stream is followed by the hub
        time.sleep(1.0)
        r.xadd(events_key, {"e": json.dumps({"kind": "model_delta", "delta": "a\nb"}, indent=2)})
        r.xadd(events_key, {"e": orjson.dumps({"kind": "model_delta", "delta": "c"})})

    t = threading.Thread(target=add_later)
    t.start()
    lines = _events(c, turn_id, until=15, stop_at=3)  # turn_queued, then the two deltas
    t.join()
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: ")]
    assert [d["kind"] for d in data] == ["turn_queued", "model_delta", "model_delta"]
    assert data[1]["delta"] == "a\nb" and data[2]["delta"] == "c"
    ids = [x[4:] for x in lines if x.startswith("id: ")]
    assert len(ids) == 3 and len(set(ids)) == 3  # every event keeps its stream id (resume)


def test_an_idle_stream_gets_keep_alives_and_ends_once_its_turn_is_gone(api, r):
    agent = _agent()
    c = api.client(api.token([agent]))
    turn_id = c.post("/v1/turns", json={"agent_id": agent, "input": "x"}).json()["turn_id"]
    lines: list[str] = []
    started = time.monotonic()
    with c.stream("GET", f"/v1/turns/{turn_id}/events", timeout=30) as resp:
        for line in resp.iter_lines():
            lines.append(line)
            if line == ": keep-alive" and lines.count(": keep-alive") == 2:
                for key in r.scan_iter(f"*{turn_id}*"):  # the turn's keys expired
                    r.delete(key)
    # AGENT_API_HEARTBEAT=1: keep-alives within a second of idling, and the end after the next one.
    assert lines.count(": keep-alive") >= 3
    assert time.monotonic() - started < 15


def test_one_hub_serves_a_thousand_streams_each_its_own_event(redis_url):
    async def run() -> None:
        url = _db_url("REDIS_URL")
        writer = redis.asyncio.Redis.from_url(url)
        hub = StreamHub(redis.asyncio.Redis.from_url(url), block_ms=2000)
        hub.start()
        try:
            keys = [f"test:hub:{uuid.uuid4().hex}:events" for _ in range(1000)]
            subs = [hub.subscribe(k, "0-0") for k in keys]
            await asyncio.sleep(0.3)
            async with writer.pipeline(transaction=False) as p:
                for i, k in enumerate(keys):
                    p.xadd(k, {"e": orjson.dumps({"kind": "n", "i": i})})
                await p.execute()
            for i, sub in enumerate(subs):
                key, _eid, ev = await asyncio.wait_for(sub.queue.get(), timeout=10)
                assert (key, ev) == (keys[i], {"kind": "n", "i": i})
            assert all(s.queue.empty() for s in subs)
            for s in subs:
                hub.unsubscribe(s)
            await writer.delete(*keys)
        finally:
            await hub.stop()
            await writer.aclose()

    asyncio.run(run())


def test_no_collection_runs_between_a_round_and_the_clients_it_woke(redis_url):
    import gc

    async def run() -> None:
        url = _db_url("REDIS_URL")
        writer = redis.asyncio.Redis.from_url(url)
        hub = StreamHub(redis.asyncio.Redis.from_url(url), block_ms=2000)
        hub.start()
        seen: list[tuple[bool, bool]] = []

        async def client(sub) -> None:
            await sub.queue.get()
            during = gc.isenabled()  # woken by the round: the collector is still paused
            await asyncio.sleep(0)
            seen.append((during, gc.isenabled()))

        try:
            keys = [f"test:hub:{uuid.uuid4().hex}:events" for _ in range(50)]
            tasks = [asyncio.create_task(client(hub.subscribe(k, "0-0"))) for k in keys]
            await asyncio.sleep(0.3)
            assert gc.isenabled()
            async with writer.pipeline(transaction=False) as p:
                for k in keys:
                    p.xadd(k, {"e": orjson.dumps({"kind": "n"})})
                await p.execute()
            await asyncio.wait_for(asyncio.gather(*tasks), timeout=10)
            assert seen == [(False, True)] * 50
            assert gc.isenabled()  # and on again once they ran
            await writer.delete(*keys)
        finally:
            await hub.stop()
            await writer.aclose()
            gc.enable()

    asyncio.run(run())


def test_the_api_runs_on_uvloop_and_httptools(api):
    maps = open(f"/proc/{api.proc.pid}/maps").read()
    assert "uvloop" in maps and "httptools" in maps


def test_the_server_process_tunes_the_collector_as_a_worker_does():
    # ``python -m control.api`` calls ``tune_process`` before serving (control/api/__main__.py).
    code = (
        "import gc; from tasks.app import GC_THRESHOLDS; from control.api.__main__ import tune_process; "
        "import control.api.app; assert gc.get_threshold() == (700, 10, 10); tune_process(); "
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold(); "
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


# ----- an enqueue with a token seen before: its checks in the turn's creation script -----------


def _scripts_run(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("eval", "evalsha"))


def test_an_enqueue_with_a_token_seen_before_is_one_script_and_refusals_keep_their_order():
    with _own_api(AGENT_APPROVAL_MODE="destructive") as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        clear, tok = srv.tokens.create("fast", [agent], rate=1000, burst=1000)
        c = srv.client(clear)
        body = {"agent_id": agent, "input": "hello"}
        # The first sight checks the token on its own; the second loads the one script.
        assert [c.post("/v1/turns", json=body).status_code for _ in range(2)] == [201, 201]
        before = _scripts_run(r)
        ids = [c.post("/v1/turns", json=body).json()["turn_id"] for _ in range(10)]
        assert _scripts_run(r) - before == 10  # one script per enqueue: the checks and the creation
        assert len(set(ids)) == 10 and all(_messages(r, t) for t in ids)
        stored = ControlPlane(emb.control_url).stored_request(ids[-1])
        assert stored is not None and stored["metadata"]["enqueued_by"] == "token fast"

        # Refusals answer as on the first sight, in the same order, and create nothing.
        count = r.llen("turns")
        err = c.post("/v1/turns", json={"agent_id": "someone-else", "input": "x"})
        assert err.status_code == 403 and "does not cover agent" in err.json()["error"]["message"]
        err = c.post("/v1/turns", json={"agent_id": agent, "input": "x", "approval": {"mode": "declared"}})
        assert err.status_code == 403 and err.json()["error"]["param"] == "approval.mode"
        assert c.post("/v1/turns", json={"agent_id": agent, "input": 3}).status_code == 422
        assert r.llen("turns") == count

        # The record changed in Redis (an operator's edit): the script runs nothing, and the
        # request is checked again against the record as it is now.
        key = token_key(digest(clear))
        r.hset(key, "agents", '["another-agent"]')
        err = c.post("/v1/turns", json=body)
        assert err.status_code == 403 and "does not cover agent" in err.json()["error"]["message"]
        assert r.llen("turns") == count
        r.hset(key, "agents", orjson.dumps([agent]).decode())
        assert c.post("/v1/turns", json=body).status_code == 201

        # Revoked: refused at the next enqueue, also with a body that does not validate.
        assert srv.tokens.revoke(tok.id)
        count = r.llen("turns")
        err = c.post("/v1/turns", json=body)
        assert err.status_code == 401 and err.json()["error"]["type"] == "authentication"
        assert c.post("/v1/turns", json={"agent_id": agent, "input": 3}).status_code == 401
        assert (
            c.post("/v1/turns", content=b"{not json", headers={"content-type": "application/json"}).status_code == 401
        )
        assert r.llen("turns") == count


def test_a_token_seen_before_still_meets_its_rate_and_its_address_throttle():
    with _own_api(AGENT_API_AUTH_FAILURES="3", AGENT_API_AUTH_FAILURE_WINDOW="3") as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        c = srv.client(srv.token([agent], rate=0.5, burst=3))
        body = {"agent_id": agent, "input": "hello"}
        codes = [c.post("/v1/turns", json=body).status_code for _ in range(5)]
        assert codes == [201, 201, 201, 429, 429], codes
        resp = c.post("/v1/turns", json=body)
        assert resp.status_code == 429 and int(resp.headers["Retry-After"]) >= 1
        assert r.llen("turns") == 3

        good = srv.client(srv.token([agent], rate=1000, burst=1000))
        assert good.post("/v1/turns", json=body).status_code == 201  # seen: the next one is one script
        forged = srv.client("atr_00000000_forged")
        assert [forged.post("/v1/turns", json=body).status_code for _ in range(3)] == [401] * 3
        resp = good.post("/v1/turns", json=body)  # the address is throttled, whatever it sends
        assert resp.status_code == 429 and "authentication" in resp.json()["error"]["message"]
        assert r.llen("turns") == 4
        time.sleep(3.2)
        assert good.post("/v1/turns", json=body).status_code == 201


def test_a_changed_record_costs_its_enqueue_one_request_of_the_token_rate():
    """An operator's edit of a token's record (its agents, still covering the agent) between two
    enqueues: the one script checks the token, charges its rate and finds the record changed.
    The request is then checked against the record as it is now, without being charged a second
    time: a token allowed two requests (``burst=2``, no refill to speak of) gets both."""
    with _own_api() as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        clear, _ = srv.tokens.create("edited", [agent], rate=0.001, burst=2)
        c = srv.client(clear)
        body = {"agent_id": agent, "input": "hello"}
        assert c.post("/v1/turns", json=body).status_code == 201  # the first sight: remembered
        r.hset(token_key(digest(clear)), "agents", orjson.dumps([agent, "another-agent"]).decode())
        resp = c.post("/v1/turns", json=body)  # the second of two allowed
        assert resp.status_code == 201, resp.text
        assert r.llen("turns") == 2
        resp = c.post("/v1/turns", json=body)  # the third: over the rate, as on any path
        assert resp.status_code == 429 and "rate limit" in resp.json()["error"]["message"]
        assert r.llen("turns") == 2


# ----- the edge in front of the framework (control.api.edge) ---------------------------------------

FRAMEWORK = {"content-type": "application/json; charset=utf-8"}  # not the edge's case: the route answers


def _answer(resp: httpx.Response, *names: str) -> tuple[int, str, dict[str, str | None]]:
    """Status, body (turn ids and ``names`` masked) and headers of an answer, to compare two."""
    text = resp.text
    for turn_id in set(__import__("re").findall(r"[0-9a-f]{32}", text)):
        text = text.replace(turn_id, "<turn>")
    for i, name in enumerate(names):
        text = text.replace(name, f"<name{i}>")
    heads = {k: resp.headers.get(k) for k in ("content-type", "content-length", "retry-after", "www-authenticate")}
    return resp.status_code, text, heads


def _requests_counted(c: httpx.Client, status: int) -> float:
    text = c.get("/metrics").text
    for line in text.splitlines():
        if line.startswith("agent_api_requests_total{") and 'route="/v1/turns"' in line and 'method="POST"' in line:
            if f'status="{status}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_edge_answers_an_enqueue_as_the_framework_route_does():
    with _own_api(AGENT_APPROVAL_MODE="destructive") as (emb, srv):
        r = redis.Redis.from_url(emb.control_url)
        agent = _agent()
        other = _agent()  # the framework's requests name this agent, the edge's ``agent``
        clear, tok = srv.tokens.create("edge", [agent, other], rate=1000, burst=1000)
        c = srv.client(clear)
        ops = srv.client(srv.token(None))
        body = {"agent_id": agent, "input": "hello"}
        assert c.post("/v1/turns", json=body).status_code == 201  # first sight: the token is known now

        # The same answers both ways: created, repeated, a key reused, refusals of the request.
        cases = [
            ({**body, "idempotency_key": "e-1"}, {}),
            ({**body, "idempotency_key": "e-1"}, {}),  # repeated: 200, the same turn
            ({**body, "input": "other", "idempotency_key": "e-1"}, {}),  # 422
            (body, {"Idempotency-Key": "h-1"}),
            ({**body, "idempotency_key": "b-1"}, {"Idempotency-Key": "h-2"}),  # 400: they differ
            ({"agent_id": "someone-else", "input": "x"}, {}),  # 403
            ({**body, "approval": {"mode": "declared"}}, {}),  # 403 below the floor
            ({**body, "metadata": {"workflow_task_id": "x"}}, {}),  # 400: the runtime's
            ({**body, "input": 3}, {}),  # 422, the body's schema
            ({**body, "toolset": "no-such-toolset"}, {}),
        ]
        statuses = []
        for payload, headers in cases:
            theirs = {**payload, "agent_id": other} if payload["agent_id"] == agent else payload
            edge = c.post(
                "/v1/turns", content=orjson.dumps(payload), headers={"content-type": "application/json", **headers}
            )
            framework = c.post("/v1/turns", content=orjson.dumps(theirs), headers={**FRAMEWORK, **headers})
            assert _answer(edge, agent) == _answer(framework, other), (payload, edge.text, framework.text)
            statuses.append(edge.status_code)
        assert statuses == [201, 200, 422, 201, 400, 403, 403, 400, 422, 400], statuses
        first = c.post("/v1/turns", json={**body, "idempotency_key": "same"})
        again = c.post("/v1/turns", content=orjson.dumps({**body, "idempotency_key": "same"}), headers=FRAMEWORK)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["turn_id"] == again.json()["turn_id"]

        # Counted in the API's metrics like any request.
        created = _requests_counted(ops, 201)
        assert c.post("/v1/turns", json=body).status_code == 201
        assert _requests_counted(ops, 201) == created + 1

        # Refusals of the token itself, after it was seen: over its rate, revoked.
        r.hset(token_key(digest(clear)), mapping={"rate": "0.001", "burst": "1"})
        c.post("/v1/turns", json=body)  # the burst of one, used
        edge, framework = c.post("/v1/turns", json=body), c.post("/v1/turns", json=body, headers=FRAMEWORK)
        assert edge.status_code == framework.status_code == 429
        assert _answer(edge)[1] == _answer(framework)[1]
        assert srv.tokens.revoke(tok.id)
        count = r.llen("turns")
        edge, framework = c.post("/v1/turns", json=body), c.post("/v1/turns", json=body, headers=FRAMEWORK)
        assert edge.status_code == framework.status_code == 401
        assert _answer(edge) == _answer(framework)
        assert r.llen("turns") == count


def test_the_edge_hands_a_chunked_or_oversized_body_to_the_framework():
    with _own_api(AGENT_API_MAX_BODY_BYTES="2048") as (emb, srv):
        agent = _agent()
        c = srv.client(srv.token([agent]))
        body = {"agent_id": agent, "input": "hello"}
        assert c.post("/v1/turns", json=body).status_code == 201

        def chunks():
            yield orjson.dumps(body)

        resp = c.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"})
        assert resp.status_code == 201, resp.text  # no Content-Length: the framework's route
        big = c.post("/v1/turns", json={**body, "input": "x" * 4000})
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
