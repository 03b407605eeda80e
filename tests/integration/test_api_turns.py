"""Finding turns again: ``GET /v1/turns`` on a real API server, and ``agent-runtime turns list``,
over the store's index of turns (``worker.turn.listing``).

The server runs on a Redis database no worker consumes (``DB``), so every turn stays ``queued``
unless a test cancels it: statuses are exactly what each test made them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from control.client import ControlPlane
from tests.support.api_server import ROOT, ApiServer

DB = 11  # a database of its own: no worker takes these turns, no other test lists them


def _db_url(name: str) -> str:
    return os.environ[name].rsplit("/", 1)[0] + f"/{DB}"


@pytest.fixture(scope="module")
def api(redis_url):
    srv = ApiServer(_db_url("CONTROL_REDIS_URL")).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def cp(redis_url) -> ControlPlane:
    return ControlPlane(_db_url("CONTROL_REDIS_URL"))


def _agent() -> str:
    return f"ls-{uuid.uuid4().hex[:8]}"


def _error(resp, status: int) -> dict:
    assert resp.status_code == status, (resp.status_code, resp.text)
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"type", "message", "param", "code"}, body
    return body["error"]


@pytest.fixture(scope="module")
def fleet(api):
    """Agent ``a`` with five turns (two cancelled), agent ``b`` with two: ids newest first."""
    a, b = _agent(), _agent()
    admin = api.client(api.token(None))
    made: dict[str, list[str]] = {a: [], b: []}
    for agent, n in ((a, 5), (b, 2)):
        for i in range(n):
            resp = admin.post("/v1/turns", json={"agent_id": agent, "input": f"  task {i}\n of {agent}  "})
            assert resp.status_code == 201, resp.text
            made[agent].insert(0, resp.json()["turn_id"])
    for turn_id in made[a][1:3]:
        assert admin.post(f"/v1/turns/{turn_id}/cancel").json()["cancelling"]
    return a, b, made


def _all_pages(client, **params) -> tuple[list[dict], int]:
    out, pages, cursor = [], 0, None
    while True:
        body = client.get("/v1/turns", params={**params, **({"cursor": cursor} if cursor else {})}).json()
        out += body["data"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return out, pages


def test_a_token_lists_its_agents_turns_newest_first_with_titles(api, fleet):
    a, b, made = fleet
    resp = api.client(api.token([a])).get("/v1/turns")
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["object"] == "list" and body["next_cursor"] is None
    assert [t["turn_id"] for t in body["data"]] == made[a]
    first = body["data"][-1]
    assert first["title"] == f"task 0 of {a}" and first["agent_id"] == a and first["status"] == "queued"
    assert set(first) >= {"done", "step", "model_calls", "final_output", "error", "created_at", "updated_at"}
    created = [t["created_at"] for t in body["data"]]
    assert created == sorted(created, reverse=True)


def test_pages_follow_the_cursor_to_the_end(api, fleet):
    a, _b, made = fleet
    c = api.client(api.token([a]))
    turns, pages = _all_pages(c, limit=2)
    assert [t["turn_id"] for t in turns] == made[a] and pages == 3
    # A turn enqueued meanwhile appears at the top, never inside a page already cut.
    page1 = c.get("/v1/turns", params={"limit": 2}).json()
    assert c.post("/v1/turns", json={"agent_id": a, "input": "late"}).status_code == 201
    page2 = c.get("/v1/turns", params={"limit": 2, "cursor": page1["next_cursor"]}).json()
    assert [t["turn_id"] for t in page1["data"] + page2["data"]] == made[a][:4]


def test_filters_by_status_agent_and_creation_time(api, fleet):
    a, b, made = fleet
    admin = api.client(api.token(None))
    cancelled = admin.get("/v1/turns", params={"agent_id": a, "status": "cancelled"}).json()["data"]
    assert [t["turn_id"] for t in cancelled] == made[a][1:3] and all(t["done"] for t in cancelled)
    both = admin.get("/v1/turns", params=[("agent_id", a), ("status", "cancelled"), ("status", "queued")]).json()
    assert {t["turn_id"] for t in both["data"]} >= set(made[a])
    assert len(admin.get("/v1/turns", params={"agent_id": a, "status": "queued,cancelled"}).json()["data"]) >= 5
    assert admin.get("/v1/turns", params={"agent_id": a, "status": "completed"}).json()["data"] == []
    mine = [t["turn_id"] for t in admin.get("/v1/turns", params={"agent_id": b}).json()["data"]]
    assert mine == made[b]
    listed = {t["turn_id"]: t for t in admin.get("/v1/turns", params={"agent_id": a}).json()["data"]}
    middle = listed[made[a][2]]["created_at"]
    newer = admin.get("/v1/turns", params={"agent_id": a, "created_after": middle}).json()["data"]
    older = admin.get("/v1/turns", params={"agent_id": a, "created_before": middle}).json()["data"]
    assert made[a][2] not in {t["turn_id"] for t in newer + older}  # both bounds exclusive
    assert [t["turn_id"] for t in older] == made[a][3:]
    assert set(made[a][:2]) <= {t["turn_id"] for t in newer}
    # A token for every agent, without an agent filter: both agents' turns, newest first.
    since = min(listed[t]["created_at"] for t in made[a]) - 0.001
    every = [t["turn_id"] for t in _all_pages(admin, created_after=since, limit=3)[0]]
    assert set(made[a] + made[b]) <= set(every)
    assert every.index(made[b][0]) < every.index(made[b][1]) and every.index(made[a][0]) < every.index(made[a][4])


def test_a_token_never_lists_another_agents_turns(api, fleet):
    a, b, made = fleet
    only_a = api.client(api.token([a]))
    assert only_a.get("/v1/turns", params={"agent_id": b}).json() == {"object": "list", "data": [], "next_cursor": None}
    seen = {t["agent_id"] for t in _all_pages(only_a, limit=1)[0]}
    assert seen == {a}
    two = api.client(api.token([a, b]))
    assert {t["agent_id"] for t in _all_pages(two, limit=4)[0]} == {a, b}


def test_bad_filters_answer_400_in_the_error_shape(api, fleet):
    c = api.client(api.token(None))
    err = _error(c.get("/v1/turns", params={"status": "bogus"}), 400)
    assert err["param"] == "status" and "bogus" in err["message"] and "awaiting_approval" in err["message"]
    assert _error(c.get("/v1/turns", params={"cursor": "not-a-cursor"}), 400)["param"] == "cursor"
    assert _error(c.get("/v1/turns", params={"agent_id": "a:b"}), 400)["param"] == "agent_id"
    assert _error(c.get("/v1/turns", params={"limit": 0}), 422)["param"] == "limit"
    assert _error(c.get("/v1/turns", params={"limit": 201}), 422)["param"] == "limit"
    assert _error(c.get("/v1/turns", params={"created_after": "soon"}), 422)["param"] == "created_after"
    assert _error(c.get("/v1/turns", params={"created_after": "nan"}), 400)["param"] == "created_after"
    assert _error(api.client().get("/v1/turns"), 401)["type"] == "authentication"


def test_an_expired_turn_leaves_the_index(api, cp, fleet):
    agent = _agent()
    c = api.client(api.token([agent]))
    ids = [c.post("/v1/turns", json={"agent_id": agent, "input": f"t{i}"}).json()["turn_id"] for i in range(3)]
    r = cp.redis
    # An agent's index expires after its newest turn; the index of every turn is pruned by the
    # watchdog's sweep instead (no expiry: it never goes quiet while turns are made).
    assert 0 < r.ttl(f"turns:index:{agent}") <= 14 * 24 * 3600 and r.ttl("turns:index") == -1
    r.delete(f"turn:{{{ids[1]}}}")  # what expiry does to a turn's hash
    assert [t["turn_id"] for t in c.get("/v1/turns").json()["data"]] == [ids[2], ids[0]]
    assert r.zscore(f"turns:index:{agent}", ids[1]) is None and r.zscore(f"turns:index:{agent}", ids[0])


def test_cli_turns_list_has_the_same_filters(api, fleet):
    a, _b, made = fleet
    env = {**os.environ, "CONTROL_REDIS_URL": _db_url("CONTROL_REDIS_URL")}
    cli = [sys.executable, "-m", "control.cli", "turns", "list"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*cli, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)

    done = run("--agent", a, "--status", "cancelled", "--json")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["turn_id"] for r in rows] == made[a][1:3] and {r["status"] for r in rows} == {"cancelled"}
    page = run("--agent", a, "--limit", "2")
    assert page.returncode == 0 and len(page.stdout.splitlines()) == 2 and made[a][0] in page.stdout
    cursor = page.stderr.split("--cursor", 1)[1].split()[0]
    rest = run("--agent", a, "--limit", "2", "--cursor", cursor)
    assert rest.returncode == 0 and made[a][0] not in rest.stdout and len(rest.stdout.splitlines()) == 2
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 3600))
    assert run("--agent", a, "--since", since).stdout == ""
    bad = run("--status", "bogus")
    assert bad.returncode == 2 and "unknown status 'bogus'" in bad.stderr
    assert run("--since", "yesterday").returncode == 2
