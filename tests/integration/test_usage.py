"""Token usage of every model call, per step and in total (control plane, CLI, events), and
token budgets, through the real worker and the scripted gateway's ``usage``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis
from pydantic import ValidationError

from tests.conftest import ROOT
from tests.support.scripts import fc, msg
from worker.model.items import unanswered_call_ids
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.usage import UsageLedger, normalize_usage


def _usage(inp, out, cached=0, reasoning=0):
    return {"input_tokens": inp, "output_tokens": out, "cached_tokens": cached, "reasoning_tokens": reasoning}


def test_usage_is_recorded_per_step_and_in_total(control, gateway, script_name):
    gateway.add_script(
        script_name,
        [
            {
                "output": [fc("read_thing", {"label": "a"}), fc("read_thing", {"label": "b"})],
                "usage": _usage(100, 20, 40, 5),
            },
            {"output": [msg("done")], "usage": _usage(150, 10)},
        ],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=60).status == TurnStatus.completed

    used = control.usage(turn_id)
    assert used["total"] == {
        "input_tokens": 250,
        "output_tokens": 30,
        "total_tokens": 280,
        "cached_tokens": 40,
        "reasoning_tokens": 5,
        "model_calls": 2,
    }
    assert [(s["step"], s["input_tokens"], s["output_tokens"], s["model"]) for s in used["steps"]] == [
        (0, 100, 20, script_name),
        (1, 150, 10, script_name),
    ]
    assert used["budget"] is None
    events = control.events(turn_id)
    replies = [e["usage"] for e in events if e["kind"] == "model_reply"]
    assert replies == [{**_usage(100, 20, 40, 5), "total_tokens": 120}, {**_usage(150, 10), "total_tokens": 160}]
    finished = next(e for e in events if e["kind"] == "turn_finished")
    assert finished["usage"] == used["total"]

    cli = [sys.executable, "-m", "control.cli"]
    out = subprocess.run([*cli, "usage", turn_id], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == used
    status = subprocess.run([*cli, "status", turn_id], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert json.loads(status.stdout)["usage"]["total_tokens"] == 280


def test_scripted_gateway_reports_usage_by_default(control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("hello")]}])
    turn_id = control.enqueue({"input": "say hello " * 20, "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=60).status == TurnStatus.completed
    total = control.usage(turn_id)["total"]
    assert total["input_tokens"] > 40 and total["output_tokens"] > 0
    assert total["total_tokens"] == total["input_tokens"] + total["output_tokens"]


def test_output_budget_ends_the_turn_with_its_own_status(control, gateway, script_name):
    gateway.add_script(
        script_name,
        [
            {"output": [fc("read_thing", {"label": "1"})], "usage": _usage(50, 20)},
            {"output": [fc("read_thing", {"label": "2"})], "usage": _usage(60, 20)},
            {"output": [fc("read_thing", {"label": "3"})], "usage": _usage(70, 20)},
            {"output": [msg("never reached")]},
        ],
    )
    turn_id = control.enqueue(
        {"input": "go", "model": script_name, "toolset": "testing", "token_budget": {"output_tokens": 40}}
    )
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.budget_exceeded
    assert view.error == "token budget exceeded: 40 output tokens used, budget 40 (token_budget.output_tokens)"
    # The reply that reached the budget still had its call run and answered; no third model call.
    assert control.usage(turn_id)["total"]["model_calls"] == 2
    assert len([b for b in gateway.requests if b.get("model") == script_name]) == 2
    items = control.items(turn_id)
    assert unanswered_call_ids(items) == []
    assert sum(1 for i in items if i["type"] == "function_call_output") == 2
    finished = next(e for e in control.events(turn_id) if e["kind"] == "turn_finished")
    assert finished["status"] == "budget_exceeded" and finished["usage"]["output_tokens"] == 40


@pytest.mark.parametrize("budget", [{"input_tokens": 100}, {"total_tokens": 100}])
def test_input_and_total_budgets(control, gateway, script_name, budget):
    gateway.add_script(
        script_name,
        [{"output": [fc("read_thing", {"label": "1"})], "usage": _usage(120, 5)}, {"output": [msg("never")]}],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing", "token_budget": budget})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.budget_exceeded
    (field,) = budget
    assert f"(token_budget.{field})" in view.error


def test_token_budget_is_validated():
    with pytest.raises(ValidationError):
        TurnRequest.model_validate({"input": "x", "token_budget": {"total_tokens": 0}})
    with pytest.raises(ValidationError):
        TurnRequest.model_validate({"input": "x", "token_budget": {"tokens": 10}})
    req = TurnRequest.model_validate({"input": "x", "token_budget": {"input_tokens": 10, "total_tokens": 30}})
    assert req.token_budget.output_tokens is None


def test_a_redelivered_step_is_counted_once(redis_url):
    ledger = UsageLedger(redis.Redis.from_url(redis_url))
    assert ledger.record_and_total("usage-once", 0, normalize_usage({"input_tokens": 7, "output_tokens": 3}), "m")[0]
    assert not ledger.record_and_total("usage-once", 0, normalize_usage({"input_tokens": 7, "output_tokens": 3}), "m")[
        0
    ]
    assert ledger.totals("usage-once")["total_tokens"] == 10


def test_normalize_usage_tolerates_missing_and_malformed_counts():
    assert normalize_usage(None) == _usage(0, 0) | {"total_tokens": 0}
    assert normalize_usage({"input_tokens": "12", "output_tokens": 4, "input_tokens_details": None}) == {
        **_usage(0, 4),
        "total_tokens": 4,
    }
