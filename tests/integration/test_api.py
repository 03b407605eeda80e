"""The HTTP control plane as a real server process on the suite's Redis, with the
suite's real worker running the turns: tokens, scopes (attack tests), limits, errors, enqueue
checks, event streams resumed by ``Last-Event-ID``, approvals, and a real Redis outage.
"""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import orjson
import pytest

from tests.support.api_server import ApiServer, declared_routes
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg, output_texts, wait_for
from worker.turn.store import TurnStore


@pytest.fixture(scope="module")
def api(control):
    import os

    srv = ApiServer(os.environ["CONTROL_REDIS_URL"]).start()
    yield srv
    srv.stop()


def _agent() -> str:
    return f"api-{uuid.uuid4().hex[:8]}"


def _sse(client: httpx.Client, path: str, headers: dict | None = None, timeout: float = 30) -> list[dict]:
    """Read an event stream to its end: ``[{"id", "event", "data"}]``."""
    events, cur = [], {}
    deadline = time.monotonic() + timeout
    with client.stream("GET", path, headers=headers or {}) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            assert time.monotonic() < deadline, "the stream did not end"
            if not line:
                if "event" in cur:
                    events.append(cur)
                cur = {}
            elif line.startswith("id: "):
                cur["id"] = line[4:]
            elif line.startswith("event: "):
                cur["event"] = line[7:]
            elif line.startswith("data: "):
                cur["data"] = orjson.loads(line[6:])
    return events


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param", "code"}, body
    return body["error"]


def _parked(client: httpx.Client, turn_id: str) -> dict:
    def ready():
        data = client.get("/v1/approvals", params={"turn_id": turn_id}).json()["data"]
        return data[0] if data else None

    return wait_for(ready, timeout=30)


# ----- tokens and errors -----------------------------------------------------------


# What answers without a token, and how: the health check (200 or 503, nothing else), the approvals
# page's sign-in form and sign-out, its redirects to the sign-in form, and its static files. Every
# other route the app declares needs a valid token.
OPEN_ROUTES = {
    ("GET", "/healthz"): 200,
    ("GET", "/ui"): 303,
    ("GET", "/ui/login"): 200,
    (
        "POST",
        "/ui/session",
    ): 400,  # the sign-in: the token comes in its body (none here: "a JSON object is required"; forged: 401 below)
    ("POST", "/ui/logout"): 303,
    ("GET", "/ui/approvals"): 303,  # to the sign-in form; the list itself needs the token
    ("GET", "/ui/turns"): 303,  # the turns list and a transcript: to the sign-in form too
    ("GET", "/ui/turns/{turn_id}"): 303,
    ("GET", "/ui/static"): 404,  # a mount: the files it serves (none is named "x")
}


def _concrete(path: str) -> str:
    """A request path for a declared one: each path parameter (``{turn_id}``, ``{p:path}``) is ``x``."""
    import re

    return re.sub(r"\{[^}]+\}", "x", path) + ("/x" if path == "/ui/static" else "")


def test_every_route_the_app_declares_needs_a_valid_token(api):
    routes = [(r.method, r.path) for r in declared_routes()]
    assert ("POST", "/v1/turns") in routes and ("GET", "/openapi.json") in routes  # the list is the app's
    assert set(OPEN_ROUTES) <= set(routes), set(OPEN_ROUTES) - set(routes)  # no stale exception
    anon, forged = api.client(), api.client("atr_00000000_forged")
    for method, path in routes:
        url = _concrete(path)
        if (method, path) in OPEN_ROUTES:
            resp = anon.request(method, url, follow_redirects=False)
            assert resp.status_code == OPEN_ROUTES[(method, path)], (method, path, resp.status_code)
            if resp.status_code == 303:
                assert resp.headers["location"].startswith("/ui"), (method, path)
            continue
        err = _error(anon.request(method, url), 401)
        assert err["type"] == "authentication", (method, path)
        _error(forged.request(method, url), 401)
    signed_in = anon.post("/ui/session", json={"token": "atr_00000000_forged"})
    assert _error(signed_in, 401)["type"] == "authentication" and "set-cookie" not in signed_in.headers


def test_revoked_token_is_refused_at_its_next_request(api):
    clear, tok = api.tokens.create("to-revoke", [_agent()])
    c = api.client(clear)
    assert c.get("/v1/approvals").status_code == 200
    assert api.tokens.revoke(tok.id)
    _error(c.get("/v1/approvals"), 401)
    stored = api.tokens.r.hgetall(f"api:token:{__import__('hashlib').sha256(clear.encode()).hexdigest()}")
    assert stored == {}
    assert all(clear not in str(v) for v in api.tokens.r.hgetall("api:tokens").values())


