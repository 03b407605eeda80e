"""Attacks on the merged round trips (``Claims.begin_call``, ``Barrier.record_and_check`` with a
step's closing writes, ``TurnStore.memo.save_and_check`` with the move to the tools phase, the
held records of ``tasks.broker.QoS.append``, ``ResponsesStream``'s skipped events and
``define_worker_tool``'s per-process check), against the embedded Redis: each test states a safety
property (at most once, fencing, first reply wins, the consumer survives) and fails if it breaks."""

from __future__ import annotations

import base64
import json
import socket
import threading
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import orjson
import pytest
import redis
from pydantic import BaseModel

from tests.integration.conftest import broker_app
from tests.support.turn_store import begin_tools, call_view
from worker.model.interface import GatewayError
from worker.turn.barrier import CLOSED
from worker.turn.dispatch import Batch, Plan, PlannedCall
from worker.turn.durability import ReplicaAck
from worker.turn.keys import key
from worker.turn.request import TurnStatus
from worker.turn.state import AdvanceView, CallResult
from worker.turn.store import TurnStore
from worker.turn.usage import UsageLedger

TERMINAL = [s for s in TurnStatus if s.terminal]


@pytest.fixture
def store(redis_url):
    return TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)


def _turn_at_tools(store: TurnStore, calls: list[PlannedCall], step: int = 0) -> str:
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "attack-a", "input": "x"}, [])
    if step:
        store._r.hset(key(tid), mapping={"step": step})
    plan = Plan(calls, [Batch("parallel", [c.call_id for c in calls if c.runnable])])
    begin_tools(store, tid, step, [{"type": "function_call", "call_id": c.call_id} for c in calls], plan, {}, {})
    return tid


def _events(store: TurnStore, tid: str, kind: str | None = None) -> list[dict]:
    out = []
    for _, fields in store._r.xrange(key(tid, "events")):
        event = orjson.loads(fields[b"e"])
        if kind is None or event["kind"] == kind:
            out.append(event)
    return out


# ----- begin_call: at most one claim, never for a gated or computer call -------------------------
def test_only_the_plain_calls_of_a_mixed_plan_are_claimed_by_their_read(store):
    calls = [
        PlannedCall("plain", "read_thing", 0, data={}),
        PlannedCall("gated", "write_thing", 1, data={}, needs_approval=True),
        PlannedCall("home", "shell", 2, data={}, computer=True),
        PlannedCall("both", "shell", 3, data={}, computer=True, needs_approval=True),
    ]
    tid = _turn_at_tools(store, calls)
    claimed = {c.call_id: call_view(store, tid, 0, c.call_id, "owner-a", 60).claim.won for c in calls}
    assert claimed == {"plain": True, "gated": False, "home": False, "both": False}
    assert set(store._r.hkeys(key(tid, "claims", 0))) == {b"plain"}
    assert [e["call_id"] for e in _events(store, tid, "call_started")] == ["plain"]


def test_a_duplicated_call_id_that_needs_approval_is_never_claimed_by_its_read(store):
    """Two planned calls share a call_id, the first gated: the runner reads ``plan.call`` (the
    first, gated one), so the read must not claim that id for an immediate run."""
    calls = [
        PlannedCall("dup", "write_thing", 0, data={}, needs_approval=True),
        PlannedCall("dup", "read_thing", 1, data={}),
    ]
    tid = _turn_at_tools(store, calls)
    view = call_view(store, tid, 0, "dup", "owner-a", 60)
    assert view.plan is not None and view.plan.call("dup").needs_approval
    assert not view.claim.won
    assert not store._r.hexists(key(tid, "claims", 0), "dup")
    assert _events(store, tid, "call_started") == []


