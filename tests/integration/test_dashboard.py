"""The dashboard and the metrics behind it, checked for real.

A real stack (its own Redis, a worker serving ``/metrics``, beat, the API
process serving its own ``/metrics``) plays a mixed run: turns completed, failed, cancelled while
parked (through the API), rejected (through the API), expired (beat's sweep), approved; a real
Prometheus (Debian's ``prometheus`` binary, ``make promtool``) scrapes the worker and the API.
Every turn of the run is counted once in ``agent_turns_ended_total`` (by status, and in all),
and every query of every dashboard panel returns data (``devtools/dashboard.py``; the committed
JSON is checked in ``tests/unit/devtools/test_dashboard.py``).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from devtools import dashboard
from devtools.ports import free_port
from tests.support.api_server import ApiServer
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg, wait_for
from worker.turn.request import TurnStatus

PROMETHEUS = os.environ.get("AGENT_TEST_PROMETHEUS", "/usr/bin/prometheus")


class Prometheus:
    """``/usr/bin/prometheus`` scraping ``targets`` every second (``[(job, host:port, token_file)]``)."""

    def __init__(self, targets: list[tuple[str, str, str | None]]):
        assert Path(PROMETHEUS).exists(), f"{PROMETHEUS} is missing: run `make promtool` (apt-get install prometheus)"
        self.dir = Path(tempfile.mkdtemp(prefix="prometheus-"))
        self.port = free_port()
        jobs = []
        for job, target, token_file in targets:
            entry: dict = {"job_name": job, "static_configs": [{"targets": [target]}]}
            if token_file:
                entry["authorization"] = {"type": "Bearer", "credentials_file": token_file}
            jobs.append(entry)
        config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": jobs}
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = self.dir / "prometheus.log"
        self.proc = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={self.dir / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(self._ready, timeout=60, poll=0.3)

    def _ready(self) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-2000:]
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def query(self, expr: str) -> list[dict]:
        resp = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        assert resp.status_code == 200, (expr, resp.text)
        return resp.json()["data"]["result"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else float("nan")

    def targets_up(self) -> bool:
        return [float(r["value"][1]) for r in self.query("up")] == [1.0] * len(self.query("up"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def monitored(gateway, tmp_path_factory):
    """The stack, its API and a Prometheus scraping both."""
    port = free_port()
    stack = PrivateStack(AGENT_APPROVAL_MODE="declared")
    api = None
    prom = None
    try:
        stack.start_worker(pool="threads", concurrency=4, env={"AGENT_METRICS_PORT": str(port)})
        stack.start_beat()
        api = ApiServer(stack.control_url, endpoint=stack.endpoint).start()
        operator = api.token(None)
        token_file = tmp_path_factory.mktemp("prom") / "token"
        token_file.write_text(operator)
        prom = Prometheus([("worker", f"127.0.0.1:{port}", None), ("api", f"127.0.0.1:{api.port}", str(token_file))])
        wait_for(lambda: len(prom.query("up")) == 2 and prom.targets_up(), timeout=60, poll=0.5)
        yield {"stack": stack, "api": api, "prom": prom, "operator": operator}
    finally:
        if prom is not None:
            prom.stop()
        if api is not None:
            api.stop()
        stack.close()


def _park(http, gateway, agent: str, timeout: float | None = None) -> str:
    name = f"dash-{uuid.uuid4().hex[:8]}"
    gateway.add_script(
        name, [{"output": [msg("I will write it."), fc("guarded_write", {"label": "x"})]}, {"output": [msg("ok")]}]
    )
    approval: dict = {"mode": "declared", **({"timeout": timeout} if timeout else {})}
    body = {"agent_id": agent, "input": "write x", "model": name, "toolset": "testing", "approval": approval}
    resp = http.post("/v1/turns", json=body)
    assert resp.status_code == 201, resp.text
    tid = resp.json()["turn_id"]
    wait_for(lambda: http.get(f"/v1/turns/{tid}").json()["status"] == "awaiting_approval", timeout=30)
    return tid


def _pending_call(http, tid: str) -> str:
    [pending] = http.get("/v1/approvals", params={"turn_id": tid}).json()["data"]
    return pending["call_id"]


def _mixed_run(monitored, gateway) -> dict[str, str]:
    """Turns that end every way, through the API; returns ``{turn_id: expected status}``."""
    api, agent = monitored["api"], f"dash-{uuid.uuid4().hex[:6]}"
    http = api.client(api.token([agent]))
    expected: dict[str, str] = {}
    done = f"dash-{uuid.uuid4().hex[:8]}"  # a repaired call and a computer tool's own error, then an answer
    gateway.add_script(
        done,
        [
            {"output": [msg("Reading."), fc("read_file", '```json\n{"path": "missing.txt"}\n```')]},
            {"output": [msg("It is not there.")]},
        ],
    )
    resp = http.post("/v1/turns", json={"agent_id": agent, "input": "read missing.txt", "model": done})
    expected[resp.json()["turn_id"]] = "completed"
    resp = http.post("/v1/turns", json={"agent_id": agent, "input": "fail", "model": "dash-no-such-script"})
    expected[resp.json()["turn_id"]] = "failed"  # the gateway answers 404: a request it refuses
    parked = _park(http, gateway, agent)
    with http.stream("GET", f"/v1/turns/{parked}/events") as events:  # an open stream while it is parked
        next(events.iter_lines())
        assert http.post(f"/v1/turns/{parked}/cancel").json()["cancelling"] is True
    expected[parked] = "cancelled"
    rejected = _park(http, gateway, agent)
    call = _pending_call(http, rejected)
    resp = http.post(f"/v1/turns/{rejected}/approvals/{call}/reject", json={"reason": "no", "by": "ops"})
    assert resp.status_code == 200, resp.text
    expected[rejected] = "completed"
    approved = _park(http, gateway, agent)
    resp = http.post(f"/v1/turns/{approved}/approvals/{_pending_call(http, approved)}/approve", json={"by": "ops"})
    assert resp.status_code == 200, resp.text
    expected[approved] = "completed"
    expired = _park(http, gateway, agent, timeout=1)
    expected[expired] = "completed"  # beat's sweep rejects it at the deadline; the model goes on
    limited = api.client(api.token([agent], rate=0.01, burst=1))
    assert [limited.get("/v1/approvals").status_code for _ in range(2)] == [200, 429]
    control = monitored["stack"].control
    for tid, status in expected.items():
        assert control.wait(tid, timeout=60).status == TurnStatus(status), tid
    return expected


def test_every_turn_is_counted_once_and_every_panel_has_data(monitored, gateway):
    prom = monitored["prom"]
    expected = _mixed_run(monitored, gateway)
    by_status: dict[str, int] = {}
    for status in expected.values():
        by_status[status] = by_status.get(status, 0) + 1

    def counted() -> dict[str, float]:
        return {
            r["metric"]["status"]: float(r["value"][1]) for r in prom.query("sum by (status) (agent_turns_ended_total)")
        }

    wait_for(lambda: counted() == by_status, timeout=30, poll=0.5)
    time.sleep(2.5)  # later scrapes: still exactly once (nothing counted twice later)
    assert counted() == by_status
    assert prom.value("sum(agent_turns_ended_total)") == len(expected)
    assert prom.value("sum(agent_turns_started_total)") == len(expected)  # every turn ran a model step
    reasons = {(r["metric"]["status"], r["metric"]["reason"]) for r in prom.query("agent_turns_ended_total")}
    assert ("cancelled", "cancelled") in reasons and ("failed", "model_rejected") in reasons
    errors = {r["metric"]["error_class"] for r in prom.query('agent_tool_calls_total{outcome="error"}')}
    assert {"rejected", "expired", "tool_error"} <= errors
    decisions = {r["metric"]["decision"] for r in prom.query("agent_approval_decision_seconds_count")}
    assert decisions == {"approved", "rejected", "expired"}
    empty = [(title, expr) for title, expr in dashboard.queries("2m") if not prom.query(expr)]
    assert not empty, f"panels without data: {empty}"
