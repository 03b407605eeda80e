"""Operating it, through a real prefork worker (2 processes) that exports spans and serves metrics.

Spans: the worker's SDK writes them to a JSON-lines file (``AGENT_OTEL_FILE``, the development
exporter: the practical equivalent of an in-memory exporter for a worker in another process),
which the test reads. Metrics: the worker's ``/metrics`` (``AGENT_METRICS_PORT``) is scraped
before and after a turn. Flower: the Celery events Flower reads (``task-received``,
``task-failed``) are captured with a real event receiver.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.ports import free_port
from tests.conftest import ROOT
from tests.integration.conftest import stop_process
from tests.support.scripts import fc, msg, wait_for
from worker.turn.request import TurnStatus
from worker.turn.telemetry import parse_traceparent

QUEUES = ("turns", "tools", "background", "workflow")
SECRET = "s3cr3t-argument-value"


@contextmanager
def _worker_alone(redis_url: str, db: int, env: dict[str, str], logs: Path) -> Iterator[dict]:
    """A prefork worker (2 processes) with metrics on, alone on Redis database ``db`` (its own
    queues: no other worker of the session can take its tasks), and a control plane for it."""
    from control.client import ControlPlane

    url = redis_url.rsplit("/", 1)[0] + f"/{db}"
    port = free_port()
    log = logs / f"worker-db{db}.log"
    cmd = [sys.executable, "-m", "celery", "-A", "tasks.app", "worker", "-Q", ",".join(QUEUES)]
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [*cmd, "--pool", "prefork", "-c", "2", "-l", "INFO", "--without-gossip", "--without-mingle"],
            cwd=ROOT,
            env={**os.environ, "REDIS_URL": url, "AGENT_METRICS_PORT": str(port), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def ready():  # the metrics server starts once the worker is ready (worker_ready)
        assert proc.poll() is None, f"worker exited: {log.read_text()[-2000:]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(ready, timeout=60, poll=0.3)
        yield {"port": port, "control": ControlPlane(url), "url": url, "log": log}
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def ops_worker(redis_url, tmp_path_factory):
    """The worker of this module's tests: spans to a JSON-lines file, metrics on."""
    spans = tmp_path_factory.mktemp("otel") / "spans.jsonl"
    env = {"AGENT_OTEL_FILE": str(spans), "OTEL_BSP_SCHEDULE_DELAY": "100", "OTEL_SERVICE_NAME": "agent-test"}
    with _worker_alone(redis_url, 3, env, tmp_path_factory.mktemp("logs")) as worker:
        yield {**worker, "spans": spans}


class _OtlpReceiver:
    """An OTLP/HTTP trace receiver (``POST /v1/traces``, protobuf ``ExportTraceServiceRequest``)."""

    def __init__(self):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        received = self.spans = []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                for rs in request.resource_spans:
                    service = {a.key: a.value.string_value for a in rs.resource.attributes}.get("service.name")
                    for ss in rs.scope_spans:
                        received.extend((service, span) for span in ss.spans)
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"


def test_spans_go_over_otlp_when_the_endpoint_is_set(redis_url, tmp_path, gateway, script_name):
    receiver = _OtlpReceiver()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    try:
        with _worker_alone(redis_url, 4, env, tmp_path) as worker:
            control = worker["control"]
            gateway.add_script(script_name, [{"output": [fc("read_thing", {"label": "x"})]}, {"output": [msg("ok")]}])
            turn_id = control.enqueue({"agent_id": "otlp", "input": "go", "model": script_name, "toolset": "testing"})
            assert control.wait(turn_id, timeout=90).status == TurnStatus.completed
            root = parse_traceparent(control.store.load(turn_id).traceparent)

            def arrived():
                return [(svc, s) for svc, s in receiver.spans if int.from_bytes(s.trace_id, "big") == root.trace_id]

            expected = {"invoke_agent otlp", "turn_step", "tool_call", f"chat {script_name}", "execute_tool read_thing"}
            spans = wait_for(lambda: (got := arrived()) and expected <= {s.name for _, s in got} and got)
    finally:
        receiver.server.shutdown()
    assert {svc for svc, _ in spans} == {"agent-worker"}  # the default OTEL_SERVICE_NAME
    (top,) = [s for _, s in spans if s.name == "invoke_agent otlp"]
    assert int.from_bytes(top.span_id, "big") == root.span_id and not top.parent_span_id


def _trace_spans(path: Path, trace_id: str) -> list[dict]:
    if not path.exists():
        return []
    spans = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [s for s in spans if s["context"]["trace_id"] == trace_id]