@pytest.mark.parametrize(
    "call_id", ['c"1', 'call_{"a": 1}', "c\\1", "ç-✓-💥", "c\n1", "','); redis.call('DEL','x') --"]
)
def test_hostile_call_ids_are_claimed_once_with_a_well_formed_event(store, call_id):
    tid = _turn_at_tools(store, [PlannedCall(call_id, "read_thing", 0, data={}, activity='Rea"ding ✓')])
    assert call_view(store, tid, 0, call_id, "owner-a", 60).claim.won
    again = call_view(store, tid, 0, call_id, "owner-b", 60)
    assert again.claim.tried and not again.claim.won and again.claim.existing["owner"] == "owner-a"
    [started] = _events(store, tid, "call_started")  # parses as JSON: the spliced event is whole
    assert (started["call_id"], started["name"], started["activity"], started["step"]) == (
        call_id,
        "read_thing",
        'Rea"ding ✓',
        0,
    )


def test_a_call_is_claimed_by_its_read_only_when_its_message_says_so_and_its_plan_is_there(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    started = store.plan(tid, 0).started_at_once()["c1"]
    assert not store._r.exists(key(tid, "start", 0))  # carried by the message, not stored
    assert not store.call_view(tid, 0, "c1", "owner-a", 60, "").claim.tried  # the message says no
    assert not store.call_view(tid, 0, "c1", "owner-a", 60).claim.tried  # says nothing, no old start hash
    tid2 = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.delete(key(tid2, "plan", 0))  # the message says yes, but there is no plan
    store._r.hdel(key(tid2), "plan", "plan_step")  # (a layout-2 turn keeps it in its hash)
    fresh = TurnStore(store._r, progress_timeout=60)  # no plan cached in this process
    view2 = fresh.call_view(tid2, 0, "c1", "owner-a", 60, started)
    assert view2.plan is None and not view2.claim.tried
    assert not store._r.exists(key(tid, "claims", 0)) and not store._r.exists(key(tid2, "claims", 0))
    assert _events(store, tid, "call_started") == [] and _events(store, tid2, "call_started") == []


def test_a_destructive_call_is_claimed_at_once_only_by_a_worker_without_replicas_to_wait_for(store):
    """The message marks a destructive call (``!``); the receiving worker decides, whatever the
    sender's settings (a control plane releasing a batch may have none)."""
    tid = _turn_at_tools(store, [PlannedCall("d1", "delete_thing", 0, data={}, destructive=True)])
    started = store.plan(tid, 0).started_at_once()["d1"]
    assert started.startswith("!,")
    fenced = TurnStore(store._r, progress_timeout=60, durability=ReplicaAck(1, 0.1))
    assert not fenced.call_view(tid, 0, "d1", "owner-a", 60, started).claim.tried  # claimed, then WAIT
    assert store.call_view(tid, 0, "d1", "owner-a", 60, started).claim.won  # no replica configured
    [event] = _events(store, tid, "call_started")
    assert event["name"] == "delete_thing"


def test_a_message_from_before_the_cut_is_claimed_by_the_old_writers_start_hash(store):
    """A turn in flight across the upgrade: its plan's step wrote ``start:{n}`` (an earlier
    version) and its call's message carries nothing: the read claims it as that version did."""
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={}, activity="Reading")])
    store._r.hset(key(tid, "start", 0), "c1", b',"name":"read_thing","activity":"Reading"}')
    view = store.call_view(tid, 0, "c1", "owner-a", 60)  # no header
    assert view.claim.won
    [started] = _events(store, tid, "call_started")
    assert (started["name"], started["activity"]) == ("read_thing", "Reading")
    # and a message that says no is never claimed by an old start hash
    tid2 = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid2, "start", 0), "c1", b',"name":"read_thing","activity":""}')
    assert not store.call_view(tid2, 0, "c1", "owner-a", 60, "").claim.tried


@pytest.mark.parametrize("status", TERMINAL)
def test_an_ended_turn_is_never_claimed_by_a_read(store, status):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid), "status", status.value)
    assert not call_view(store, tid, 0, "c1", "owner-a", 60).claim.tried
    assert not store._r.exists(key(tid, "claims", 0))


