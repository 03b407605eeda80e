"""A step's round trips, against the embedded Redis.

The model step's reply is stored with the step's move to its tools phase
(``ReplyMemo.save_and_check``), unless another delivery stored a reply first or the turn
was cancelled or moved on. On the tool path (``Claims.begin_call``, ``Barrier.record_and_check``
with a step's closing writes): a call that can run at once is claimed by its first read, with its
``call_started`` event; one that awaits an approval or the agent's computer is not; a one-call
step is closed by its result's round trip unless the turn was cancelled or moved on in between,
when the winner gets the batch's view and closes it the long way."""

from __future__ import annotations

import uuid

import orjson
import pytest
import redis

from tests.support.turn_store import begin_tools, call_view
from worker.turn.barrier import CLOSED
from worker.turn.dispatch import Batch, Plan, PlannedCall
from worker.turn.keys import key
from worker.turn.request import TurnStatus
from worker.turn.state import AdvanceView, CallResult
from worker.turn.store import TurnStore
from worker.turn.usage import UsageLedger


@pytest.fixture
def store(redis_url):
    return TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)


def _turn_at_tools(store: TurnStore, calls: list[PlannedCall]) -> str:
    """A turn at step 0's tools phase with ``calls`` planned in one parallel batch."""
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "trips-a", "input": "x"}, [])
    plan = Plan(calls, [Batch("parallel", [c.call_id for c in calls if c.runnable])])
    begin_tools(store, tid, 0, [{"type": "function_call", "call_id": c.call_id} for c in calls], plan, {}, {})
    return tid


def _events(store: TurnStore, tid: str, kind: str) -> list[dict]:
    out = []
    for _, fields in store._r.xrange(key(tid, "events")):
        event = orjson.loads(fields[b"e"])
        if event["kind"] == kind:
            out.append(event)
    return out


def test_a_plain_call_is_claimed_by_its_first_read(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={}, activity="Reading")])
    view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.state is not None and view.plan is not None and not view.has_result
    assert view.claim.tried and view.claim.won
    assert orjson.loads(store._r.hget(key(tid, "claims", 0), "c1"))["owner"] == "owner-a"
    [started] = _events(store, tid, "call_started")
    assert started == {**started, "step": 0, "call_id": "c1", "name": "read_thing", "activity": "Reading"}
    again = call_view(store, tid, 0, "c1", "owner-b", 60)  # a redelivery: held, not claimed twice
    assert again.claim.tried and not again.claim.won and again.claim.existing["owner"] == "owner-a"
    assert len(_events(store, tid, "call_started")) == 1


@pytest.mark.parametrize("flag", ["needs_approval", "computer"])
def test_a_gated_or_computer_call_is_not_claimed_by_its_read(store, flag):
    tid = _turn_at_tools(store, [PlannedCall("c1", "write_thing", 0, data={}, **{flag: True})])
    view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.plan is not None and not view.claim.tried
    assert not store._r.hexists(key(tid, "claims", 0), "c1")
    assert _events(store, tid, "call_started") == []