def test_one_trace_per_turn_across_tasks_and_processes(ops_worker, gateway, script_name):
    control = ops_worker["control"]
    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc("read_thing", {"label": SECRET}),
                    fc("read_thing", {"label": "b"}),
                    fc("write_thing", {"label": "w"}),
                ]
            },
            {"output": [msg("done")]},
        ],
    )
    turn_id = control.enqueue({"agent_id": "tracer", "input": "go", "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=90).status == TurnStatus.completed
    root_ctx = parse_traceparent(control.store.load(turn_id).traceparent)
    trace_id, root_id = f"0x{root_ctx.trace_id:032x}", f"0x{root_ctx.span_id:016x}"

    def complete():
        spans = _trace_spans(ops_worker["spans"], trace_id)
        names = [s["name"] for s in spans]
        ids = {s["context"]["span_id"] for s in spans}
        whole = all(s["parent_id"] is None or s["parent_id"] in ids for s in spans)  # a task span ends last
        return spans if whole and "invoke_agent tracer" in names and names.count("tool_call") == 3 else None

    spans = wait_for(complete, timeout=30)
    by_id = {s["context"]["span_id"]: s for s in spans}
    root = by_id[root_id]
    assert root["name"] == "invoke_agent tracer" and root["parent_id"] is None
    assert root["attributes"]["agent.turn.id"] == turn_id
    assert root["attributes"]["agent.turn.status"] == "completed"
    assert root["attributes"]["gen_ai.usage.input_tokens"] > 0
    assert root["resource"]["attributes"]["service.name"] == "agent-test"
    # Every span hangs off the turn's root: no orphan, one trace.
    for s in spans:
        node = s
        while node["parent_id"] is not None:
            assert node["parent_id"] in by_id, f"{s['name']} has a parent outside the trace"
            node = by_id[node["parent_id"]]
        assert node is root

    def parent(s):
        return by_id[s["parent_id"]]

    steps = sorted((s for s in spans if s["name"] == "turn_step"), key=lambda s: s["attributes"]["agent.turn.step"])
    assert [s["attributes"]["agent.turn.step"] for s in steps] == [0, 1]
    assert all(s["kind"] == "SpanKind.CONSUMER" and s["parent_id"] == root_id for s in steps)
    chats = [s for s in spans if s["name"] == f"chat {script_name}"]
    assert len(chats) == 2 and {parent(c)["context"]["span_id"] for c in chats} == {
        s["context"]["span_id"] for s in steps
    }
    for c in chats:
        a = c["attributes"]
        assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == script_name
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["agent.turn.id"] == turn_id and a["agent.id"] == "tracer"
    # The step's plan is noted on its task span: tool, call id, batch; never the arguments.
    planned = [e for e in steps[0]["events"] if e["name"] == "agent.call_planned"]
    assert [e["attributes"]["gen_ai.tool.name"] for e in planned] == ["read_thing", "read_thing", "write_thing"]

    calls = {i["call_id"]: i for i in control.items(turn_id) if i["type"] == "function_call"}
    tools = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert {s["attributes"]["gen_ai.tool.call.id"] for s in tools} == set(calls)
    for t in tools:
        a = t["attributes"]
        assert a["gen_ai.operation.name"] == "execute_tool"
        assert (
            t["name"]
            == f"execute_tool {a['gen_ai.tool.name']}"
            == f"execute_tool {calls[a['gen_ai.tool.call.id']]['name']}"
        )
        assert a["agent.tool.outcome"] == "ok" and a["agent.turn.step"] == 0
        task = parent(t)
        assert task["name"] == "tool_call" and task["attributes"]["gen_ai.tool.call.id"] == a["gen_ai.tool.call.id"]
        assert "gen_ai.tool.call.arguments" not in a and "gen_ai.tool.call.result" not in a
    # The parallel reads (batch 0) were sent by step 0's task; the sequential write (batch 1) by
    # the read that completed the barrier: parent/child links follow the messages.
    step0 = steps[0]["context"]["span_id"]
    reads = [t for t in tools if t["attributes"]["agent.tool.batch"] == 0]
    (write,) = [t for t in tools if t["attributes"]["agent.tool.batch"] == 1]
    assert len(reads) == 2 and all(parent(parent(r))["context"]["span_id"] == step0 for r in reads)
    assert parent(parent(write))["name"] == "tool_call"
    # Arguments and outputs are not recorded by default.
    assert SECRET not in ops_worker["spans"].read_text()


def _scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_endpoint_moves_after_a_turn(ops_worker, gateway, script_name):
    control = ops_worker["control"]
    before = _scrape(ops_worker["port"])
    assert ("agent_turns_in_flight", ()) in before
    assert ("agent_approvals_waiting", ()) in before
    assert {k[0] for k in before} >= {"agent_queue_backlog", "agent_queue_oldest_age_seconds"}
    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc("read_thing", '```json\n{"label": "fenced"}\n```'),
                    fc("no_such_tool", {}),
                    fc("read_thing", {"label": "plain"}),
                ]
            },
            {"output": [msg("done")]},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=90).status == TurnStatus.completed

    def moved():
        after = _scrape(ops_worker["port"])
        done = _value(after, "agent_turns_ended_total", status="completed", reason="none") > _value(
            before, "agent_turns_ended_total", status="completed", reason="none"
        )
        return after if done else None

    after = wait_for(moved, timeout=20)

    def delta(name, **labels):
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert delta("agent_turns_started_total", queue="turns") >= 1
    assert delta("agent_tool_call_seconds_count", tool="read_thing") >= 2
    assert delta("agent_tool_call_seconds_sum", tool="read_thing") > 0
    assert delta("agent_model_call_seconds_count", model=script_name) == 2
    # outcome and error-class labels: both model calls answered, both read_thing calls ran fine
    assert delta("agent_model_calls_total", model=script_name, outcome="ok", error_class="none") == 2
    assert delta("agent_tool_calls_total", tool="read_thing", outcome="ok", error_class="none") >= 2
    assert delta("agent_argument_repairs_total", kind="code_fence") >= 1, sorted(
        k for k in after if k[0] == "agent_argument_repairs_total"
    )
    assert delta("agent_invalid_calls_total", tool="(unknown)", kind="unknown_tool") >= 1
    assert delta("agent_tokens_total", model=script_name, kind="input") > 0
    assert delta("agent_tokens_total", model=script_name, kind="output") > 0


