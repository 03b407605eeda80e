"""Guarded transitions and turn creation as Lua scripts (``worker.turn.guard``), against the
embedded Redis: a fenced-out transition writes nothing, an allowed one writes everything, long
argument lists survive Lua's unpack limit, creation refuses another agent's id and reuses keys."""

from __future__ import annotations

import uuid

import orjson
import pytest
import redis

from tests.support.turn_store import begin_tools
from worker.turn.dispatch import Plan
from worker.turn.guard import Writes
from worker.turn.keys import FINISHING_KEY, key
from worker.turn.moves import Moves
from worker.turn.request import TurnRefused, TurnStatus
from worker.turn.state import CallResult, StaleStep
from worker.turn.store import TurnStore


@pytest.fixture
def store(redis_url):
    return TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)


def _new(store: TurnStore, agent: str = "guard-a", items: list | None = None, **kw) -> str:
    tid = uuid.uuid4().hex
    got, created = store.create(tid, {"agent_id": agent, "input": "x"}, items or [], **kw)
    assert created and got == tid
    return tid


def _snapshot(store: TurnStore, tid: str) -> tuple:
    r = store._r
    return (
        r.hgetall(key(tid)),
        r.lrange(key(tid, "items"), 0, -1),
        r.xlen(key(tid, "events")),
        r.zscore("turns:watch", tid),
        r.exists(key(tid, "plan", 0)),
    )


def test_stale_step_or_phase_writes_nothing(store):
    tid = _new(store)
    before = _snapshot(store, tid)
    with pytest.raises(StaleStep, match="turn is at step 0/model, not 1/model"):
        begin_tools(store, tid, 1, [{"type": "message"}], Plan([], []), {}, {})
    with pytest.raises(StaleStep, match="turn is at step 0/model, not 0/tools"):
        store.moves.finish_tools(tid, 0, [{"type": "function_call_output"}])
    assert _snapshot(store, tid) == before


def test_ended_turn_is_fenced_out_and_unknown_turn_refused(store):
    tid = _new(store)
    store.moves.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done")
    before = _snapshot(store, tid)
    with pytest.raises(StaleStep, match="turn is completed"):
        store.moves.end_at_model_step(tid, 0, [{"type": "message"}], TurnStatus.failed, error="again")
    assert _snapshot(store, tid) == before
    with pytest.raises(StaleStep, match="does not exist"):
        store.moves.mark_running(uuid.uuid4().hex, 0)


def test_allowed_transition_writes_everything_once(store):
    tid = _new(store)
    begin_tools(
        store, tid, 0, [{"type": "message", "n": 1}], Plan([], []), {}, {"t": 1}, events=[("call_planned", {"x": 1})]
    )
    st = store.load(tid)
    assert (st.step, st.phase, st.model_calls, st.invalid_counts) == (0, "tools", 1, {"t": 1})
    assert store.items(tid)[-1] == {"type": "message", "n": 1}
    assert [e["kind"] for _, e in store.events(tid)] == ["turn_queued", "call_planned"]
    store.moves.finish_tools(tid, 0, [{"type": "function_call_output", "call_id": "c"}])
    st = store.load(tid)
    assert (st.step, st.phase, st.model_calls) == (1, "model", 1)


def test_mark_running_only_moves_a_queued_turn(store):
    tid = _new(store)
    store.moves.mark_running(tid, 0, event={"agent_id": "guard-a"})
    store.moves.mark_running(tid, 0, event={"agent_id": "guard-a"})  # already running: no second event
    assert store.load(tid).status == TurnStatus.running
    assert [e["kind"] for _, e in store.events(tid)].count("turn_started") == 1


def test_end_hooks_are_scheduled_only_for_turns_that_have_them(store):
    plain = _new(store)
    assert store.moves.end_at_model_step(plain, 0, [], TurnStatus.completed) is False
    assert store._r.zscore(FINISHING_KEY, plain) is None
    hooked = uuid.uuid4().hex
    store.create(hooked, {"agent_id": "guard-h", "input": "x", "metadata": {"background_job_id": "j1"}}, [])
    assert store.moves.end_at_model_step(hooked, 0, [], TurnStatus.completed) is True
    assert store._r.zscore(FINISHING_KEY, hooked) is not None
    assert store._r.zscore("turns:watch", hooked) is None


def test_long_argument_lists_pass_luas_unpack_limit(store):
    # Lua's unpack stops at a few thousand values: 20,000 items must still all be written.
    items = [{"type": "message", "i": i} for i in range(20_000)]
    tid = _new(store, items=items)
    assert len(store.items(tid)) == 20_000
    results = {f"c{i}": CallResult("x") for i in range(6_000)}
    begin_tools(store, tid, 0, items, Plan([], []), results, {})
    assert len(store.items(tid)) == 40_000
    assert store._r.hlen(key(tid, "results", 0)) == 6_000
    assert store.items(tid)[-1] == {"type": "message", "i": 19_999}


