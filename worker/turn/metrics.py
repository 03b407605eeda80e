"""Prometheus metrics of the turn loop (``prometheus-client``), updated by the engine.

The objects live in the default registry of the process. A worker serves them on
``AGENT_METRICS_PORT`` (``tasks.metrics``, multiprocess mode so that every prefork child
counts); a process that serves nothing (a control plane) just counts in memory, unread.
Names and labels (docs/operations.md, "Metrics"):

- ``agent_turns_started_total{queue}``, ``agent_turns_ended_total{status}``;
- ``agent_model_call_seconds{model}``, ``agent_tool_call_seconds{tool}`` (histograms);
- ``agent_argument_repairs_total{kind}``, ``agent_invalid_calls_total{tool,kind}``;
- ``agent_tokens_total{model,kind}`` (kind: input, output, cached, reasoning);
- ``agent_watchdog_redrives_total``;
- ``agent_turns_in_flight`` (served by ``tasks.metrics`` from Redis at scrape time).

Label values are bounded: a tool name the turn does not offer is counted as ``(unknown)``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Histogram

# Model calls take seconds; tool calls from milliseconds (a file read) to minutes (a command).
_MODEL_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 40, 80, 160)
_TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

TURNS_STARTED = Counter("agent_turns_started", "Turns that started running (first model step).", ["queue"])
TURNS_ENDED = Counter("agent_turns_ended", "Turns that reached a terminal status.", ["status"])
MODEL_CALL_SECONDS = Histogram(
    "agent_model_call_seconds", "Latency of Responses API calls.", ["model"], buckets=_MODEL_BUCKETS
)
TOOL_CALL_SECONDS = Histogram("agent_tool_call_seconds", "Latency of tool executions.", ["tool"], buckets=_TOOL_BUCKETS)
REPAIRS = Counter("agent_argument_repairs", "Repairs applied to function-call arguments.", ["kind"])
INVALID_CALLS = Counter(
    "agent_invalid_calls", "Function calls that did not run (invalid arguments, unknown tool).", ["tool", "kind"]
)
TOKENS = Counter("agent_tokens", "Tokens reported in the Responses usage of model calls.", ["model", "kind"])
REDRIVES = Counter("agent_watchdog_redrives", "Turns re-driven by the watchdog.")


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