def test_no_claim_for_an_unknown_call_a_stale_step_or_a_call_with_a_result(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    assert not call_view(store, tid, 0, "nope", "o", 60).claim.tried
    assert not call_view(store, tid, 1, "c1", "o", 60).claim.tried  # another step
    assert call_view(store, tid, 0, "c1", "holder", 60).claim.won  # the result's holder claimed it first
    store.barrier.record_and_check(tid, 0, "c1", CallResult("done"), 0, ["c1"])
    view = call_view(store, tid, 0, "c1", "o", 60)  # a redelivery: the claim held, the result found
    assert view.has_result and not view.claim.won and view.claim.existing["owner"] == "holder"
    assert len(_events(store, tid, "call_started")) == 1


def _closing(store: TurnStore, tid: str, output: str = "out"):
    item = {"type": "function_call_output", "call_id": "c1", "output": output}
    return store.moves.next_step_writes(tid, 0, [item])


def test_a_one_call_step_is_closed_by_its_result(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    stored, view = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("out"), 0, ["c1"], {"call_id": "c1"}, closing=_closing(store, tid)
    )
    assert stored and view is CLOSED
    state = store.load(tid)
    assert (state.step, state.phase, state.status) == (1, "model", TurnStatus.queued)
    assert orjson.loads(store._r.lrange(key(tid, "items"), -1, -1)[0])["output"] == "out"
    # A redelivery of the same call only finds the barrier passed: nothing is written twice.
    items = store._r.llen(key(tid, "items"))
    again = store.barrier.record_and_check(tid, 0, "c1", CallResult("x"), 0, ["c1"], closing=_closing(store, tid, "x"))
    assert again == (False, None) and store._r.llen(key(tid, "items")) == items


def test_a_cancel_flag_set_before_the_result_leaves_the_closing_to_the_winner(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store.request_cancel(tid)
    stored, view = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("out"), 0, ["c1"], closing=_closing(store, tid)
    )
    assert stored and isinstance(view, AdvanceView) and view.cancelled
    assert view.results["c1"].output == "out"
    state = store.load(tid)
    assert (state.step, state.phase) == (0, "tools")  # not moved on: the long way ends it cancelled


def test_a_turn_that_moved_on_gets_no_closing_writes(store):
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    store._r.hset(key(tid), "status", TurnStatus.failed.value)  # ended meanwhile (e.g. by the watchdog)
    items = store._r.llen(key(tid, "items"))
    stored, view = store.barrier.record_and_check(
        tid, 0, "c1", CallResult("out"), 0, ["c1"], closing=_closing(store, tid)
    )
    assert stored and isinstance(view, AdvanceView)
    assert store._r.llen(key(tid, "items")) == items and store.load(tid).step == 0


def test_the_barrier_of_a_parallel_batch_still_waits_for_every_call(store):
    calls = [PlannedCall(c, "read_thing", i, data={}) for i, c in enumerate(("c1", "c2"))]
    tid = _turn_at_tools(store, calls)
    first = store.barrier.record_and_check(tid, 0, "c1", CallResult("a"), 0, ["c1", "c2"])
    assert first == (True, None)
    stored, view = store.barrier.record_and_check(tid, 0, "c2", CallResult("b"), 0, ["c1", "c2"])
    assert stored and isinstance(view, AdvanceView) and set(view.results) == {"c1", "c2"}
    assert store._r.zscore("turns:watch", tid) is not None  # the result pushed the progress deadline


# ----- the model step's reply and its move to the tools phase: one round trip ---------------------
def _turn_at_model(store: TurnStore) -> str:
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "trips-a", "input": "x"}, [])
    return tid


def _usage(store: TurnStore, tid: str, tokens: int = 3) -> tuple[str, bytes]:
    """Step 0's usage record in the turn's layout (its field, as a worker's step writes it)."""
    state = store.load(tid)
    layout = state.layout if state is not None else 1
    return UsageLedger.row(0, {"input_tokens": tokens}, "m", layout=layout)


def _move(store: TurnStore, tid: str):
    plan = Plan([PlannedCall("c1", "read_thing", 0, data={})], [Batch("parallel", ["c1"])])
    items = [{"type": "function_call", "call_id": "c1"}]
    state = store.load(tid)
    layout = state.layout if state is not None else 1
    return store.moves.begin_tools_writes(tid, 0, items, plan, {}, {}, events=[("call_planned", {"call_id": "c1"})],
                                    usage=_usage(store, tid) if layout == 2 else None, layout=layout)  # fmt: skip


def _save(store: TurnStore, tid: str, reply: dict, then=None, deltas=()):
    return store.memo.save_and_check(tid, 0, reply, {"step": 0}, _usage(store, tid), deltas, then=then)


@pytest.mark.parametrize("layout", [1, 2])
def test_a_reply_with_calls_moves_the_step_to_its_tools_with_it(store, monkeypatch, layout):
    monkeypatch.setenv("AGENT_TURN_LAYOUT", str(layout))
    tid = _turn_at_model(store)
    deltas = [("model_delta", {"step": 0, "seq": 0, "delta": "x"})]
    saved = _save(store, tid, {"id": "r1"}, then=_move(store, tid), deltas=deltas)
    assert saved.began and saved.reply == {"id": "r1"} and not saved.cancelled
    assert saved.usage == (True, [])  # recorded; the totals are not read for a turn that goes on
    state = store.load(tid)
    assert (state.step, state.phase) == (0, "tools") and store.plan(tid, 0).call("c1") is not None
    assert state.layout == layout
    if layout == 1:  # memoized, the usage in its hash, the plan in its key
        assert orjson.loads(store._r.get(key(tid, "reply", 0))) == {"id": "r1"}
        assert store._r.hlen(key(tid, "usage")) == 1 and store._r.exists(key(tid, "plan", 0))
    else:  # moved with it: no memo; the usage record and the plan are the move's hash fields
        assert not store._r.exists(key(tid, "reply", 0)) and store._r.hget(key(tid), "memo") is None
        assert orjson.loads(store._r.hget(key(tid), "usage:0"))["input_tokens"] == 3
        assert not store._r.exists(key(tid, "usage")) and not store._r.exists(key(tid, "plan", 0))
        assert store._r.hget(key(tid), "plan_step") == b"0"
    kinds = [orjson.loads(f[b"e"])["kind"] for _, f in store._r.xrange(key(tid, "events"))]
    assert kinds.index("model_delta") < kinds.index("model_reply") < kinds.index("call_planned")


