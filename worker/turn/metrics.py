"""Prometheus metrics of the turn loop (``prometheus-client``), updated by the engine.

The objects live in the default registry of the process. A worker serves them on
``AGENT_METRICS_PORT`` (``tasks.metrics``, multiprocess mode so that every prefork child
counts); a process that serves nothing (a control plane) just counts in memory, unread.
Names and labels (docs/operations.md, "Metrics"):

- ``agent_turns_started_total{queue}``, ``agent_turns_ended_total{status,reason}`` (every terminal
  transition once: a worker counts its own; one made by a control plane, such as a parked turn
  cancelled, is counted by a worker it sends ``tasks.turns.count_ended`` to);
- ``agent_turn_seconds{status}`` (histogram: from enqueue to the end);
- ``agent_model_first_token_seconds{model}`` (histogram: a streamed call's time to its first delta);
- ``agent_approval_decision_seconds{decision}`` (histogram: from the request to the decision,
  ``approved``, ``rejected`` or ``expired``, observed when the worker takes the decided call up);
- ``agent_model_call_seconds{model}``, ``agent_tool_call_seconds{tool}`` (histograms);
- ``agent_model_calls_total{model,outcome,error_class}``, ``agent_tool_calls_total{tool,outcome,error_class}``;
- ``agent_argument_repairs_total{kind}``, ``agent_invalid_calls_total{tool,kind}``;
- ``agent_tokens_total{model,kind}`` (kind: input, output, cached, reasoning);
- ``agent_watchdog_redrives_total``;
- ``agent_replica_ack_misses_total{write}`` (``worker.turn.durability``: ``claim``, ``memo``, ``response``);
- ``agent_turns_in_flight`` (served by ``tasks.metrics`` from Redis at scrape time).

Label values are bounded: a tool name the turn does not offer is counted as ``(unknown)``;
``outcome``, ``error_class`` and ``reason`` take only the values of the tables below (anything
else is ``other``), so an alert can group by them without a series per error message.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

# Model calls take seconds; tool calls from milliseconds (a file read) to minutes (a command).
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)
_TURN_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 14400, 86400)
_APPROVAL_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 900, 1800, 3600, 7200, 14400, 43200, 86400)
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

TURNS_STARTED = Counter("agent_turns_started", "Turns that started running (first model step).", ["queue"])
TURNS_ENDED = Counter(
    "agent_turns_ended", "Turns that reached a terminal status, with the class of the reason.", ["status", "reason"]
)
MODEL_CALLS = Counter(
    "agent_model_calls", "Model calls by outcome (ok, error) and error class.", ["model", "outcome", "error_class"]
)
TOOL_CALLS = Counter(
    "agent_tool_calls",
    "Tool calls that ran, by outcome (ok, error) and error class.",
    ["tool", "outcome", "error_class"],
)
MODEL_CALL_SECONDS = Histogram(
    "agent_model_call_seconds", "Latency of Responses API calls.", ["model"], buckets=_MODEL_BUCKETS
)
TOOL_CALL_SECONDS = Histogram("agent_tool_call_seconds", "Latency of tool executions.", ["tool"], buckets=_TOOL_BUCKETS)
TURN_SECONDS = Histogram(
    "agent_turn_seconds", "Turn duration from enqueue to its terminal status.", ["status"], buckets=_TURN_BUCKETS
)
FIRST_TOKEN_SECONDS = Histogram(
    "agent_model_first_token_seconds",
    "Time from a streamed model call's request to its first delta.",
    ["model"],
    buckets=_MODEL_BUCKETS,
)
APPROVAL_DECISION_SECONDS = Histogram(
    "agent_approval_decision_seconds",
    "Time from an approval request to its decision (approved, rejected, expired).",
    ["decision"],
    buckets=_APPROVAL_BUCKETS,
)
REPAIRS = Counter("agent_argument_repairs", "Repairs applied to function-call arguments.", ["kind"])
INVALID_CALLS = Counter(
    "agent_invalid_calls", "Function calls that did not run (invalid arguments, unknown tool).", ["tool", "kind"]
)
TOKENS = Counter("agent_tokens", "Tokens reported in the Responses usage of model calls.", ["model", "kind"])
REDRIVES = Counter("agent_watchdog_redrives", "Turns re-driven by the watchdog.")
REPLICA_ACK_MISSES = Counter(
    "agent_replica_ack_misses",
    "Fencing writes no replica acknowledged in time (WAIT), by write: claim, memo (docs/failover.md).",
    ["write"],
)


def calls_planned(calls: list[Any], known_tools: set[str]) -> None:
    """Count the repairs applied to a reply's calls and the calls that will not run."""
    for call in calls:
        for kind in call.repairs:
            REPAIRS.labels(kind).inc()
        if call.error_kind:
            tool = call.name if call.name in known_tools else "(unknown)"
            INVALID_CALLS.labels(tool, call.error_kind).inc()