def test_a_turn_moved_to_another_step_or_phase_is_not_claimed(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid), "phase", "model")
    assert not call_view(store, tid, 0, "c1", "o", 60).claim.tried
    store._r.hset(key(tid), mapping={"phase": "tools", "step": 1})
    assert not call_view(store, tid, 0, "c1", "o", 60).claim.tried
    assert not store._r.exists(key(tid, "claims", 0))


def test_racing_owners_claim_a_call_exactly_once(store, redis_url):
    tid = _turn_at_tools(store, [PlannedCall("c1", "delete_thing", 0, data={}, destructive=True)])
    wins: list[str] = []
    barrier = threading.Barrier(8)

    def race(i: int) -> None:
        mine = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)
        barrier.wait()
        if call_view(mine, tid, 0, "c1", f"owner-{i}", 60).claim.won:
            wins.append(f"owner-{i}")

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(wins) == 1
    assert orjson.loads(store._r.hget(key(tid, "claims", 0), "c1"))["owner"] == wins[0]
    assert len(_events(store, tid, "call_started")) == 1


# ----- record_and_check: the closing writes are fenced -------------------------------------------
def _closing(store: TurnStore, tid: str, output: str = "out", step: int = 0):
    return store.moves.next_step_writes(
        tid, step, [{"type": "function_call_output", "call_id": "c1", "output": output}]
    )


@pytest.mark.parametrize("status", TERMINAL)
def test_closing_writes_never_apply_to_an_ended_turn(store, status):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid), "status", status.value)
    items = store._r.llen(key(tid, "items"))
    stored, view = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=_closing(store, tid)
    )
    assert stored and view is not CLOSED and isinstance(view, AdvanceView)
    state = store.load(tid)
    assert (state.status, state.step, state.phase) == (status, 0, "tools")
    assert store._r.llen(key(tid, "items")) == items


@pytest.mark.parametrize("moved", [{"phase": "model"}, {"step": 1}, {"step": 1, "phase": "model"}])
def test_closing_writes_never_apply_to_a_turn_at_another_step_or_phase(store, moved):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid), mapping=moved)
    items = store._r.llen(key(tid, "items"))
    _, view = store.barrier.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=_closing(store, tid))
    assert view is not CLOSED
    state = store.load(tid)
    assert (state.step, state.phase) == (moved.get("step", 0), moved.get("phase", "tools"))
    assert store._r.llen(key(tid, "items")) == items


def test_a_late_result_after_the_slow_path_never_closes_the_step_again(store):
    """The first result met a cancel flag (the winner closes the long way); a duplicate that comes
    after the flag is gone (a new turn state, a cleared flag) must not apply its closing writes."""
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store.request_cancel(tid)
    _, first = store.barrier.record_and_check(tid, 0, "c1", CallResult("a"), 0, ["c1"], closing=_closing(store, tid))
    assert isinstance(first, AdvanceView)
    store._r.delete(key(tid, "cancel"))
    items = store._r.llen(key(tid, "items"))
    stored, again = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("b"), 0, ["c1"], closing=_closing(store, tid, "b")
    )
    assert (stored, again) == (False, None)
    assert store._r.llen(key(tid, "items")) == items and store.load(tid).step == 0
    assert store.results(tid, 0)["c1"].output == "a"


