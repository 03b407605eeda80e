"""OpenTelemetry spans of a turn: the turn itself, each model call, each tool call.

Only ``opentelemetry-api`` here: without a configured SDK every tracer is a no-op (a span
costs a function call and records nothing). ``tasks.telemetry`` sets the SDK up from the
standard ``OTEL_*`` variables and carries the context across Celery messages.

One trace per turn: ``new_traceparent()`` picks the turn's trace id and root span id when the
turn is created (W3C ``traceparent``, stored in the turn hash); every task of the turn is
published under that root (``under_turn``), so spans from any process share the trace id.
The root span itself (``invoke_agent``) is emitted when the turn ends, with those ids and the
turn's creation time as its start (``emit_turn_span``; the SDK side honours the ids through
``forced_ids``).

Attributes follow the OpenTelemetry GenAI semantic conventions (``gen_ai.operation.name``,
``gen_ai.request.model``, ``gen_ai.usage.*``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
...) plus ours under ``agent.*``. Tool arguments and results (``gen_ai.tool.call.arguments`` /
``gen_ai.tool.call.result``) are recorded only with ``Settings.otel_record_content``.
"""

from __future__ import annotations

import secrets
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import orjson
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from worker.turn.dispatch import PlannedCall
from worker.turn.request import TurnStatus
from worker.turn.state import CallResult

TRACER = trace.get_tracer("agent.turn")
PROVIDER = "openai"  # gen_ai.provider.name: the Responses API wire format (any compatible gateway)
CONTENT_CAP = 4_000  # characters of arguments / results recorded when content recording is on

# (trace_id, span_id) the SDK's id generator must use for the next span (tasks.telemetry.TurnIdGenerator).
_FORCED_IDS: ContextVar[tuple[int, int] | None] = ContextVar("agent_forced_span_ids", default=None)
# Whether this process hands the turn's context on to the messages it sends (set_propagation).
_PROPAGATE = [True]


def tracing_active() -> bool:
    """True once an SDK tracer provider is installed in this process (``tasks.telemetry``).
    Without one, the span helpers below return at once: tracing off costs a function call."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def set_propagation(on: bool) -> None:
    """Whether ``under_turn`` hands the turn's context on. On by default (a control plane without an
    SDK still starts the turn's trace for the workers); a worker with tracing off turns it off."""
    _PROPAGATE[0] = on


def propagation_on() -> bool:
    """See ``set_propagation``."""
    return _PROPAGATE[0]


def forced_ids() -> tuple[int, int] | None:
    """The ``(trace_id, span_id)`` the next span must take, when ``emit_turn_span`` asks for them."""
    return _FORCED_IDS.get()


def new_traceparent() -> str:
    """A W3C ``traceparent`` for a new turn: the caller's trace id when a span is current (a turn
    started by a traced caller joins its trace), else a random one; a random root span id."""
    current = trace.get_current_span().get_span_context()
    trace_id = current.trace_id if current.is_valid else secrets.randbits(128) or 1
    return f"00-{trace_id:032x}-{secrets.randbits(64) or 1:016x}-01"


def parse_traceparent(value: str | None) -> SpanContext | None:
    """The ``SpanContext`` of a stored ``traceparent`` (remote, sampled), or None if absent or malformed."""
    if not value:
        return None
    parts = value.split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(flags))
    return ctx if ctx.is_valid else None


@contextmanager
def under_turn(traceparent: str | None) -> Iterator[None]:
    """Make the turn's root span current, so that messages published inside (``before_task_publish``
    injects the current context into their headers) and spans started inside belong to the turn's trace."""
    ctx = parse_traceparent(traceparent) if _PROPAGATE[0] else None
    if ctx is None:
        yield
        return
    token = otel_context.attach(trace.set_span_in_context(NonRecordingSpan(ctx)))
    try:
        yield
    finally:
        otel_context.detach(token)


def _turn_attrs(turn_id: str, agent_id: str, step: int | None = None) -> dict[str, Any]:
    attrs: dict[str, Any] = {"agent.id": agent_id, "agent.turn.id": turn_id, "gen_ai.agent.id": agent_id}
    if step is not None:
        attrs["agent.turn.step"] = step
    return attrs


def _cap(text: str) -> str:
    return text if len(text) <= CONTENT_CAP else text[:CONTENT_CAP] + f"... [{len(text) - CONTENT_CAP} chars cut]"


@contextmanager
def model_call_span(model: str, turn_id: str, agent_id: str, step: int) -> Iterator[trace.Span]:
    """The span of one Responses API call (``chat {model}``, kind CLIENT). An exception escaping
    the block is recorded on it and marks it as an error."""
    if not tracing_active():
        yield trace.INVALID_SPAN
        return
    span = start_model_call_span(model, turn_id, agent_id, step)
    with trace.use_span(span, end_on_exit=True):
        yield span


def start_model_call_span(model: str, turn_id: str, agent_id: str, step: int) -> trace.Span:
    """``model_call_span`` for a call that ends on another thread (an asynchronous model call): the
    span is started here, in the caller's context, and ended by ``end_model_call_span``."""
    if not tracing_active():
        return trace.INVALID_SPAN
    span = TRACER.start_span(f"chat {model}", kind=SpanKind.CLIENT)
    if span.is_recording():
        span.set_attributes(
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": PROVIDER,
                "gen_ai.request.model": model,
                **_turn_attrs(turn_id, agent_id, step),
            }
        )
    return span


def end_model_call_span(span: trace.Span, error: BaseException | None = None) -> None:
    """End a span of ``start_model_call_span``; ``error`` is recorded on it and marks it as an error."""
    if error is not None and span.is_recording():
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{error.__class__.__name__}: {error}"[:200]))
    span.end()