def test_a_reply_stored_first_by_another_delivery_wins_and_nothing_moves(store):
    tid = _turn_at_model(store)
    assert not _save(store, tid, {"id": "first"}).began  # no move given: only the memo
    saved = _save(store, tid, {"id": "second"}, then=_move(store, tid))
    assert not saved.began and saved.reply == {"id": "first"}
    assert not saved.usage[0]  # the step's usage was recorded once
    assert store.load(tid).phase == "model"


def test_a_cancelled_or_moved_on_turn_does_not_move_to_its_tools(store):
    cancelled = _turn_at_model(store)
    store.request_cancel(cancelled)
    saved = _save(store, cancelled, {"id": "r"}, then=_move(store, cancelled))
    assert saved.cancelled and not saved.began and store.load(cancelled).phase == "model"
    ended = _turn_at_model(store)
    store._r.hset(key(ended), "status", TurnStatus.failed.value)
    saved = _save(store, ended, {"id": "r"}, then=_move(store, ended))
    assert not saved.began and store.plan(ended, 0) is None


# ----- the next message, sent by the script that decided it ----------------------------------------
def _message(qkey: str, channel: str, tag: str) -> list[tuple[str, str, bytes]]:
    """A queue message's commands as ``Dispatcher.step_message`` gives them (its payload: ``tag``)."""
    return [("LPUSH", qkey, f"message {tag}".encode()), ("PUBLISH", channel, f"sent {tag}".encode())]


@pytest.fixture
def queue(store):
    """A queue list and an event channel of this test's own (no worker consumes them), and what the
    channel received so far (``heard()``)."""
    qkey, channel = f"test-queue-{uuid.uuid4().hex}", f"test-events-{uuid.uuid4().hex}"
    sub = store._r.pubsub()
    sub.subscribe(channel)
    assert sub.get_message(timeout=5)["type"] == "subscribe"

    def heard() -> list[bytes]:
        out = []
        while (m := sub.get_message(timeout=0.2)) is not None:
            out.append(m["data"])
        return out

    yield qkey, channel, heard
    sub.close()
    store._r.delete(qkey)


def test_a_one_call_step_queues_its_next_step_in_its_closing_round_trip(store, queue):
    qkey, channel, heard = queue
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    writes = _closing(store, tid)
    writes.send_message(_message(qkey, channel, "step 1"))
    assert writes.sends_message
    stored, view = store.barrier.record_and_check(tid, 0, "c1", CallResult("out"), 0, ["c1"], closing=writes)
    assert stored and view is CLOSED and store.load(tid).step == 1
    assert store._r.lrange(qkey, 0, -1) == [b"message step 1"] and heard() == [b"sent step 1"]


@pytest.mark.parametrize("meanwhile", ["cancelled", "ended", "result stored by another delivery"])
def test_a_closing_that_does_not_apply_sends_no_message(store, queue, meanwhile):
    """The message goes only with the state change that decided it: a fenced closing sends none
    (the winner then closes the long way and sends it itself, once)."""
    qkey, channel, heard = queue
    tid = _turn_at_tools(store, [PlannedCall("c1", "read_thing", 0, data={})])
    if meanwhile == "cancelled":
        store.request_cancel(tid)
    elif meanwhile == "ended":
        store._r.hset(key(tid), "status", TurnStatus.failed.value)
    else:
        store.barrier.record_and_check(tid, 0, "c1", CallResult("first"), 0, ["c1"], closing=_closing(store, tid))
    writes = _closing(store, tid, "late")
    writes.send_message(_message(qkey, channel, "step 1"))
    _, view = store.barrier.record_and_check(tid, 0, "c1", CallResult("late"), 0, ["c1"], closing=writes)
    assert view is not CLOSED
    assert store._r.llen(qkey) == 0 and heard() == []


def test_a_reply_queues_its_first_batch_with_its_move_to_the_tools_phase(store, queue):
    qkey, channel, heard = queue
    tid = _turn_at_model(store)
    move = _move(store, tid)
    move.send_message(_message(qkey, channel, "c1"))
    assert _save(store, tid, {"id": "r1"}, then=move).began
    assert store.load(tid).phase == "tools"
    assert store._r.lrange(qkey, 0, -1) == [b"message c1"] and heard() == [b"sent c1"]
    # A later delivery of the same step stores nothing and queues nothing.
    again = _move(store, tid)
    again.send_message(_message(qkey, channel, "again"))
    assert not _save(store, tid, {"id": "r2"}, then=again).began
    assert store._r.llen(qkey) == 1 and heard() == []


def test_only_a_queue_message_and_its_event_can_ride_with_the_writes():
    from worker.turn.guard import Writes

    with pytest.raises(ValueError, match="not a queue message"):
        Writes().send_message([("DEL", "turns", b"")])