def test_concurrent_duplicate_results_close_a_one_call_step_once(store, redis_url):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    items = store._r.llen(key(tid, "items"))
    outcomes: list = []
    barrier = threading.Barrier(6)

    def record(i: int) -> None:
        mine = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)
        closing = _closing(mine, tid, f"out-{i}")
        barrier.wait()
        outcomes.append(mine.barrier.record_and_check(tid, 0, "c1", CallResult(f"out-{i}"), 0, ["c1"], closing=closing))

    threads = [threading.Thread(target=record, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for stored, _ in outcomes if stored) == 1
    assert [v for _, v in outcomes if v is not None] == [CLOSED]
    assert store._r.llen(key(tid, "items")) == items + 1  # one output appended, once
    state = store.load(tid)
    assert (state.step, state.phase) == (1, "model")
    last = orjson.loads(store._r.lrange(key(tid, "items"), -1, -1)[0])
    kept = store.results(tid, 0)
    # the output appended is the closing result's, not a loser's (a layout-2 one-call step keeps none)
    assert kept == {} and last["output"] in {f"out-{i}" for i in range(6)}
    assert len(_events(store, tid, "call_completed")) <= 1


def test_a_two_call_step_given_closing_writes_does_not_close_before_every_result(store):
    calls = [PlannedCall(c, "read_thing", i, data={}) for i, c in enumerate(("c1", "c2"))]
    tid = _turn_at_tools(store, calls)
    first = store.barrier.record_and_check(tid, 0, "c1", CallResult("a"), 0, ["c1", "c2"], closing=_closing(store, tid))
    assert first == (True, None)
    assert (store.load(tid).step, store.load(tid).phase) == (0, "tools")


# ----- memo.save_and_check: the first reply wins, the move happens once ----------------------------
def _turn_at_model(store: TurnStore) -> str:
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "attack-a", "input": "x"}, [])
    return tid


def _layout(store: TurnStore, tid: str) -> int:
    state = store.load(tid)
    return state.layout if state is not None else 1


def _move(store: TurnStore, tid: str, call_id: str = "c1", tokens: int = 3):
    plan = Plan([PlannedCall(call_id, "read_thing", 0, data={})], [Batch("parallel", [call_id])])
    items = [{"type": "function_call", "call_id": call_id}]
    layout = _layout(store, tid)
    usage = UsageLedger.row(0, {"input_tokens": tokens}, "m", layout=2) if layout == 2 else None
    return store.moves.begin_tools_writes(tid, 0, items, plan, {}, {}, events=[("call_planned", {"call_id": call_id})],
                                    usage=usage, layout=layout)  # fmt: skip


def _save(store: TurnStore, tid: str, reply: dict, then=None, deltas=(), tokens: int = 3):
    usage = UsageLedger.row(0, {"input_tokens": tokens}, "m", layout=_layout(store, tid))
    return store.memo.save_and_check(tid, 0, reply, {"step": 0}, usage, deltas, then=then)


@pytest.mark.parametrize("layout", [1, 2])
def test_a_second_delivery_with_its_own_move_neither_overwrites_nor_moves_twice(store, monkeypatch, layout):
    monkeypatch.setenv("AGENT_TURN_LAYOUT", str(layout))
    tid = _turn_at_model(store)
    first = _save(store, tid, {"id": "first"}, then=_move(store, tid, "c1", tokens=3), tokens=3)
    assert first.began
    items = store._r.llen(key(tid, "items"))
    calls = store._r.hget(key(tid), "model_calls")
    second = _save(store, tid, {"id": "second"}, then=_move(store, tid, "c2", tokens=99), tokens=99)
    assert not second.began
    if layout == 1:  # the first reply's memo answers the second
        assert second.reply == {"id": "first"}
        assert orjson.loads(store._r.get(key(tid, "reply", 0))) == {"id": "first"}
        assert [orjson.loads(v)["input_tokens"] for v in store._r.hvals(key(tid, "usage"))] == [3]
    else:  # the first moved the turn on: the second keeps nothing (its own move is then fenced out)
        assert not second.usage[0] and not store._r.exists(key(tid, "reply", 0))
        assert store.usage.totals(tid)["input_tokens"] == 3 and store.usage.totals(tid)["model_calls"] == 1
    assert store.plan(tid, 0).call("c1") is not None and store.plan(tid, 0).call("c2") is None
    assert store._r.llen(key(tid, "items")) == items and store._r.hget(key(tid), "model_calls") == calls
    assert len(_events(store, tid, "call_planned")) == 1


@pytest.mark.parametrize("status", TERMINAL)
def test_the_move_never_applies_to_an_ended_turn(store, status):
    tid = _turn_at_model(store)
    store._r.hset(key(tid), "status", status.value)
    saved = _save(store, tid, {"id": "r"}, then=_move(store, tid))
    assert not saved.began
    assert store.load(tid).phase == "model" and store.plan(tid, 0) is None


