"""Issue 9, control plane: turn-id takeover, per-agent idempotency keys, input size, strict ids.

Enqueues go to a Redis database no worker consumes (``ControlPlane`` on db 8 of the suite's
Redis, with the control user's credentials), so each test sees exactly what was stored and
enqueued.
"""

from __future__ import annotations

import os
import uuid

import orjson
import pytest
import redis
from pydantic import ValidationError

from control.client import ControlPlane, ControlPlaneError
from worker.turn.request import ID_PATTERN, TurnRequest

DB = 8


@pytest.fixture(scope="module")
def cp() -> ControlPlane:
    url = os.environ["CONTROL_REDIS_URL"].rsplit("/", 1)[0] + f"/{DB}"
    return ControlPlane(url)


@pytest.fixture
def r(cp) -> redis.Redis:
    return cp.redis


def _agent() -> str:
    return f"ag-{uuid.uuid4().hex[:8]}"


def _queued(r: redis.Redis) -> int:
    return r.llen("turns")


def test_turn_id_of_another_agent_is_refused_and_nothing_is_overwritten(cp, r):
    victim, attacker = _agent(), _agent()
    turn_id = cp.enqueue({"agent_id": victim, "input": "the victim's secret plan"})
    before_items = cp.items(turn_id)
    before_hash = r.hgetall(f"turn:{{{turn_id}}}")
    queued = _queued(r)
    with pytest.raises(ControlPlaneError, match="already used by another agent") as exc:
        cp.enqueue({"agent_id": attacker, "input": "injected"}, turn_id=turn_id)
    assert "secret plan" not in str(exc.value)  # nothing of the victim's turn is exposed
    assert cp.items(turn_id) == before_items
    assert r.hgetall(f"turn:{{{turn_id}}}") == before_hash
    assert _queued(r) == queued  # no step enqueued for the attacker
    assert cp.store.agent_turns(attacker) == []


def test_same_agent_same_turn_id_is_idempotent(cp, r):
    agent = _agent()
    turn_id = f"t-{uuid.uuid4().hex}"
    queued = _queued(r)
    assert cp.enqueue({"agent_id": agent, "input": "first"}, turn_id=turn_id) == turn_id
    assert cp.enqueue({"agent_id": agent, "input": "second"}, turn_id=turn_id) == turn_id
    assert _queued(r) == queued + 1  # enqueued once
    items = cp.items(turn_id)
    assert len(items) == 1 and "first" in orjson.dumps(items).decode()
    assert cp.store.agent_turns(agent) == [turn_id]


def test_idempotency_keys_are_scoped_per_agent(cp, r):
    a, b = _agent(), _agent()
    key = f"k-{uuid.uuid4().hex[:6]}"
    ta = cp.enqueue({"agent_id": a, "input": "from a", "idempotency_key": key})
    tb = cp.enqueue({"agent_id": b, "input": "from b", "idempotency_key": key})
    assert ta != tb
    assert "from b" in orjson.dumps(cp.items(tb)).decode() and "from a" not in orjson.dumps(cp.items(tb)).decode()
    assert cp.enqueue({"agent_id": a, "input": "again", "idempotency_key": key}) == ta
    assert cp.enqueue({"agent_id": b, "input": "again", "idempotency_key": key}) == tb


def test_input_over_the_size_cap_is_refused_and_nothing_is_stored(cp, r):
    agent = _agent()
    queued = _queued(r)
    keys_before = r.dbsize()
    with pytest.raises(ControlPlaneError, match="AGENT_MAX_INPUT_BYTES"):
        cp.enqueue({"agent_id": agent, "input": "x" * 1_000_001})
    # The cap counts the serialized request: a big list input or big instructions too.
    with pytest.raises(ControlPlaneError, match="the limit is 1,000,000"):
        cp.enqueue({"agent_id": agent, "input": [{"role": "user", "content": "y" * 600_000}] * 2})
    with pytest.raises(ControlPlaneError, match="AGENT_MAX_INPUT_BYTES"):
        cp.enqueue({"agent_id": agent, "input": "hi", "instructions": "z" * 1_000_001})
    assert _queued(r) == queued and r.dbsize() == keys_before
    assert cp.store.agent_turns(agent) == []
    # Just under the cap is fine.
    turn_id = cp.enqueue({"agent_id": agent, "input": "x" * 900_000})
    assert cp.status(turn_id).status.value == "queued"


@pytest.mark.parametrize(
    "agent_id",
    ["alice\n", "alice\r", "\nalice", "../etc", ".hidden", "a/b", "a:b", "a b", "", "a" * 65, "é", "alice\x00"],
)
def test_agent_id_must_match_the_strict_pattern(cp, agent_id):
    with pytest.raises(ValidationError, match="agent_id"):
        TurnRequest.model_validate({"agent_id": agent_id, "input": "x"})
    with pytest.raises(ValidationError):
        cp.enqueue({"agent_id": agent_id, "input": "x"})


def test_agent_id_pattern_is_published_in_the_schema():
    schema = TurnRequest.model_json_schema()
    assert schema["properties"]["agent_id"]["pattern"] == ID_PATTERN
    TurnRequest.model_validate({"agent_id": "A" + "b" * 63, "input": "x"})
    TurnRequest.model_validate({"agent_id": "team-7.bot_1", "input": "x"})


@pytest.mark.parametrize("turn_id", ["t\n", "../t", "t:x", "t/x", "{t}", "t" * 65, "-t", "t x"])
def test_turn_id_must_match_the_strict_pattern(cp, r, turn_id):
    queued = _queued(r)
    with pytest.raises(ControlPlaneError, match="must match"):
        cp.enqueue({"agent_id": _agent(), "input": "x"}, turn_id=turn_id)
    assert _queued(r) == queued