def test_tokens_are_stored_hashed_only(api):
    clear, tok = api.tokens.create("hashed", None)
    dump = [api.tokens.r.hgetall(k) for k in api.tokens.r.scan_iter("api:token:*")]
    assert clear.encode() not in orjson.dumps([{k.decode(): v.decode() for k, v in d.items()} for d in dump])
    assert tok.agents is None


def test_openapi_document_lists_the_routes_and_the_turn_request_schema(api):
    doc = api.client(api.token(None)).get("/openapi.json").json()
    paths = doc["paths"]
    for p in ["/v1/turns", "/v1/turns/{turn_id}", "/v1/turns/{turn_id}/items", "/v1/turns/{turn_id}/usage"]:
        assert p in paths
    assert "/v1/turns/{turn_id}/events" in paths and "/v1/turns/{turn_id}/cancel" in paths
    assert "/v1/turns/{turn_id}/approvals/{call_id}/approve" in paths and "/v1/approvals" in paths
    assert "TurnRequest" in doc["components"]["schemas"]
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_enqueue_errors_have_one_shape_with_the_path(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": [{"role": "robot", "content": 5}]}), 422)
    assert err["param"] == "input[0].role" and "user" in err["message"]
    err = _error(
        c.post("/v1/turns", json={"agent_id": agent, "input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
        422,
    )
    assert err["param"] == "input[0].content[0].text"
    assert _error(c.post("/v1/turns", json={"agent_id": agent}), 422)["param"] == "input"
    assert _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "nope": 1}), 422)["param"] == "nope"
    _error(c.post("/v1/turns", content=b"{not json", headers={"content-type": "application/json"}), 400)
    err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "toolset": "nope"}), 400)
    assert "unknown toolset" in err["message"]
    err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "toolset": "workflow_task"}), 400)
    assert err["param"] == "toolset"
    assert TurnStore(api.tokens.r).agent_turns(agent) == []  # nothing stored by a refused request


def test_runtime_metadata_cannot_be_forged_through_the_api(api):
    # A background job's outcome is recorded by its turn's end hook: a forged job id would let a
    # token record an outcome on someone else's job.
    agent = _agent()
    c = api.client(api.token([agent]))
    for key in ("background_job_id", "workflow_task_id"):
        err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "metadata": {key: "job-of-b"}}), 400)
        assert err["param"] == f"metadata.{key}"
    assert TurnStore(api.tokens.r).agent_turns(agent) == []


def test_body_over_the_size_limit_is_refused_413(api):
    c = api.client(api.token(None))
    big = b'{"input": "' + b"x" * 2_100_000 + b'"}'
    err = _error(c.post("/v1/turns", content=big, headers={"content-type": "application/json"}), 413)
    assert err["type"] == "request_too_large"

    def chunks():  # no Content-Length: counted while read
        for _ in range(30):
            yield b"x" * 100_000

    _error(c.post("/v1/turns", content=chunks(), headers={"content-type": "application/json"}), 413)


def test_rate_limit_per_token_answers_429_with_retry_after(api):
    slow = api.client(api.token(None, rate=0.5, burst=3))
    other = api.client(api.token(None, rate=0.5, burst=3))
    codes = [slow.get("/v1/approvals").status_code for _ in range(5)]
    assert codes[:3] == [200, 200, 200] and codes[3:] == [429, 429], codes
    resp = slow.get("/v1/approvals")
    err = _error(resp, 429)
    assert err["type"] == "rate_limited" and int(resp.headers["Retry-After"]) >= 1
    assert other.get("/v1/approvals").status_code == 200  # each token has its own budget
    time.sleep(2.1)
    assert slow.get("/v1/approvals").status_code == 200


# ----- scopes (attack tests) -----------------------------------------------------