def current_context() -> otel_context.Context:
    """The current trace context (to carry a step's task span to the thread that finishes it)."""
    return otel_context.get_current()


@contextmanager
def reply_span(context: otel_context.Context, turn_id: str, agent_id: str, step: int) -> Iterator[None]:
    """The span of a reply handled on another thread than its step's task (an asynchronous model
    call, ``worker.turn.async_calls``): ``model_reply``, a child of the task's span (``context``),
    current inside, so the plan's events are noted on it and the tool calls it publishes belong
    to the turn's trace under it."""
    if not tracing_active():
        yield
        return
    token = otel_context.attach(context)
    try:
        with TRACER.start_as_current_span("model_reply", kind=SpanKind.INTERNAL) as span:
            if span.is_recording():
                span.set_attributes(_turn_attrs(turn_id, agent_id, step))
            yield
    finally:
        otel_context.detach(token)


def model_reply(span: trace.Span, reply_id: str, status: str, usage: dict[str, int], calls: int) -> None:
    """Set the reply's attributes on a model call span: response id, finish reason, token usage, calls."""
    if not span.is_recording():
        return
    span.set_attributes(
        {
            "gen_ai.response.id": reply_id,
            "gen_ai.response.finish_reasons": [status],
            "gen_ai.usage.input_tokens": usage["input_tokens"],
            "gen_ai.usage.output_tokens": usage["output_tokens"],
            "gen_ai.usage.cache_read.input_tokens": usage["cached_tokens"],
            "agent.usage.reasoning_tokens": usage["reasoning_tokens"],
            "agent.model.function_calls": calls,
        }
    )


def planned_calls(calls: list[PlannedCall], batch_of: dict[str, int]) -> None:
    """Note the plan of a model reply on the current span: one event per call (tool, call id, batch,
    repairs applied, the error that kept it from running). No argument values."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    for call in calls:
        attrs: dict[str, Any] = {
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.call_id,
            "agent.tool.mode": call.mode,
            "agent.tool.repairs": list(call.repairs),
        }
        if call.call_id in batch_of:
            attrs["agent.tool.batch"] = batch_of[call.call_id]
        if call.error_kind:
            attrs["error.type"] = call.error_kind
        span.add_event("agent.call_planned", attrs)


@contextmanager
def tool_call_span(
    call: PlannedCall, turn_id: str, agent_id: str, step: int, batch: int, record_content: bool = False
) -> Iterator[trace.Span]:
    """The span of one tool execution (``execute_tool {name}``, kind INTERNAL); the call's
    arguments are recorded only with ``record_content``."""
    if not tracing_active():
        yield trace.INVALID_SPAN
        return
    with TRACER.start_as_current_span(f"execute_tool {call.name}", kind=SpanKind.INTERNAL) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": call.name,
                    "gen_ai.tool.call.id": call.call_id,
                    "gen_ai.tool.type": "function",
                    "agent.tool.batch": batch,
                    "agent.tool.mode": call.mode,
                    "agent.tool.repairs": list(call.repairs),
                    "agent.tool.destructive": call.destructive,
                    **_turn_attrs(turn_id, agent_id, step),
                }
            )
            if record_content and call.data is not None:
                span.set_attribute("gen_ai.tool.call.arguments", _cap(orjson.dumps(call.data).decode()))
        yield span


def tool_outcome(span: trace.Span, result: CallResult, record_content: bool = False) -> str:
    """Set a tool call's outcome on its span and return it: ``ok``, or the result's error kind
    (``exception``, ``interrupted``, ``outcome_unknown``, ...), ``error`` when it names none."""
    outcome = (result.details.get("error") or "error") if result.is_error else "ok"
    if span.is_recording():
        span.set_attribute("agent.tool.outcome", outcome)
        if result.terminate:
            span.set_attribute("agent.tool.terminate", True)
        if outcome != "ok":
            span.set_attribute("error.type", outcome)
            span.set_status(Status(StatusCode.ERROR, outcome))
        if record_content:
            span.set_attribute("gen_ai.tool.call.result", _cap(result.output))
    return outcome


def emit_turn_span(
    traceparent: str | None,
    *,
    turn_id: str,
    agent_id: str,
    status: str,
    error: str | None,
    created_at: float,
    queue: str,
    model_calls: int,
    usage: dict[str, int],
) -> None:
    """Emit the turn's root span (``invoke_agent {agent_id}``) with the ids chosen at creation,
    from ``created_at`` (epoch seconds) to now. A failure status marks it as an error."""
    ctx = parse_traceparent(traceparent) if tracing_active() else None
    if ctx is None:
        return
    token = _FORCED_IDS.set((ctx.trace_id, ctx.span_id))
    try:
        # An empty context: the root has no parent, whatever is current in this task.
        span = TRACER.start_span(
            f"invoke_agent {agent_id}",
            context=otel_context.Context(),
            kind=SpanKind.INTERNAL,
            start_time=int(created_at * 1e9) if created_at else None,
        )
    finally:
        _FORCED_IDS.reset(token)
    if span.is_recording():
        span.set_attributes(
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent_id,
                **_turn_attrs(turn_id, agent_id),
                "agent.turn.status": status,
                "agent.turn.queue": queue,
                "agent.turn.model_calls": model_calls,
                "gen_ai.usage.input_tokens": usage.get("input_tokens", 0),
                "gen_ai.usage.output_tokens": usage.get("output_tokens", 0),
            }
        )
        if TurnStatus(status).failure:
            span.set_attribute("error.type", status)
            span.set_status(Status(StatusCode.ERROR, (error or status)[:500]))
    span.end()
