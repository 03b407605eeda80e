"""How tracing is switched on (the standard OTEL_* variables) and what a tool span records,
with the real SDK and its in-memory exporter (in this process)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tasks.telemetry import tracing_exporters
from worker.settings import Settings
from worker.turn import telemetry
from worker.turn.dispatch import PlannedCall
from worker.turn.state import CallResult


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, []),
        ({"OTEL_TRACES_EXPORTER": "none"}, []),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, ["console", "otlp"]),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ["otlp"]),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ["otlp"]),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, []),
    ],
)
def test_tracing_is_off_unless_the_standard_variables_ask(env, expected):
    assert tracing_exporters(env, Settings()) == expected


def test_the_file_exporter_and_an_unknown_exporter(tmp_path):
    assert tracing_exporters({}, Settings(otel_file=tmp_path / "s.jsonl")) == ["file"]
    assert tracing_exporters({"OTEL_SDK_DISABLED": "TRUE"}, Settings(otel_file=tmp_path / "s.jsonl")) == []
    with pytest.raises(ValueError, match="OTEL_TRACES_EXPORTER: unsupported exporter"):
        tracing_exporters({"OTEL_TRACES_EXPORTER": "zipkin"}, Settings())


@pytest.fixture
def spans(monkeypatch):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(telemetry, "TRACER", provider.get_tracer("test"))
    monkeypatch.setattr(telemetry, "tracing_active", lambda: True)
    return exporter


@pytest.mark.parametrize("record", [False, True])
def test_tool_arguments_and_results_are_recorded_only_when_allowed(spans, record):
    call = PlannedCall("call_1", "write_file", 0, mode="sequential", data={"content": "API_KEY=sk-live-123"})
    with telemetry.tool_call_span(call, "turn-1", "alice", 2, 1, record_content=record) as span:
        outcome = telemetry.tool_outcome(span, CallResult("wrote sk-live-123"), record)
    assert outcome == "ok"
    (finished,) = spans.get_finished_spans()
    attrs = dict(finished.attributes)
    assert finished.name == "execute_tool write_file"
    assert attrs["gen_ai.tool.call.id"] == "call_1" and attrs["agent.tool.batch"] == 1
    assert attrs["agent.tool.mode"] == "sequential" and attrs["agent.turn.step"] == 2
    text = repr(attrs)
    assert ("sk-live-123" in text) is record
    if record:
        assert attrs["gen_ai.tool.call.arguments"] == '{"content":"API_KEY=sk-live-123"}'
        assert attrs["gen_ai.tool.call.result"] == "wrote sk-live-123"


def test_a_failed_tool_call_is_an_error_span(spans):
    call = PlannedCall("call_2", "run_command", 0, data={"command": "x"})
    with telemetry.tool_call_span(call, "turn-1", "alice", 0, 0) as span:
        outcome = telemetry.tool_outcome(span, CallResult.error("Error", "interrupted"))
    assert outcome == "interrupted"
    (finished,) = spans.get_finished_spans()
    assert finished.status.status_code.name == "ERROR" and finished.attributes["error.type"] == "interrupted"


def test_tracing_off_is_a_no_op():
    assert not telemetry.tracing_active()  # this process never installs an SDK
    call = PlannedCall("call_3", "read_file", 0, data={})
    with telemetry.tool_call_span(call, "t", "a", 0, 0) as span:
        assert not span.is_recording()