def test_a_token_for_agent_a_never_reads_or_decides_for_agent_b(api, gateway, script_name):
    a, b = _agent(), _agent()
    ca, cb = api.client(api.token([a])), api.client(api.token([b]))
    gateway.add_script(script_name, [{"output": [fc("guarded_write", {"label": "b-secret"})]}, {"output": [msg("ok")]}])
    created = cb.post(
        "/v1/turns",
        json={
            "agent_id": b,
            "input": "b's secret",
            "model": script_name,
            "toolset": "testing",
            "approval": {"mode": "declared"},
        },
    )
    assert created.status_code == 201, created.text
    tid = created.json()["turn_id"]
    pending = _parked(cb, tid)
    # every read of B's turn by A's token: 404 exactly like a turn that does not exist
    for path in ["", "/items", "/usage", "/events"]:
        err = _error(ca.get(f"/v1/turns/{tid}{path}"), 404)
        assert err["message"] == f"unknown turn {tid}" and "secret" not in str(err)
    assert _error(ca.get("/v1/turns/does-not-exist"), 404)["message"] == "unknown turn does-not-exist"
    assert ca.get("/v1/approvals").json()["data"] == []
    assert ca.get("/v1/approvals", params={"agent_id": b}).json()["data"] == []
    assert ca.get("/v1/approvals", params={"turn_id": tid}).json()["data"] == []
    # decisions and cancel refused, nothing changed
    _error(ca.post(f"/v1/turns/{tid}/approvals/{pending['call_id']}/approve", json={}), 404)
    _error(ca.post(f"/v1/turns/{tid}/approvals/{pending['call_id']}/reject", json={"reason": "x"}), 404)
    _error(ca.post(f"/v1/turns/{tid}/cancel"), 404)
    _error(ca.post("/v1/turns", json={"agent_id": b, "input": "as b"}), 403)
    # the same idempotency key for A makes A's own turn, never returns B's
    key = f"k-{uuid.uuid4().hex[:6]}"
    tb = cb.post(
        "/v1/turns", json={"agent_id": b, "input": "x", "model": script_name}, headers={"Idempotency-Key": key}
    )
    ta = ca.post(
        "/v1/turns", json={"agent_id": a, "input": "x", "model": script_name}, headers={"Idempotency-Key": key}
    )
    assert ta.json()["turn_id"] != tb.json()["turn_id"]
    [still] = cb.get("/v1/approvals", params={"turn_id": tid}).json()["data"]
    assert still["status"] == "pending"
    # B's own token decides; an all-agents token sees B's turn too
    assert api.client(api.token(None)).get(f"/v1/turns/{tid}").json()["agent_id"] == b
    done = cb.post(f"/v1/turns/{tid}/approvals/{pending['call_id']}/approve", json={"by": "bea"})
    assert done.status_code == 200 and done.json()["by"].startswith("bea (token ")


# ----- turns, events, approvals end to end --------------------------------------------


