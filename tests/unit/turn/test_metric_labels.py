"""The bounded labels of the operator metrics (worker/turn/metrics.py): error classes of model and
tool calls and the reason class of an ended turn take only values from their tables."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from worker.turn import metrics


@pytest.mark.parametrize(
    ("status_code", "expected"),
    [
        (None, "transport"),
        (408, "timeout"),
        (409, "conflict"),
        (429, "rate_limited"),
        (500, "server"),
        (503, "server"),
        (400, "client"),
        (404, "client"),
        (302, "other"),
    ],
)
def test_gateway_error_class(status_code, expected):
    assert metrics.gateway_error_class(status_code) == expected


@pytest.mark.parametrize(
    ("status", "error", "expected"),
    [
        ("completed", None, "none"),
        ("failed", "model gateway failed after retries: HTTP 503", "model_unavailable"),
        ("failed", "internal error in step 2: KeyError: 'x'", "internal_error"),
        ("cancelled", "cancelled by the control plane", "cancelled"),
        ("max_model_calls", "stopped after 8 model calls (max_model_calls=8)", "max_model_calls"),
        ("invalid_arguments", "the model sent invalid arguments to run_command more than 3 times", "invalid_arguments"),
        ("failed", "the model replied without calling submit_result twice; ...", "no_submission"),
        ("failed", "no progress after 3 re-drives", "watchdog"),
        ("budget_exceeded", "output tokens 5000 over the budget 4000", "token_budget"),
        ("failed", "HTTP 400 from the model gateway: bad tool schema", "model_rejected"),
        ("failed", "a brand new failure text 123", "other"),
    ],
)
def test_turn_reason_is_a_bounded_class(status, error, expected):
    assert metrics.turn_reason(status, error) == expected


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_tool_call_error_classes_are_bounded():
    tool = "label_probe_tool"
    cases = [
        (False, {}, ("ok", "none")),
        (True, {"error": "exception", "type": "KeyError"}, ("error", "exception")),
        (True, {}, ("error", "tool_error")),
        (True, {"error": "tool_error", "message": "missing.txt: no such file"}, ("error", "tool_error")),
        (True, {"error": "some new kind the runtime never wrote"}, ("error", "other")),
    ]
    for is_error, details, (outcome, error_class) in cases:
        labels = {"tool": tool, "outcome": outcome, "error_class": error_class}
        before = _sample("agent_tool_calls_total", labels)
        metrics.tool_call_finished(tool, is_error, details)
        assert _sample("agent_tool_calls_total", labels) == before + 1, labels


def test_model_call_outcomes():
    ok = {"model": "label-probe", "outcome": "ok", "error_class": "none"}
    limited = {"model": "label-probe", "outcome": "error", "error_class": "rate_limited"}
    before_ok, before_limited = _sample("agent_model_calls_total", ok), _sample("agent_model_calls_total", limited)
    metrics.model_call_finished("label-probe")
    metrics.model_call_finished("label-probe", 429, failed=True)
    assert _sample("agent_model_calls_total", ok) == before_ok + 1
    assert _sample("agent_model_calls_total", limited) == before_limited + 1