def test_the_move_never_applies_to_a_turn_at_another_step(store):
    tid = _turn_at_model(store)
    store._r.hset(key(tid), "step", 1)
    saved = _save(store, tid, {"id": "r"}, then=_move(store, tid))
    assert not saved.began and store._r.get(key(tid, "plan", 0)) is None


def test_deltas_come_before_the_reply_in_order_with_contiguous_seq(store):
    tid = _turn_at_model(store)
    deltas = [("model_delta", {"step": 0, "seq": i, "delta": str(i)}) for i in range(5)]
    _save(store, tid, {"id": "r"}, then=_move(store, tid), deltas=deltas)
    kinds = [e["kind"] for e in _events(store, tid)]
    last_delta = max(i for i, k in enumerate(kinds) if k == "model_delta")
    assert last_delta < kinds.index("model_reply")
    assert [e["seq"] for e in _events(store, tid, "model_delta")] == list(range(5))


def test_streamed_and_handed_over_deltas_are_contiguous():
    """``stream_reply_async(rest=...)``: what was published and what is handed to the caller form
    one run of seq numbers, text in order, none twice."""
    import asyncio

    from worker.model.interface import Delta
    from worker.model.streaming import stream_reply_async

    class Reply:
        id = "r"

    async def stream(_request, on_delta):
        for ch in "abcdefg":
            on_delta(Delta("text", 0, ch))
            await asyncio.sleep(0)
        return Reply()

    published: list = []
    rest: list = []

    def schedule(delay, callback):
        return asyncio.get_running_loop().call_soon(callback).cancel  # flush as often as possible

    asyncio.run(stream_reply_async(stream, None, published.extend, step=0, interval=0.0, schedule=schedule, rest=rest))
    events = [e for _, e in published] + [e for _, e in rest]
    assert [e["seq"] for e in events] == list(range(len(events)))
    assert "".join(e["delta"] for e in events) == "abcdefg"


# ----- held records: the consumer survives anything on the queue ---------------------------------
# ``held`` (tests/conftest.py): a node's held hash, recorded at fetch for tool_call.


@contextmanager
def _consuming(app, queue: str) -> Iterator[tuple[Any, list]]:
    """A consumer on ``queue`` through kombu's own path (``drain_events``: ``Transport._deliver``,
    then ``QoS.append``); yields the connection and the list of messages delivered so far."""
    from kombu import Consumer, Queue

    got: list = []
    with app.connection_for_read() as conn:
        with Consumer(conn, [Queue(queue)], callbacks=[lambda body, m: got.append(m)], accept=None):
            yield conn, got


def _drain(conn, timeout: float) -> None:
    """One ``drain_events``, which must not raise out of the consumer loop; a quiet queue is fine."""
    try:
        conn.drain_events(timeout=timeout)
    except socket.timeout:
        pass  # nothing delivered: the transport's shape check dropped it


def _tampered_fetch(redis_url: str, tamper) -> tuple[object, redis.Redis]:
    """Publish a turn task, rewrite its queued payload with ``tamper``, fetch it as a worker does."""
    app = broker_app(redis_url)
    queue = f"attack-held-{uuid.uuid4().hex[:8]}"
    app.send_task("tasks.turns.tool_call", ("turn-x", 0, "c1"), queue=queue)
    r = redis.Redis.from_url(redis_url)
    payload = json.loads(r.lindex(queue, 0))
    tamper(payload)
    r.lset(queue, 0, json.dumps(payload))
    return app, queue


def _no_id(p):
    p["headers"].pop("id", None)


def _null_headers(p):
    p["headers"]["id"] = None


def _not_base64(p):
    p["body"] = "%%% not base64 %%%"


def _not_json(p):
    p["body"] = base64.b64encode(b"{not json").decode()


def _args_not_a_list(p):
    p["body"] = base64.b64encode(json.dumps({"a": 1}).encode()).decode()


def _empty_args(p):
    p["body"] = base64.b64encode(json.dumps([[], {}, {}]).encode()).decode()


