"""What the HTTP API refuses in what it is sent, on a real API server (its own Redis database, no
worker: turns stay ``queued``), with the server's ``AGENT_APPROVAL_MODE`` at ``destructive``: an
empty message, an idempotency key reused for another body, unknown event kinds, egress hosts
without egress, a body that is not a JSON object, an empty ``by``, and less approval than the
server's floor unless the token was granted it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest

from control.client import ControlPlane, Refused
from tests.support.api_server import ROOT, ApiServer
from worker.turn.store import TurnStore

DB = 14  # a database of its own: no worker takes these turns


def _db_url(name: str) -> str:
    return os.environ[name].rsplit("/", 1)[0] + f"/{DB}"


@pytest.fixture(scope="module")
def api(redis_url):
    srv = ApiServer(_db_url("CONTROL_REDIS_URL"), AGENT_APPROVAL_MODE="destructive").start()
    yield srv
    srv.stop()


def _agent() -> str:
    return f"in-{uuid.uuid4().hex[:8]}"


def _error(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param", "code"}, body
    return body["error"]


def _nothing_stored(api: ApiServer, agent: str) -> bool:
    return TurnStore(api.tokens.r).agent_turns(agent) == []


def test_an_empty_message_is_refused_as_the_cli_refuses_it(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    for text in ("", "   \n\t"):
        err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": text}), 400)
        assert err["param"] == "input" and err["message"] == "the message is empty"
    assert _nothing_stored(api, agent)
    with pytest.raises(Refused, match="the message is empty"):
        ControlPlane(_db_url("CONTROL_REDIS_URL")).create({"agent_id": agent, "input": " "})
    cli = subprocess.run(
        [sys.executable, "-m", "control.cli", "enqueue", " ", "--agent", agent],
        cwd=ROOT,
        env={**os.environ, "CONTROL_REDIS_URL": _db_url("CONTROL_REDIS_URL")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 2 and "the message is empty" in cli.stderr


def test_an_idempotency_key_reused_for_another_body_is_422_naming_the_key(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    key = f"report-{uuid.uuid4().hex[:6]}"
    first = c.post("/v1/turns", json={"agent_id": agent, "input": "list my files"}, headers={"Idempotency-Key": key})
    assert first.status_code == 201
    again = c.post("/v1/turns", json={"agent_id": agent, "input": "list my files"}, headers={"Idempotency-Key": key})
    assert again.status_code == 200 and again.json()["turn_id"] == first.json()["turn_id"]
    assert again.json()["created"] is False
    other = c.post("/v1/turns", json={"agent_id": agent, "input": "delete my files"}, headers={"Idempotency-Key": key})
    err = _error(other, 422)
    assert err["param"] == "Idempotency-Key" and key in err["message"] and first.json()["turn_id"] in err["message"]
    in_body = {"agent_id": agent, "input": "delete my files", "idempotency_key": key}
    assert _error(c.post("/v1/turns", json=in_body), 422)["param"] == "idempotency_key"
    assert TurnStore(api.tokens.r).agent_turns(agent) == [first.json()["turn_id"]]  # the others enqueued nothing


def test_unknown_event_kinds_are_refused(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    turn_id = c.post("/v1/turns", json={"agent_id": agent, "input": "x"}).json()["turn_id"]
    err = _error(c.get(f"/v1/turns/{turn_id}/events", params={"kinds": "turn_finished,bogus"}), 400)
    assert err["param"] == "kinds" and "'bogus'" in err["message"] and "approval_requested" in err["message"]
    with c.stream("GET", f"/v1/turns/{turn_id}/events", params={"kinds": "turn_queued,turn_finished"}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("event: "):
                assert line == "event: turn_queued"
                break


def test_egress_hosts_without_egress_are_refused_as_contradictory(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    hosts = ["example.com"]
    err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "egress_allow_hosts": hosts}), 400)
    assert err["param"] == "egress_allow_hosts" and "network 'none'" in err["message"]
    body = {"agent_id": agent, "input": "x", "egress_allow_hosts": hosts, "network": "none"}
    _error(c.post("/v1/turns", json=body), 400)
    assert c.post("/v1/turns", json={**body, "network": "egress"}).status_code == 201


def test_a_body_that_is_not_a_json_object_says_one_is_required(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    turn_id = c.post("/v1/turns", json={"agent_id": agent, "input": "x"}).json()["turn_id"]
    for path in (
        "/v1/turns",
        f"/v1/turns/{turn_id}/approvals/call_1/approve",
        f"/v1/turns/{turn_id}/approvals/c/reject",
    ):
        for raw, got in ((b"[1, 2]", "an array"), (b'"text"', "a string"), (b"7", "a number")):
            err = _error(c.post(path, content=raw, headers={"content-type": "application/json"}), 400)
            assert "a JSON object is required" in err["message"] and got in err["message"], (path, err)
    assert "a JSON object is required" in _error(c.post("/v1/turns"), 400)["message"]


def test_by_must_say_who_when_given(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    turn_id = c.post("/v1/turns", json={"agent_id": agent, "input": "x"}).json()["turn_id"]
    for by in ("", "   "):
        err = _error(c.post(f"/v1/turns/{turn_id}/approvals/call_1/approve", json={"by": by}), 422)
        assert err["param"] == "by"
        body = {"reason": "no", "by": by}
        assert _error(c.post(f"/v1/turns/{turn_id}/approvals/call_1/reject", json=body), 422)["param"] == "by"
    # Omitted, the token's name alone is recorded: the call here waits for nothing, so 404.
    assert c.post(f"/v1/turns/{turn_id}/approvals/call_1/approve", json={}).status_code == 404


def test_a_request_may_raise_the_approval_floor_never_lower_it(api):
    agent = _agent()
    c = api.client(api.token([agent]))
    for mode in ("off", "declared"):
        err = _error(c.post("/v1/turns", json={"agent_id": agent, "input": "x", "approval": {"mode": mode}}), 403)
        assert err["param"] == "approval.mode" and "'destructive'" in err["message"] and f"'{mode}'" in err["message"]
    assert _nothing_stored(api, agent)
    for approval in ({"mode": "destructive", "timeout": 60}, {"timeout": 60}, {}):
        resp = c.post("/v1/turns", json={"agent_id": agent, "input": "x", "approval": approval})
        assert resp.status_code == 201, resp.text
    granted = api.client(api.tokens.create("ops", [agent], lower_approval=True)[0])
    assert (
        granted.post("/v1/turns", json={"agent_id": agent, "input": "x", "approval": {"mode": "off"}}).status_code
        == 201
    )


def test_token_cli_grants_lowering_approvals_explicitly(api):
    env = {**os.environ, "CONTROL_REDIS_URL": _db_url("CONTROL_REDIS_URL")}
    cli = [sys.executable, "-m", "control.cli", "token"]
    made = subprocess.run(
        [*cli, "create", "ops-cli", "--agent", "alice", "--may-lower-approval"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0 and "may lower approvals" in made.stderr, made.stderr
    plain = subprocess.run(
        [*cli, "create", "plain-cli", "--agent", "alice"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    listed = subprocess.run([*cli, "list"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    rows = {r["name"]: r for r in map(json.loads, listed.stdout.splitlines())}
    assert rows["ops-cli"]["lower_approval"] is True and rows["plain-cli"]["lower_approval"] is False
    c = api.client(made.stdout.strip())
    assert c.post("/v1/turns", json={"agent_id": "alice", "input": "x", "approval": {"mode": "off"}}).status_code == 201
    c = api.client(plain.stdout.strip())
    _error(c.post("/v1/turns", json={"agent_id": "alice", "input": "x", "approval": {"mode": "off"}}), 403)


def test_a_fault_of_the_api_itself_is_a_500_in_the_error_shape(redis_url):
    import uvicorn

    from control.api.app import create_app
    from devtools.ports import free_port

    wrapped = create_app(url=_db_url("CONTROL_REDIS_URL"))
    app = wrapped.app  # the FastAPI app inside the body-size limit

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("internal detail that must not leak")

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(wrapped, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        err = _error(httpx.get(f"http://127.0.0.1:{port}/boom", timeout=10), 500)
        assert err["type"] == "server_error" and "internal detail" not in err["message"]
    finally:
        server.should_exit = True
        thread.join(15)