def test_writes_refuse_commands_that_are_not_single_key_writes():
    w = Writes()
    w.rpush("k", "a").hset("h", mapping={"f": "v"})
    assert w.recorded == [("RPUSH", "k", "a"), ("HSET", "h", "f", "v")]
    for bad in (lambda: w.get("k"), lambda: w.rename("a", "b"), lambda: w.flushall()):
        with pytest.raises(ValueError, match="single-key writes only"):
            bad()


def test_create_refuses_another_agents_id_and_reuses_ids_and_keys(store):
    tid = _new(store, agent="guard-owner", idempotency_key="k1")
    with pytest.raises(TurnRefused, match="another agent"):
        store.create(tid, {"agent_id": "guard-other", "input": "x"}, [])
    assert store.load(tid).agent_id == "guard-owner"
    assert store.create(tid, {"agent_id": "guard-owner", "input": "y"}, []) == (tid, False)
    again = store.create(uuid.uuid4().hex, {"agent_id": "guard-owner", "input": "z"}, [], idempotency_key="k1")
    assert again == (tid, False)
    # Keys are per agent: another agent's k1 is a new turn.
    other, created = store.create(uuid.uuid4().hex, {"agent_id": "guard-other", "input": "x"}, [], idempotency_key="k1")
    assert created and other != tid
    st = store.load(tid)
    assert (st.status, st.step, st.phase, orjson.loads(store._r.hget(key(tid), "request"))["input"]) == (
        TurnStatus.queued,
        0,
        "model",
        "x",
    )
    assert [e["kind"] for _, e in store.events(tid)] == ["turn_queued"]


def test_writes_too_long_to_unpack_are_refused_before_anything_runs(store):
    tid = _new(store)
    before = _snapshot(store, tid)

    def w(pipe: Writes) -> None:
        pipe.rpush(key(tid, "items"), "x")
        pipe.xadd(key(tid, "events"), {f"f{i}": "v" for i in range(5_000)})  # one entry: cannot be split

    with pytest.raises(ValueError, match="XADD with 10001 arguments is too long"):
        store.moves._guarded(tid, 0, "model", w)
    assert _snapshot(store, tid) == before
    with pytest.raises(ValueError, match="DEL of several keys"):
        Writes().delete("a", "b")
    # Lists of values are split: 9,000 set members all arrive, in one guarded transition.
    store.moves._guarded(tid, 0, "model", lambda pipe: pipe.sadd(key(tid, "scratch"), *range(9_000)))
    assert store._r.scard(key(tid, "scratch")) == 9_000


def test_fail_reports_false_when_another_transition_ended_the_turn_first(redis_url):
    # fail() is a WATCH transaction: when complete() ends the turn between fail's read and its EXEC,
    # redis-py runs fail's callback again, which must then report that fail did not end the turn.
    other = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)

    class Racy(Moves):
        fired = False

        def _touch(self, pipe, turn_id, fields, **kw):
            if not Racy.fired and fields.get("status") == TurnStatus.cancelled.value:
                Racy.fired = True
                other.moves.end_at_model_step(
                    turn_id, 0, [], TurnStatus.completed, final_output="done"
                )  # lands before EXEC
            return super()._touch(pipe, turn_id, fields, **kw)

    client = redis.Redis.from_url(redis_url)
    racy = TurnStore(client, progress_timeout=60)
    racy.moves = Racy(client, progress_timeout=60)
    tid = _new(racy, agent="guard-f")
    assert racy.moves.fail(tid, TurnStatus.cancelled, "cancelled") is False
    assert racy.load(tid).status == TurnStatus.completed
    assert not racy._r.exists(key(tid, "cancel"))  # the aborted attempt wrote nothing


def test_turn_started_event_keeps_its_shape_for_any_agent_id(store):
    for agent in ('q"uo\\te', "ü-日本", "a"):
        tid = uuid.uuid4().hex
        store.create(tid, {"agent_id": agent, "input": "x"}, [])
        view = store.claims.begin_step(tid, 0, "owner-1", 30, "agent:node:test:tasks")
        assert view.claim.tried and view.claim.holder is None and view.claim.started
        assert view.state.status == TurnStatus.running
        started = [e for _, e in store.events(tid) if e["kind"] == "turn_started"]
        assert len(started) == 1 and set(started[0]) == {"kind", "at", "agent_id"}
        assert started[0]["agent_id"] == agent and isinstance(started[0]["at"], float)
        # A second delivery sees the claim held by the first owner and starts nothing.
        again = store.claims.begin_step(tid, 0, "owner-2", 30, "agent:node:test:tasks")
        assert again.claim.tried and again.claim.holder == "owner-1" and not again.claim.started