def _typed_and_malformed(p):
    p["headers"]["x-sent-at"] = {"__type__": "datetime", "__value__": "2026-12-03T05:00:00"}
    p["properties"]["body_encoding"] = "rot13"  # dropped by the shape check, which logs its size


def _list_headers(p):
    p["headers"] = ["tasks.turns.tool_call"]


def _string_headers(p):
    p["headers"] = "tasks.turns.tool_call"


@pytest.mark.parametrize(
    "tamper",
    [
        _no_id,
        _null_headers,
        _not_base64,
        _not_json,
        _args_not_a_list,
        _empty_args,
        _list_headers,
        _string_headers,
        _typed_and_malformed,
    ],
)
def test_a_malformed_turn_message_is_fetched_without_a_held_record(redis_url, held, tamper):
    """Through the consumer's own path: a bad message is dropped or delivered, never raises,
    never leaves a held record; the good message after it is consumed and recorded."""
    app, queue = _tampered_fetch(redis_url, tamper)
    r = redis.Redis.from_url(redis_url)
    with _consuming(app, queue) as (conn, got):
        _drain(conn, 2)
        assert r.hlen(held) == 0
        for m in got:
            m.ack()
        bad = len(got)
        app.send_task("tasks.turns.tool_call", ("turn-ok", 0, "c1"), queue=queue)
        conn.drain_events(timeout=5)
        assert len(got) == bad + 1
        assert r.hget(held, got[-1].headers["id"]) == b"turn-ok"
        got[-1].ack()


def _typed_header(p):
    # kombu's JSON decodes such a marker to a datetime in the envelope (kombu.utils.json), which
    # kombu's own QoS.append re-encodes: a valid message, delivered by stock kombu.
    p["headers"]["x-sent-at"] = {"__type__": "datetime", "__value__": "2026-12-03T05:00:00"}


def test_a_turn_message_with_a_kombu_typed_header_is_delivered_and_held(redis_url, held):
    app, queue = _tampered_fetch(redis_url, _typed_header)
    r = redis.Redis.from_url(redis_url)
    with _consuming(app, queue) as (conn, got):
        _drain(conn, 2)
        assert len(got) == 1, "a valid turn message was dropped"
        assert r.hget(held, got[0].headers["id"]) == b"turn-x"
        assert r.hexists("unacked", got[0].delivery_tag)
        got[0].ack()


# ----- skipped events: a stream still fails as retryable ------------------------------------------
def _stream():
    from worker.model.responses import ResponsesStream

    return ResponsesStream(lambda d: None)


def test_a_stream_of_only_skipped_events_fails_retryable():
    stream = _stream()
    for name in ("response.created", "response.in_progress", "response.output_item.done", "response.output_text.done"):
        assert stream.feed(name, "{garbage") is None
    with pytest.raises(GatewayError) as info:
        stream.end()
    assert info.value.retryable


@pytest.mark.parametrize("data", ["{not json", "[]", '{"type": "response.completed", "response": []}'])
def test_a_malformed_terminal_event_fails_retryable(data):
    with pytest.raises(GatewayError) as info:
        _stream().feed("response.completed", data)
    assert info.value.retryable


def test_a_malformed_delta_still_fails_retryable():
    with pytest.raises(GatewayError) as info:
        _stream().feed("response.function_call_arguments.delta", "{oops")
    assert info.value.retryable


# ----- define_worker_tool: checked once, but never caching a failure ---------------------------------
class _Params(BaseModel):
    x: int


def _define(name: str = "ok_tool", **kw):
    from worker.tooling.contract import define_worker_tool

    return define_worker_tool(name=name, description="d", input_model=_Params, execute=lambda p, c: "x", **kw)


@pytest.mark.parametrize("bad", [{"name": "bad name!"}, {"namespace": "bad ns!"}, {"description": ""}])
def test_an_invalid_definition_raises_every_time(bad):
    from worker.tooling.contract import define_worker_tool
    from worker.tooling.errors import ToolDefinitionError

    kw = {"name": "ok_tool", "description": "d", "input_model": _Params, "execute": lambda p, c: "x", **bad}
    for _ in range(3):
        with pytest.raises(ToolDefinitionError):
            define_worker_tool(**kw)


