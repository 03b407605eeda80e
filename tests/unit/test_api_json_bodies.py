"""What the API reads from a body and what a turn's intake can store, without a server: the
routes' strict JSON (``control.api.json_request``), the edge's hand-over of long digit runs
(``control.api.edge``), and the refusals of ``request_problem``, ``TurnIntake.prepare`` and an approval's ``check_params``."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest

from control.api.edge import _request
from control.api.json_request import strict_loads
from worker.turn.approvals import ApprovalError, ApprovalRecord, check_params
from worker.turn.intake import TurnIntake
from worker.turn.request import TurnRefused, TurnRequest, request_problem
from worker.turn.runtime import TurnRuntime


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b'{"a": NaN}', "NaN is not a JSON number"),
        (b'{"a": [Infinity]}', "Infinity is not a JSON number"),
        (b'{"a": 1e400}', "1e400 is beyond a double's range"),
        (b'{"a": "\xff"}', "not UTF-8"),
        (b"[" * 5000 + b"]" * 5000, "nested too deeply"),
        (b"{bad", "Expecting property name"),
    ],
)
def test_the_routes_read_strict_json(body, said):
    with pytest.raises(json.JSONDecodeError) as raised:
        strict_loads(body)
    assert said in raised.value.msg


def test_strict_json_keeps_what_json_has():
    assert strict_loads(b'{"n": 123456789012345678901234567890, "f": 1.5e-3}') == {
        "n": 123456789012345678901234567890,
        "f": 1.5e-3,
    }


def test_the_edge_leaves_a_run_of_19_digits_to_the_framework():
    assert _request(b'{"input": "x", "metadata": {"n": 922337203685477580}}') is not None  # 18 digits
    assert _request(b'{"input": "x", "metadata": {"n": 18446744073709551616}}') is None
    assert _request(b'{"input": "x", "metadata": {"n": -9223372036854775809}}') is None
    assert _request(b'{"input": "call 1234567890123456789"}') is None


def test_an_empty_idempotency_key_is_a_problem():
    assert request_problem(TurnRequest(input="x", idempotency_key="")) == (
        "idempotency_key",
        "the idempotency key is empty: give one of 1-200 characters, or none",
    )
    assert request_problem(TurnRequest(input="x", idempotency_key="k")) is None


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"metadata": {"n": 2**64}}, "beyond 64 bits"),
        ({"metadata": {"n": -(2**63) - 1}}, "beyond 64 bits"),
        ({"metadata": {"n": json.loads("[" * 300 + "]" * 300)}}, "nested more than 254 levels"),
        ({"metadata": {"n": json.loads("[" * 253 + "]" * 253)}}, "nested more than 254 levels"),
        ({"instructions": "x \ud800"}, "lone surrogate"),
    ],
)
def test_the_intake_refuses_what_it_cannot_store(fields, said):
    intake = TurnIntake(cast(TurnRuntime, SimpleNamespace(settings=SimpleNamespace(max_input_bytes=10**6))))
    with pytest.raises(TurnRefused) as raised:
        intake.prepare(TurnRequest(input="x", **fields), "t1")
    assert said in str(raised.value)
    deepest = {"metadata": {"n": json.loads("[" * 252 + "]" * 252)}, "instructions": "x \U0001f600"}
    assert intake.prepare(TurnRequest(input="x", **deepest), "t1").request["metadata"]["n"]


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"n": 2**64}, "beyond 64 bits"),
        ({"s": "x \ud800"}, "lone surrogate"),
        ({"o": json.loads("[" * 253 + "]" * 253)}, "nested more than 254 levels"),
    ],
)
def test_edited_params_the_record_cannot_hold_are_refused(params, said):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}, "o": {}}}
    rec = ApprovalRecord("t1", "a", 0, "c1", "tool", "x", {}, 0.0, 1.0, schema=schema)
    with pytest.raises(ApprovalError, match="cannot be stored") as raised:
        check_params(rec, params)
    assert said in str(raised.value)
    check_params(rec, {"n": 2**64 - 1, "o": json.loads("[" * 252 + "]" * 252)})
    replace(rec, params={"n": 2**64 - 1, "o": json.loads("[" * 252 + "]" * 252)}).to_json()
