"""Tracing on the Celery edge: the OpenTelemetry SDK of a worker, and the trace context carried
in message headers.

Off by default, with no cost: the SDK is set up (``configure_tracing``, at ``worker_init``)
only when the standard variables ask for it and ``OTEL_SDK_DISABLED`` is not ``true``:

- ``OTEL_TRACES_EXPORTER``: ``otlp`` (OTLP over HTTP/protobuf to ``OTEL_EXPORTER_OTLP_ENDPOINT``
  or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), ``console`` (stdout), comma-separated, or ``none``;
  an OTLP endpoint alone implies ``otlp``;
- ``AGENT_OTEL_FILE=/path/spans.jsonl`` adds a development exporter: one JSON object per span
  (``ReadableSpan.to_json``), appended by every process of the worker;
- ``OTEL_SERVICE_NAME`` (default ``agent-worker``), ``OTEL_RESOURCE_ATTRIBUTES``,
  ``OTEL_BSP_SCHEDULE_DELAY`` and the other SDK variables as documented by OpenTelemetry.

Turn tracing on for every worker of a deployment or for none: a worker with tracing off does
not hand the turn's context on either (so that off costs nothing per step).

Propagation (same scheme as ``opentelemetry-instrumentation-celery``): ``before_task_publish``
injects the current context (W3C ``traceparent``) into the message headers, always (a control
plane without an SDK still hands on the turn's root context, ``worker.turn.telemetry.under_turn``);
with the SDK on, ``task_prerun`` starts a CONSUMER span for the task as a child of the context in
its headers and makes it current for the engine's model and tool spans; ``task_postrun`` ends it.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from contextvars import Token
from pathlib import Path
from typing import Any, Sequence

from celery.signals import (
    before_task_publish,
    task_failure,
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_shutdown,
    worker_shutdown,
)
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from worker.settings import Settings, get_settings
from worker.turn.telemetry import forced_ids, propagation_on, set_propagation

log = logging.getLogger("agent.telemetry")

_TRACER = trace.get_tracer("agent.tasks")
_state: dict[str, Any] = {"provider": None}
_spans: dict[str, tuple[trace.Span, Token[otel_context.Context]]] = {}


def tracing_exporters(env: dict[str, str] | os._Environ[str], settings: Settings) -> list[str]:
    """The exporters the environment asks for (``otlp``, ``console``, ``file``); empty: tracing off.

    Raises ``ValueError`` naming ``OTEL_TRACES_EXPORTER`` for an exporter this worker does not ship.
    """
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    unknown = [n for n in names if n not in ("otlp", "console")]
    if unknown:
        raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter(s) {', '.join(unknown)} (otlp, console, none)")
    if not names and (env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        names = ["otlp"]
    if settings.otel_file:
        names.append("file")
    return names


class JsonLinesSpanExporter:
    """A development exporter: appends each span as one JSON line (``ReadableSpan.to_json``) to ``path``.

    Several processes may share the file: each batch is written with one ``write`` under an
    exclusive ``flock``.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def export(self, spans: Sequence[Any]) -> Any:
        """Append the spans; returns ``SpanExportResult``."""
        from opentelemetry.sdk.trace.export import SpanExportResult

        data = "".join(json.dumps(json.loads(s.to_json(indent=None))) + "\n" for s in spans).encode()
        try:
            with open(self.path, "ab") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.write(data)
        except OSError:
            log.exception("could not write spans to %s", self.path)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing to release: the file is opened per batch."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Every export is written at once."""
        return True


def _id_generator() -> Any:
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

    class TurnIdGenerator(RandomIdGenerator):
        """Random ids, except for a turn's root span, whose ids were chosen when the turn was created."""

        def generate_trace_id(self) -> int:
            forced = forced_ids()
            return forced[0] if forced else super().generate_trace_id()

        def generate_span_id(self) -> int:
            forced = forced_ids()
            return forced[1] if forced else super().generate_span_id()

    return TurnIdGenerator()


def configure_tracing(env: dict[str, str] | os._Environ[str] | None = None, settings: Settings | None = None) -> bool:
    """Install the SDK's tracer provider when the environment asks for tracing; True if it did.

    Raises ``ValueError`` for an unsupported ``OTEL_TRACES_EXPORTER``.
    """
    env = os.environ if env is None else env
    settings = settings or get_settings()
    names = tracing_exporters(env, settings)
    if not names or _state["provider"] is not None:
        return _state["provider"] is not None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attrs = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": "agent-worker"}
    provider = TracerProvider(resource=Resource.create(attrs), id_generator=_id_generator())
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter: Any = OTLPSpanExporter()
        elif name == "console":
            exporter = ConsoleSpanExporter()
        else:
            assert settings.otel_file is not None  # "file" is chosen only with AGENT_OTEL_FILE set
            exporter = JsonLinesSpanExporter(settings.otel_file)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _state["provider"] = provider
    log.info("tracing on: exporters %s", ", ".join(names))
    return True


@worker_init.connect(weak=False)
def _on_worker_init(**_: Any) -> None:
    try:
        on = configure_tracing()
    except ValueError as exc:  # Celery swallows ordinary exceptions from signal handlers
        raise SystemExit(f"worker not started: {exc}") from exc
    # A worker with tracing off does not hand contexts on either: off costs nothing per step.
    set_propagation(on)


@worker_process_shutdown.connect(weak=False)
def _on_child_exit(**_: Any) -> None:
    if _state["provider"] is not None:
        _state["provider"].force_flush(5_000)


@worker_shutdown.connect(weak=False)
def _on_worker_exit(**_: Any) -> None:
    if _state["provider"] is not None:
        _state["provider"].shutdown()


@before_task_publish.connect(weak=False)
def _inject(headers: dict[str, Any] | None = None, **_: Any) -> None:
    # Writes nothing when no span is current.
    if headers is not None and propagation_on():
        propagate.inject(headers)


@task_prerun.connect(weak=False)
def _start_task_span(task_id: str = "", task: Any = None, args: Any = None, **_: Any) -> None:
    if _state["provider"] is None or task is None:
        return
    req = task.request
    carrier = {k: v for k in ("traceparent", "tracestate") if isinstance(v := getattr(req, k, None), str)}
    attrs: dict[str, Any] = {"messaging.system": "celery", "celery.task_name": task.name, "celery.task_id": task_id}
    if getattr(req, "argsrepr", None):
        attrs["agent.task.label"] = str(req.argsrepr)
    args = list(args or ())
    for key, value in zip(("agent.turn.id", "agent.turn.step", "gen_ai.tool.call.id"), args):
        if task.name.startswith("tasks.turns."):
            attrs[key] = value
    span = _TRACER.start_span(
        task.name.rsplit(".", 1)[-1], context=propagate.extract(carrier), kind=SpanKind.CONSUMER, attributes=attrs
    )
    token = otel_context.attach(trace.set_span_in_context(span))
    _spans[task_id] = (span, token)


@task_failure.connect(weak=False)
def _task_failed(task_id: str = "", exception: BaseException | None = None, **_: Any) -> None:
    entry = _spans.get(task_id)
    if entry and exception is not None:
        entry[0].record_exception(exception)
        entry[0].set_status(Status(StatusCode.ERROR, f"{exception.__class__.__name__}: {exception}"[:500]))


@task_postrun.connect(weak=False)
def _end_task_span(task_id: str = "", state: str | None = None, **_: Any) -> None:
    entry = _spans.pop(task_id, None)
    if entry is None:
        return
    span, token = entry
    if state:
        span.set_attribute("celery.state", state)
    span.end()
    otel_context.detach(token)