def test_a_valid_definition_then_an_invalid_variant_still_raises():
    from worker.tooling.errors import ToolDefinitionError

    _define("twice_tool")
    _define("twice_tool")
    with pytest.raises(ToolDefinitionError):
        _define("twice_tool", is_read_only=True, is_destructive=True)
    with pytest.raises(ToolDefinitionError):
        _define("twice_tool", execution_mode="both")


def test_changing_the_provider_checks_the_definition_again(monkeypatch):
    from worker.settings import get_settings
    from worker.tooling.errors import ToolDefinitionError

    monkeypatch.setenv("AGENT_MODEL_PROVIDER", "openai")
    get_settings.cache_clear()
    try:
        _define("strict_tool", strict=True)  # fine for OpenAI, and now cached as checked
        _define("strict_tool", strict=True)
        monkeypatch.setenv("AGENT_MODEL_PROVIDER", "gemini")
        get_settings.cache_clear()
        with pytest.raises(ToolDefinitionError, match="strict"):
            _define("strict_tool", strict=True)  # Gemini refuses strict tools (G4)
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


# ----- a vanished turn hash, a lost memo: nothing is recreated, nothing moves twice -------------------
def test_no_script_recreates_an_expired_turn_hash(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    closing = _closing(store, tid)
    store._r.delete(key(tid))  # the turn's hash expired (or was purged) meanwhile
    assert not call_view(store, tid, 0, "c1", "o", 60).claim.tried
    _, view = store.barrier.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=closing)
    assert view is not CLOSED and not store._r.exists(key(tid))
    model = _turn_at_model(store)
    move = _move(store, model)
    store._r.delete(key(model))
    assert not _save(store, model, {"id": "r"}, then=move).began
    assert not store._r.exists(key(model)) and store._r.get(key(model, "plan", 0)) is None


def test_a_lost_memo_never_moves_a_step_that_is_already_at_its_tools(store):
    tid = _turn_at_model(store)
    assert _save(store, tid, {"id": "first"}, then=_move(store, tid)).began
    items, calls = store._r.llen(key(tid, "items")), store._r.hget(key(tid), "model_calls")
    store._r.delete(key(tid, "reply", 0))  # the memo expired: the next delivery's SET NX wins
    again = _save(store, tid, {"id": "second"}, then=_move(store, tid, "c2"))
    assert not again.began
    assert store._r.llen(key(tid, "items")) == items and store._r.hget(key(tid), "model_calls") == calls
    assert store.plan(tid, 0).call("c2") is None


@pytest.mark.parametrize("layout", [1, 2])
def test_a_result_that_lost_the_store_never_closes_the_step_with_its_own_output(store, monkeypatch, layout):
    """The call's result is already stored (a pre-result, or any writer that did not pass the
    barrier): a later result with its closing writes loses the store, so the output it would
    append is not the stored one: the step must not be closed with it. (A layout-2 turn's writers
    of a one-call step's results name the step in the hash: the pre-result here is the plan's.)"""
    monkeypatch.setenv("AGENT_TURN_LAYOUT", str(layout))
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "attack-a", "input": "x"}, [])
    plan = Plan([PlannedCall("c1", "read_thing", 0, data={})], [Batch("parallel", ["c1"])])
    begin_tools(
        store, tid, 0, [{"type": "function_call", "call_id": "c1"}], plan, {"c1": CallResult("stored first")}, {}
    )
    stored, view = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("late"), 0, ["c1"], closing=_closing(store, tid, "late")
    )
    assert not stored
    outputs = [orjson.loads(x).get("output") for x in store._r.lrange(key(tid, "items"), 0, -1)]
    assert "late" not in outputs
    if view is CLOSED:  # pragma: no cover - the property above already failed
        pytest.fail("closed with the loser's output")
    assert isinstance(view, AdvanceView) and view.results["c1"].output == "stored first"