def tokens_used(model: str, usage: dict[str, int]) -> None:
    """Count one model call's tokens (a normalized usage, ``worker.turn.usage``)."""
    for kind in ("input", "output", "cached", "reasoning"):
        n = usage.get(f"{kind}_tokens", 0)
        if n:
            TOKENS.labels(model, kind).inc(n)


# A tool result's ``details.error`` kinds (``worker.turn.state.CallResult``) kept as error classes;
# a tool's own error result without one, or naming ``tool_error`` (the computer tools'), is ``tool_error``.
_TOOL_ERROR_CLASSES = frozenset(
    {
        "tool_error",
        "exception",
        "interrupted",
        "outcome_unknown",
        "rejected",
        "expired",
        "timeout",
        "invalid_edit",
        "moved",
        "unfenced",
    }
)


def tool_call_finished(tool: str, is_error: bool, details: dict[str, Any]) -> None:
    """Count one tool call that ran: ``outcome`` ok or error; ``error_class`` from the result's
    ``details.error`` (``none`` for ok, ``tool_error`` for a tool's own error result, ``other``
    for a kind outside ``_TOOL_ERROR_CLASSES``)."""
    if not is_error:
        TOOL_CALLS.labels(tool, "ok", "none").inc()
        return
    kind = details.get("error")
    error_class = "tool_error" if not kind else kind if kind in _TOOL_ERROR_CLASSES else "other"
    TOOL_CALLS.labels(tool, "error", error_class).inc()


def gateway_error_class(status_code: int | None, model_output: bool = False) -> str:
    """The class of a failed model call: ``model_output`` (the server refused the model's own
    output, ``GatewayError.model_output``, whatever the status or frame it came in), ``transport``
    (no HTTP answer: connect, read, timeout), ``timeout`` (408), ``rate_limited`` (429),
    ``conflict`` (409), ``server`` (5xx), ``client`` (any other 4xx: the request is wrong), ``other``."""
    if model_output:
        return "model_output"
    if status_code is None:
        return "transport"
    named = {408: "timeout", 409: "conflict", 429: "rate_limited"}
    if status_code in named:
        return named[status_code]
    if 500 <= status_code < 600:
        return "server"
    return "client" if 400 <= status_code < 500 else "other"


def model_call_finished(
    model: str, status_code: int | None = None, failed: bool = False, model_output: bool = False
) -> None:
    """Count one model call: ok, or error with ``gateway_error_class(status_code, model_output)``."""
    if failed:
        MODEL_CALLS.labels(model, "error", gateway_error_class(status_code, model_output)).inc()
    else:
        MODEL_CALLS.labels(model, "ok", "none").inc()


# The reason class of an ended turn, from the first words of its error (the texts the runtime
# writes: worker/turn and tasks/turns.py); ``none`` for a turn that ended without an error.
_REASONS = (
    ("model gateway failed after retries", "model_unavailable"),
    ("internal error", "internal_error"),
    ("cancelled", "cancelled"),
    ("stopped after", "max_model_calls"),
    ("the model sent invalid arguments", "invalid_arguments"),
    ("the model replied without calling", "no_submission"),
    ("the model's answer stopped at the output-token limit", "output_token_limit"),
    ("the model's output could not be read", "model_output"),
)


def turn_reason(status: str, error: str | None) -> str:
    """The bounded reason class of a turn that ended with ``status`` and ``error``."""
    if not error:
        return "none"
    text = error.lower()
    for prefix, reason in _REASONS:
        if text.startswith(prefix):
            return reason
    if "re-drives" in text:
        return "watchdog"
    if status == "budget_exceeded":
        return "token_budget"
    if status == "failed" and ("http" in text or "model" in text):
        return "model_rejected"
    return "other"


def turn_ended(status: str, error: str | None, seconds: float | None = None) -> None:
    """Count a turn that reached a terminal status, with its reason class (``turn_reason``), and
    observe its duration (``seconds`` from enqueue; None: unknown, not observed)."""
    TURNS_ENDED.labels(status, turn_reason(status, error)).inc()
    if seconds is not None:
        TURN_SECONDS.labels(status).observe(max(seconds, 0.0))


def approval_decided(status: str, by: str | None, requested_at: float, decided_at: float | None) -> None:
    """Observe one decided approval: ``expired`` when the deadline rejected it (``by == "deadline"``)."""
    if decided_at is None or status not in ("approved", "rejected"):
        return
    decision = "expired" if status == "rejected" and by == "deadline" else status
    APPROVAL_DECISION_SECONDS.labels(decision).observe(max(decided_at - requested_at, 0.0))
