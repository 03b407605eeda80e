"""What the API reads from a body and what a turn's intake can store, without a server: the
routes' strict JSON (``control.api.json_request``), the edge's hand-over of long digit runs
(``control.api.edge``), and the refusals of ``request_problem``, ``TurnIntake.prepare`` and an approval's ``check_params``,
with ``unstorable``'s cause read from the refused value."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import orjson
import pytest

from control.api.edge import _request
from control.api.json_request import strict_loads
from worker.turn.approvals import ApprovalError, ApprovalRecord, check_params
from worker.turn.intake import TurnIntake
from worker.turn.request import STORE_MAX_DEPTH, TurnRefused, TurnRequest, request_problem, unstorable
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


def _nested(levels: int) -> list:
    return json.loads("[" * levels + "]" * levels)


def _cyclic() -> dict:
    loop: dict = {"ok": 1}
    loop["again"] = loop
    return loop


WIDE = "an integer is beyond 64 bits (-2**63 to 2**64-1); send a larger number as a string"
DEEP = "arrays and objects are nested more than 254 levels deep (the outermost object counted)"
SURROGATE = "a string holds a lone surrogate (an escaped \\ud800-\\udfff without its pair), which is not Unicode text"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({"n": 2**64}, WIDE),
        ([1, -(2**63) - 1], WIDE),
        (_nested(STORE_MAX_DEPTH + 1), DEEP),
        ({"o": _nested(STORE_MAX_DEPTH)}, DEEP),  # the outermost object counted
        ({"s": ["fine \U0001f600", "x \ud800 y"]}, SURROGATE),
        ({"k \udfff": 1}, SURROGATE),  # in a key
        ([2**64, "x \ud800"], WIDE),  # the first the encoder meets
        (["x \ud800", 2**64], SURROGATE),
        (TurnRequest(input="x", metadata={"n": _nested(300)}), DEEP),  # the model pydantic's model_dump refused
    ],
)
def test_unstorable_finds_the_cause_in_the_value_not_the_error_text(value, said):
    # An exception that says nothing of the cause: the explanation comes from the value.
    assert unstorable(value, TypeError("the encoder's wording changed")) == said
    if not isinstance(value, TurnRequest):  # the store's encoder refuses each of them
        with pytest.raises(TypeError):
            orjson.dumps(value)


def test_unstorable_stops_at_the_depth_limit_of_a_cyclic_value():
    assert unstorable(_cyclic(), ValueError("Recursion error - cyclic reference detected")) == DEEP


@pytest.mark.parametrize(
    "value",
    [
        {"n": [2**64 - 1, -(2**63), True]},
        _nested(STORE_MAX_DEPTH),
        {"s": "x \U0001f600 \u00e9", "k \u00e9": 1.5},
        {"o": {1, 2}},  # a set: no cause unstorable knows
    ],
)
def test_unstorable_says_the_error_text_when_the_value_has_no_known_cause(value):
    assert unstorable(value, TypeError("Type is not JSON serializable: set")) == "Type is not JSON serializable: set"
    if "o" not in value:  # the encoder takes these: the limits are orjson's own
        orjson.dumps(value)