class _Events:
    """Celery events as Flower receives them, captured in a thread."""

    def __init__(self, url: str):
        from tasks.app import app

        self.seen: list[dict] = []
        self._conn = app.connection_for_read(url)
        self.receiver = app.events.Receiver(self._conn, handlers={"*": self.seen.append})
        self._thread = threading.Thread(target=self.receiver.capture, kwargs={"limit": None}, daemon=True)

    def __enter__(self):
        self._thread.start()
        time.sleep(1.0)  # the receiver's queue is bound before the turn starts
        return self

    def __exit__(self, *exc):
        self.receiver.should_stop = True
        self._thread.join(10)
        self._conn.release()


def test_flower_sees_agent_turn_step_tool_and_a_failed_turn(ops_worker, gateway, script_name):
    control = ops_worker["control"]
    gateway.add_script(
        script_name,
        [
            {"output": [fc("read_thing", {"label": "x"})], "usage": {"input_tokens": 90, "output_tokens": 5}},
            {"output": [msg("never")]},
        ],
    )
    with _Events(ops_worker["url"]) as events:
        turn_id = control.enqueue(
            {
                "agent_id": "flower-agent",
                "input": "go",
                "model": script_name,
                "toolset": "testing",
                "token_budget": {"total_tokens": 50},
            }
        )
        assert control.wait(turn_id, timeout=90).status == TurnStatus.budget_exceeded

        def failed():
            return [e for e in events.seen if e["type"] == "task-failed" and turn_id in str(e.get("exception"))]

        (fail,) = wait_for(failed, timeout=20)
    received = {e["uuid"]: e for e in events.seen if e["type"] == "task-received"}
    labels = [e["args"] for e in received.values() if turn_id in e["args"]]
    assert f"read_thing agent=flower-agent turn={turn_id} step=0 call=" in " | ".join(labels)
    assert f"agent=flower-agent turn={turn_id} step=1" in labels
    assert received[fail["uuid"]]["name"] == "tasks.turns.turn_step"
    assert "budget_exceeded" in fail["exception"] and "token_budget.total_tokens" in fail["exception"]


def test_flower_sees_a_turn_the_watchdog_failed(ops_worker):
    from tasks.app import app
    from worker.settings import get_settings
    from worker.turn.keys import key

    MAX_REDRIVES = get_settings().max_redrives
    control = ops_worker["control"]
    # A turn whose messages were lost: queued, overdue, and already re-driven MAX_REDRIVES times.
    turn_id, _ = control.store.create("stuck" + os.urandom(6).hex(), {"agent_id": "stuck", "input": "x"}, [])
    control.redis.hset(key(turn_id), "redrives", MAX_REDRIVES)
    control.redis.zadd("turns:watch", {turn_id: 0})
    with _Events(ops_worker["url"]) as events:
        with app.connection_for_write(ops_worker["url"]) as conn:
            app.signature("tasks.watchdog.sweep").apply_async(queue="turns", connection=conn)

        def failed():
            return [e for e in events.seen if e["type"] == "task-failed" and turn_id in str(e.get("exception"))]

        (fail,) = wait_for(failed, timeout=30)
    assert "no progress" in fail["exception"]
    # the once-a-second sweep itself sends no task events (it never fills Flower's list); the
    # failure shows through the report task
    names = {e.get("name") for e in events.seen if e["type"] == "task-received"}
    assert "tasks.watchdog.sweep" not in names and "tasks.watchdog.turns_failed" in names
    view = control.status(turn_id)
    assert view.status == TurnStatus.failed and view.error == f"no progress after {MAX_REDRIVES} re-drives"