def test_enqueue_is_idempotent_and_the_turn_completes(api, gateway, script_name):
    agent = _agent()
    c = api.client(api.token([agent]))
    gateway.add_script(script_name, [{"output": [msg("hello over http")]}])
    body = {"agent_id": agent, "input": [{"role": "user", "content": "hi"}], "model": script_name}
    first = c.post("/v1/turns", json=body, headers={"Idempotency-Key": "same"})
    again = c.post("/v1/turns", json=body, headers={"Idempotency-Key": "same"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["turn_id"] == again.json()["turn_id"] and again.json()["created"] is False
    tid = first.json()["turn_id"]
    events = _sse(c, f"/v1/turns/{tid}/events")
    assert events[-1]["event"] == "turn_finished" and events[-1]["data"]["status"] == "completed"
    view = c.get(f"/v1/turns/{tid}").json()
    assert view["status"] == "completed" and view["final_output"] == "hello over http" and view["done"]
    items = c.get(f"/v1/turns/{tid}/items").json()["data"]
    assert items[0] == {"role": "user", "content": "hi"} and items[-1]["type"] == "message"
    assert c.get(f"/v1/turns/{tid}/usage").json()["total"]["model_calls"] == 1
    assert c.post(f"/v1/turns/{tid}/cancel").json() == {"turn_id": tid, "cancelling": False}


def test_event_stream_resumes_after_last_event_id(api, gateway, script_name):
    agent = _agent()
    c = api.client(api.token([agent]))
    gateway.add_script(script_name, [{"output": [fc("append_marker", {"label": "one"})]}, {"output": [msg("done")]}])
    tid = c.post(
        "/v1/turns", json={"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"}
    ).json()["turn_id"]
    whole = _sse(c, f"/v1/turns/{tid}/events")
    kinds = [e["event"] for e in whole]
    assert kinds[0] == "turn_queued" and kinds[-1] == "turn_finished"
    assert "call_completed" in kinds and "call_planned" in kinds
    ids = [e["id"] for e in whole]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    cut = len(whole) // 2
    resumed = _sse(c, f"/v1/turns/{tid}/events", headers={"Last-Event-ID": whole[cut - 1]["id"]})
    assert [e["id"] for e in resumed] == ids[cut:]
    assert [e["id"] for e in _sse(c, f"/v1/turns/{tid}/events?after={ids[-2]}")] == ids[-1:]
    only = _sse(c, f"/v1/turns/{tid}/events?kinds=call_completed,turn_finished")
    assert [e["event"] for e in only] == ["call_completed", "turn_finished"]
    _error(c.get(f"/v1/turns/{tid}/events", headers={"Last-Event-ID": "not-an-id"}), 400)


def test_live_stream_carries_approvals_and_decisions_and_rejection_reaches_the_model(
    api, control, gateway, script_name
):
    agent = _agent()
    c = api.client(api.token([agent]))
    gateway.add_script(
        script_name, [{"output": [fc("guarded_write", {"label": "prod"})]}, {"output": [msg("understood")]}]
    )
    tid = c.post(
        "/v1/turns",
        json={
            "agent_id": agent,
            "input": "go",
            "model": script_name,
            "toolset": "testing",
            "approval": {"mode": "declared"},
        },
    ).json()["turn_id"]
    got: list[dict] = []
    reader = threading.Thread(
        target=lambda: got.extend(_sse(api.client(c.headers["Authorization"][7:]), f"/v1/turns/{tid}/events"))
    )
    reader.start()
    pending = _parked(c, tid)
    _error(c.post(f"/v1/turns/{tid}/approvals/{pending['call_id']}/reject", json={"reason": ""}), 422)
    rec = c.post(
        f"/v1/turns/{tid}/approvals/{pending['call_id']}/reject", json={"reason": "prod is frozen", "by": "rita"}
    )
    assert rec.status_code == 200 and rec.json()["status"] == "rejected"
    conflict = c.post(f"/v1/turns/{tid}/approvals/{pending['call_id']}/approve", json={})
    assert _error(conflict, 409)["type"] == "conflict"
    reader.join(30)
    kinds = [e["event"] for e in got]
    assert kinds.index("approval_requested") < kinds.index("approval_decided") < kinds.index("turn_finished")
    decided = next(e["data"] for e in got if e["event"] == "approval_decided")
    assert decided["decision"] == "rejected" and decided["reason"] == "prod is frozen"
    [out] = output_texts(control, tid)
    assert out.startswith("Rejected by rita (token ") and "prod is frozen" in out
    last = [b for b in gateway.requests if b["model"] == script_name][-1]
    assert [i["output"] for i in last["input"] if i.get("type") == "function_call_output"] == [out]


def test_approve_with_edits_through_the_api(api, gateway, script_name):
    agent = _agent()
    c = api.client(api.token([agent]))
    gateway.add_script(script_name, [{"output": [fc("guarded_write", {"label": "orig"})]}, {"output": [msg("ok")]}])
    tid = c.post(
        "/v1/turns",
        json={
            "agent_id": agent,
            "input": "go",
            "model": script_name,
            "toolset": "testing",
            "approval": {"mode": "declared"},
        },
    ).json()["turn_id"]
    pending = _parked(c, tid)
    bad = c.post(
        f"/v1/turns/{tid}/approvals/{pending['call_id']}/approve", json={"params": {"label": "x", "ms": 99999}}
    )
    assert "ms" in _error(bad, 400)["message"]
    ok = c.post(
        f"/v1/turns/{tid}/approvals/{pending['call_id']}/approve", json={"params": {"label": "edited", "ms": 1}}
    )
    assert ok.json()["params"] == {"label": "edited", "ms": 1}
    assert _sse(c, f"/v1/turns/{tid}/events")[-1]["data"]["status"] == "completed"


# ----- Redis outage ---------------------------------------------------------------------


def test_redis_outage_answers_503_with_retry_after_and_loses_nothing(gateway, script_name):
    stack = PrivateStack()
    srv = ApiServer(stack.redis.control_url)
    try:
        srv.start()
        agent = _agent()
        c = srv.client(srv.token([agent]))
        gateway.add_script(script_name, [{"output": [msg("after the outage")]}])
        stack.redis.halt(kill=True)
        body = {"agent_id": agent, "input": "hi", "model": script_name}
        for resp in (
            c.post("/v1/turns", json=body, headers={"Idempotency-Key": "outage"}),
            c.get("/v1/approvals"),
            c.get("/v1/turns/whatever"),
        ):
            err = _error(resp, 503)
            assert err["type"] == "unavailable" and int(resp.headers["Retry-After"]) >= 1
        assert c.get("/healthz").status_code == 503
        stack.redis.restart()
        stack.start_worker()
        first = wait_for(
            lambda: (
                (r := c.post("/v1/turns", json=body, headers={"Idempotency-Key": "outage"})).status_code != 503 and r
            ),
            timeout=30,
        )
        assert first.status_code == 201, first.text
        tid = first.json()["turn_id"]
        got: list[dict] = []
        reader = threading.Thread(
            target=lambda: got.extend(
                _sse(srv.client(c.headers["Authorization"][7:]), f"/v1/turns/{tid}/events", timeout=90)
            )
        )
        reader.start()
        reader.join(60)
        assert got and got[-1]["event"] == "turn_finished" and got[-1]["data"]["status"] == "completed"
        assert c.get(f"/v1/turns/{tid}").json()["final_output"] == "after the outage"
        assert stack.control.store.agent_turns(agent) == [tid]  # one turn: the refused request stored nothing
    finally:
        srv.stop()
        stack.close()
