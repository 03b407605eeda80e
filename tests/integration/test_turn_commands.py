"""The Redis commands a turn costs (issue 34), counted with ``INFO commandstats`` on a Redis of the
test's own (no worker, beat or other test sends anything to it, so every count is exact): a command a
Lua script runs counts as one, and so do ``MULTI`` and ``EXEC``.

- kombu's record of a fetched message and its ack (``tasks.broker.QoS``): a plain pipeline each, no
  transaction; a fetched message is still given back by kombu's restore (a dead worker's).
- The turn's scripts (``worker.turn.guard``, ``claims``, ``store``): the reads and writes each one
  does not need are gone (the fence's second read of the turn hash, the barrier's check of the
  caller's own result, the deadline an ending undoes, the list trim below its length, the
  ``model_calls`` increment, the cancel flag's second expiry).
- Layout 2 (the turn hash's ``layout`` mark, ``worker.turn.keys``): a reply's move (to the tools, or
  the turn's end) in the reply's own script and no memo then, the usage records and a step's plan
  as hash fields, a one-call step closed without keeping its result, a move that keeps a recent
  deadline; a turn without the mark keeps its keys.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import orjson
import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from tasks import broker
from tests.integration.conftest import broker_app
from tests.support.turn_store import begin_tools, call_view
from worker.turn.barrier import CLOSED
from worker.turn.dispatch import Batch, Plan, PlannedCall
from worker.turn.guard import PRUNE_EVERY, CreateScript
from worker.turn.keys import WATCH_KEY, index_key, key
from worker.turn.request import TurnStatus
from worker.turn.state import RETENTION_SECONDS, CallResult
from worker.turn.store import TurnStore
from worker.turn.usage import UsageLedger


@pytest.fixture(scope="module")
def own_redis() -> Iterator[str]:
    srv = EmbeddedRedis()
    srv.start()
    yield srv.url
    srv.stop()


@contextmanager
def _counted(r: redis.Redis) -> Iterator[dict[str, int]]:
    """Commands run inside, per name (lower case); the first ``INFO`` reading (counted in the second)
    is left out."""
    out: dict[str, int] = {}

    def read() -> dict[str, int]:
        return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in r.info("commandstats").items()}

    before = read()
    yield out
    after = read()
    after["info"] -= 1
    out.update({k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)})


def test_a_fetch_and_its_ack_cost_four_commands_and_no_transaction(own_redis):
    r = redis.Redis.from_url(own_redis)
    app = broker_app(own_redis)
    queue = f"cmds-{uuid.uuid4().hex[:8]}"
    app.send_task("tasks.health.ping", (), queue=queue)
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue)
        with _counted(r) as fetch:
            message = q.get(timeout=5)
        assert r.hexists("unacked", message.delivery_tag) and r.zscore("unacked_index", message.delivery_tag)
        with _counted(r) as ack:
            message.ack()
            assert r.hexists("unacked", message.delivery_tag)  # in the process's next batch
            broker.ACKS.flush()
    assert not r.hexists("unacked", message.delivery_tag) and r.zscore("unacked_index", message.delivery_tag) is None
    assert "multi" not in fetch and "exec" not in fetch and fetch["hset"] == 1 and fetch["zadd"] == 1
    assert ack == {"zrem": 1, "hdel": 1, "hexists": 1}


def test_acks_go_in_batches_of_one_zrem_and_one_hdel(own_redis):
    r = redis.Redis.from_url(own_redis)
    app = broker_app(own_redis)
    queue = f"cmds-{uuid.uuid4().hex[:8]}"
    for _ in range(10):
        app.send_task("tasks.health.ping", (), queue=queue)
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue)
        messages = [q.get(timeout=5) for _ in range(10)]
        assert r.hlen("unacked") >= 10
        with _counted(r) as acks:
            for m in messages:
                m.ack()
            deadline = time.monotonic() + 5  # the batch thread sends them within ACK_BATCH_DELAY
            while any(r.hexists("unacked", m.delivery_tag) for m in messages) and time.monotonic() < deadline:
                time.sleep(0.02)
    assert not any(r.hexists("unacked", m.delivery_tag) for m in messages)
    assert acks["zrem"] + acks["hdel"] <= 4, acks  # kombu: 10 of each, in 10 transactions


def test_a_fetched_message_is_still_given_back_by_kombus_restore(own_redis):
    r = redis.Redis.from_url(own_redis)
    app = broker_app(own_redis)
    queue = f"cmds-{uuid.uuid4().hex[:8]}"
    app.send_task("tasks.health.ping", ("back",), queue=queue)
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue(queue).get(timeout=5)
        assert r.llen(queue) == 0
        assert broker.restore(conn.default_channel, [message.delivery_tag]) == 1  # a dead worker's message
    assert r.llen(queue) == 1 and not r.hexists("unacked", message.delivery_tag)
    assert r.zscore("unacked_index", message.delivery_tag) is None


@pytest.fixture
def store(own_redis) -> TurnStore:
    return TurnStore(redis.Redis.from_url(own_redis), progress_timeout=60)


def _create(store: TurnStore, agent: str = "cmds-a") -> str:
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": agent, "input": "x"}, [])
    return tid


def test_a_creation_indexes_by_created_at_and_keeps_no_agent_list(store):
    agent = f"cmds-{uuid.uuid4().hex[:6]}"
    with _counted(store._r) as counted:
        tid = _create(store, agent)
    assert "ltrim" not in counted and "lpush" not in counted  # the agent's turns are its index
    assert counted["hget"] == 1  # the owner check only: created_at is an argument
    assert counted["expire"] == 1  # the agent's index; the index of every turn is the sweep's
    created = float(store._r.hget(key(tid), "created_at"))
    assert store._r.zscore(index_key(None), tid) == created and store._r.zscore(index_key(agent), tid) == created
    newest = _create(store, agent)
    assert store.agent_turns(agent) == [newest, tid] and store.agent_turns(agent, limit=1) == [newest]


def test_an_agents_index_is_pruned_at_one_creation_in_sixteen_and_every_turns_by_the_sweep(store):
    agent = f"cmds-{uuid.uuid4().hex[:6]}"
    kept = 2 * RETENTION_SECONDS
    ms = int(time.time() * 1000) // PRUNE_EVERY * PRUNE_EVERY

    def create(at_ms: int) -> dict[str, int]:
        tid, created = uuid.uuid4().hex, (at_ms + 0.5) / 1000  # the creation's milliseconds are at_ms
        keys = [key(tid), key(tid, "items"), WATCH_KEY, key(tid, "events"), index_key(None), index_key(agent)]
        fields = {"status": "queued", "step": 0, "phase": "model", "agent_id": agent, "created_at": created}
        keys, args = CreateScript.arguments(keys, agent, tid, fields, [], retention=RETENTION_SECONDS,
                                            deadline=created + 60, event=b"{}", events_maxlen=100)  # fmt: skip
        with _counted(store._r) as counted:
            assert store._create.run(tid, keys, args) == (tid, True)
        return counted

    old = time.time() - kept - 60
    store._r.zadd(index_key(agent), {"old-a": old})
    store._r.zadd(index_key(None), {"old-g": old})
    assert "zremrangebyscore" not in create(ms + 5)
    assert store._r.zscore(index_key(agent), "old-a") is not None
    assert create(ms + PRUNE_EVERY)["zremrangebyscore"] == 1
    assert store._r.zscore(index_key(agent), "old-a") is None
    assert store._r.zscore(index_key(None), "old-g") is not None  # not at a creation
    assert 0 < store._r.ttl(index_key(agent)) <= kept and store._r.ttl(index_key(None)) == -1
    assert store.listing.prune(every=0) >= 1
    assert store._r.zscore(index_key(None), "old-g") is None
    assert store.listing.prune() == 0  # at most once a minute per process


def _at_tools(store: TurnStore) -> str:
    tid = _create(store)
    call = PlannedCall("c1", "read_thing", 0, data={}, activity="Reading")
    plan = Plan([call], [Batch("parallel", ["c1"])])
    begin_tools(store, tid, 0, [{"type": "function_call", "call_id": "c1"}], plan, {}, {}, model_calls=1)
    return tid


def test_the_tool_path_reads_the_turn_once_and_checks_only_the_other_calls(store):
    tid = _at_tools(store)
    assert store._r.hget(key(tid), "model_calls") == b"1"  # set with the move, not incremented
    store.plan(tid, 0)  # what the call's message carries (read here, by the test, before counting)
    with _counted(store._r) as read:
        view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.claim.won
    assert "hmget" not in read and read["hgetall"] == 1  # the fence reads the hash the script read
    assert "exists" not in read  # the cancel flag is the hash's field
    assert "hget" not in read and not store._r.exists(key(tid, "start", 0))  # claimable: the message says
    closing = store.moves.next_step_writes(tid, 0, [{"type": "function_call_output", "call_id": "c1", "output": "o"}])
    with _counted(store._r) as recorded:
        stored, closed = store.barrier.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=closing)
    assert stored and closed is CLOSED
    assert "hexists" not in recorded  # the caller's own result was just stored
    assert "exists" not in recorded and recorded["hmget"] == 1  # the flag and the fence in one read
    assert "set" not in recorded and not store._r.exists(key(tid, "adv", 0, 0))  # closed with it: no barrier key
    again = store.barrier.record_and_check(tid, 0, "c1", CallResult("o2"), 0, ["c1"], closing=closing)
    assert again == (False, None)  # a redelivery finds the turn moved on
    # a second call of the batch still waits for the other's result
    tid2 = _create(store)
    calls = [PlannedCall(c, "read_thing", 0, data={}) for c in ("c1", "c2")]
    begin_tools(store, tid2, 0, [{"type": "function_call", "call_id": c.call_id} for c in calls],
                Plan(calls, [Batch("parallel", ["c1", "c2"])]), {}, {})  # fmt: skip
    assert store.barrier.record_and_check(tid2, 0, "c1", CallResult("o1"), 0, ["c1", "c2"]) == (True, None)
    stored, view = store.barrier.record_and_check(tid2, 0, "c2", CallResult("o2"), 0, ["c1", "c2"])
    assert stored and view is not None and view is not CLOSED


def test_an_ending_pushes_no_deadline_and_counts_the_model_call_in_its_hash_write(store):
    tid = _create(store)
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    with _counted(store._r) as ended:
        store.moves.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done", model_calls=1)
    assert "zadd" not in ended and "hincrby" not in ended and ended["zrem"] == 1
    # the hash, its items, its events, its usage (which a step's record leaves without an expiry);
    # the cancel flag expires with its own write
    assert ended["expire"] == 4
    assert store._r.zscore(WATCH_KEY, tid) is None
    state = store.load(tid)
    assert state is not None and state.status == TurnStatus.completed and state.model_calls == 1


def test_a_cancel_is_a_hash_field_the_scripts_read_and_one_read_for_a_nodes_model_calls(store):
    tids = [_create(store) for _ in range(3)]
    store.request_cancel(tids[0])
    assert store._r.hget(key(tids[0]), "cancel") == b"1" and store._r.exists(key(tids[0], "cancel"))
    with _counted(store._r) as watched:
        assert store.cancelled_of(tids) == {tids[0]}
    assert watched == {"zrangebyscore": 1}  # not one EXISTS per turn in flight
    with _counted(store._r) as begun:
        view = store.claims.begin_step(tids[0], 0, "owner-a", 60, "held-test")
    assert view.cancelled and not view.claim.tried and "exists" not in begun
    assert not store.claims.begin_step(tids[1], 0, "owner-a", 60, "held-test").cancelled
    unknown = uuid.uuid4().hex
    store.request_cancel(unknown)  # no hash is made for a turn that does not exist
    assert not store._r.exists(key(unknown)) and store.cancelled_of([unknown]) == {unknown}


def test_a_cancel_flag_set_before_the_end_keeps_its_own_expiry(store):
    tid = _create(store)
    store.request_cancel(tid)
    assert store.moves.fail(tid, TurnStatus.cancelled, "cancelled")
    assert 0 < store._r.ttl(key(tid, "cancel")) and 0 < store._r.ttl(key(tid))
    assert store._r.zscore(WATCH_KEY, tid) is None


def test_a_step_reads_its_background_response_only_on_a_node_in_background_mode(store):
    plain, background = _create(store), _create(store)
    with _counted(store._r) as begun:
        assert store.claims.begin_step(plain, 0, "owner-a", 60, "held-test", background=False).claim.tried
    assert "get" not in begun  # no response id, and no memo: the hash names no memoized step
    store.memo.note_response(background, 0, "resp_1")
    with _counted(store._r) as begun:
        view = store.claims.begin_step(background, 0, "owner-a", 60, "held-test")
    assert begun["get"] == 1 and view.response_id == "resp_1"


def test_a_layout_1_turns_usage_record_sets_no_expiry_until_the_turn_ends(store, monkeypatch):
    monkeypatch.setenv("AGENT_TURN_LAYOUT", "1")  # a turn created before the layout mark
    tid = _create(store)
    assert store.load(tid).layout == 1
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    with _counted(store._r) as saved:
        store.memo.save_and_check(tid, 0, {"id": "r0"}, {"step": 0}, ("0", b'{"step":0}'))
    assert "expire" not in saved and store._r.ttl(key(tid, "usage")) == -1
    store.moves.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done", model_calls=1)
    assert 0 < store._r.ttl(key(tid, "usage")) <= RETENTION_SECONDS
    # a reply stored after the end (a late delivery) gives its new usage hash an expiry of its own
    late = _create(store)
    assert store.moves.fail(late, TurnStatus.cancelled, "cancelled")
    store._r.delete(key(late, "usage"))
    with _counted(store._r) as saved:
        store.memo.save_and_check(late, 0, {"id": "r0"}, {"step": 0}, ("0", b'{"step":0}'))
    assert saved["expire"] == 1 and 0 < store._r.ttl(key(late, "usage"))


def test_a_layout_2_turn_keeps_its_usage_records_and_a_memo_mark_in_its_hash(store):
    tid = _create(store)
    assert store.load(tid).layout == 2
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    row = UsageLedger.row(0, {"input_tokens": 5}, "m", layout=2)
    with _counted(store._r) as saved:  # no move given: memoized, the hash names the step
        store.memo.save_and_check(tid, 0, {"id": "r0"}, {"step": 0}, row)
    assert "expire" not in saved and "hsetnx" not in saved and not store._r.exists(key(tid, "usage"))
    assert store._r.hget(key(tid), "memo") == b"0" and store.usage.totals(tid)["input_tokens"] == 5
    with _counted(store._r) as begun:  # a redelivery reads the memo the hash names
        view = store.claims.begin_step(tid, 0, "owner-b", 60, "held-test")
    assert begun["get"] == 1 and view.reply == {"id": "r0"}
    assert store.usage.record_and_total(tid, 0, {"input_tokens": 5}, "m")[0] is False  # counted once
    store.moves.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done", model_calls=1, layout=2)
    assert store._r.ttl(key(tid)) > 0 and not store._r.exists(key(tid, "usage"))
    assert [r["input_tokens"] for r in store.usage.steps(tid)] == [5]


def test_a_final_reply_ends_a_layout_2_turn_in_its_own_script_and_keeps_no_memo(store):
    tid = _create(store)
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    row = UsageLedger.row(0, {"input_tokens": 7}, "m", layout=2)
    finished = {"status": "completed", "error": None, "final_output": "done", "usage": {"input_tokens": 7}}
    writes = store.moves.end_writes(tid, [{"type": "message"}], TurnStatus.completed, final_output="done", error=None,
                              model_calls=1, usage=row, finished_event=finished)  # fmt: skip
    with _counted(store._r) as ended:
        saved = store.memo.save_and_check(tid, 0, {"id": "r0"}, {"step": 0}, row, then=writes,
                                          hooks_deadline=store.moves.hooks_deadline())  # fmt: skip
    assert saved.ended and not saved.began and not saved.hooks
    assert ended["evalsha"] == 1 and ended["hmget"] == 1 and "set" not in ended and "hvals" not in ended
    assert ended["expire"] == 3  # the hash, its items, its events: no usage hash
    state = store.load(tid)
    assert state.status == TurnStatus.completed and state.final_output == "done" and state.model_calls == 1
    assert not store._r.exists(key(tid, "reply", 0)) and store._r.zscore(WATCH_KEY, tid) is None
    assert store.usage.totals(tid)["input_tokens"] == 7
    kinds = [orjson.loads(f[b"e"])["kind"] for _, f in store._r.xrange(key(tid, "events"))]
    assert kinds[-2:] == ["model_reply", "turn_finished"]
    # a second delivery's reply finds the turn ended: nothing is kept, nothing moves
    again = store.memo.save_and_check(tid, 0, {"id": "r1"}, {"step": 0}, row, then=writes,
                                      hooks_deadline=store.moves.hooks_deadline())  # fmt: skip
    assert not again.ended and not store._r.exists(key(tid, "reply", 0)) and store.load(tid).model_calls == 1


def test_a_layout_1_turn_in_flight_keeps_its_keys(store, monkeypatch):
    """A turn created before the layout mark (or with ``AGENT_TURN_LAYOUT=1``) is run on the keys it
    started with: its plan and memo in their keys, the memo read at every step, its result kept."""
    monkeypatch.setenv("AGENT_TURN_LAYOUT", "1")
    tid = _at_tools(store)
    assert store._r.hget(key(tid), "layout") is None and store._r.exists(key(tid, "plan", 0))
    view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.claim.won and view.plan is not None
    closing = store.moves.next_step_writes(tid, 0, [{"type": "function_call_output", "call_id": "c1", "output": "o"}])
    assert store.barrier.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=closing)[1] is CLOSED
    assert store.results(tid, 0)["c1"].output == "o"  # kept, as before
    with _counted(store._r) as begun:
        store.claims.begin_step(tid, 1, "owner-a", 60, "held-test", background=False)
    assert begun["get"] == 1  # the memo, at every step


def test_a_one_call_step_of_a_layout_2_turn_is_closed_without_keeping_its_result(store):
    tid = _at_tools(store)  # its plan in the hash: the step asks no approval
    view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.claim.won and view.plan is not None and not store._r.exists(key(tid, "plan", 0))
    closing = store.moves.next_step_writes(tid, 0, [{"type": "function_call_output", "call_id": "c1", "output": "o"}])
    with _counted(store._r) as recorded:
        stored, closed = store.barrier.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=closing)
    assert stored and closed is CLOSED and "hsetnx" not in recorded and "expire" not in recorded
    assert store.results(tid, 0) == {} and store.load(tid).step == 1
    assert orjson.loads(store._r.lrange(key(tid, "items"), -1, -1)[0])["output"] == "o"
    again = store.barrier.record_and_check(tid, 0, "c1", CallResult("o2"), 0, ["c1"], closing=closing)
    assert again[1] is None and store.load(tid).step == 1  # a redelivery finds the turn moved on
    # a call claimed at once asks for no result (only a claim's holder stores one); a redelivery does
    other = _at_tools(store)
    store.plan(other, 0)  # what the call's message carries (read by the test before counting)
    with _counted(store._r) as read:
        assert call_view(store, other, 0, "c1", "owner-a", 60).claim.won
    assert "hexists" not in read and "get" not in read  # the plan came with the hash
    with _counted(store._r) as read:
        assert not call_view(store, other, 0, "c1", "owner-b", 60).claim.won
    assert read["hexists"] == 1


def test_a_move_within_the_reuse_of_the_last_deadline_pushes_none(own_redis):
    store = TurnStore(redis.Redis.from_url(own_redis), progress_timeout=60, deadline_reuse=10)
    tid = _create(store)  # deadline: now + 60
    deadline = store._r.zscore(WATCH_KEY, tid)
    state = store.load(tid)
    plan = Plan([PlannedCall("c1", "read_thing", 0, data={})], [Batch("parallel", ["c1"])])
    writes = store.moves.begin_tools_writes(tid, 0, [], plan, {}, {}, known_deadline=state.deadline)
    with _counted(store._r) as moved:
        store.moves.apply_begin_tools(tid, 0, writes)
    assert "zadd" not in moved and store._r.zscore(WATCH_KEY, tid) == deadline
    assert float(store._r.hget(key(tid), "deadline")) == deadline  # the field still the watch's
    stale = deadline - 15  # a deadline read more than the reuse ago: pushed
    writes = store.moves.next_step_writes(tid, 0, [], known_deadline=stale)
    with _counted(store._r) as moved:
        store.moves._guard.run(tid, 0, "tools", writes)
    assert moved["zadd"] == 1 and store._r.zscore(WATCH_KEY, tid) > deadline


def test_a_step_pushes_the_watch_only_when_its_lease_outlives_the_last_transitions_deadline(store):
    tid = _create(store)  # deadline: now + 60 s (the fixture's progress timeout)
    deadline = store._r.zscore(WATCH_KEY, tid)
    assert float(store._r.hget(key(tid), "deadline")) == deadline
    with _counted(store._r) as begun:
        assert store.claims.begin_step(tid, 0, "owner-a", 30, "held-test").claim.tried
    assert "zadd" not in begun and store._r.zscore(WATCH_KEY, tid) == deadline
    later = _create(store)
    with _counted(store._r) as begun:
        assert store.claims.begin_step(later, 0, "owner-a", 90, "held-test").claim.tried  # a lease past it
    assert begun["zadd"] == 1 and store._r.zscore(WATCH_KEY, later) >= time.time() + 89
    old = _create(store)
    store._r.hdel(key(old), "deadline")  # a turn stored before the field: always pushed
    with _counted(store._r) as begun:
        store.claims.begin_step(old, 0, "owner-a", 30, "held-test")
    assert begun["zadd"] == 1
    # the transition to the tools phase sets both
    begin_tools(store, tid, 0, [{"type": "function_call", "call_id": "c1"}],
                Plan([PlannedCall("c1", "read_thing", 0, data={})], [Batch("parallel", ["c1"])]), {}, {})  # fmt: skip
    assert float(store._r.hget(key(tid), "deadline")) == store._r.zscore(WATCH_KEY, tid) > deadline


class _ScriptedMessages:
    """A dispatcher whose messages ride in the store's scripts, as a worker's do (an ``LPUSH`` on a
    list of the test's own); it keeps what each call's message carries (``started``)."""

    def __init__(self) -> None:
        self.queue = f"test:queue:{uuid.uuid4().hex}"
        self.started: dict[str, str] = {}

    def enqueue_step(self, turn_id, step, *, queue, label=""):
        pass

    def step_message(self, turn_id, step, *, queue, label=""):
        return [("LPUSH", self.queue, f"step {turn_id} {step}".encode())]

    def batch_message(self, turn_id, step, batch, *, queue, labels=None, started=None):
        self.started.update({c: (started or {}).get(c, "") for c in batch.call_ids})
        return [("LPUSH", self.queue, f"batch {turn_id} {step}".encode())]

    def dispatch_batch(self, turn_id, step, batch_index, batch, *, queue, labels=None, computer=None, started=None):
        raise AssertionError("the first batch rides in the reply's script")

    def services(self, request):
        from worker.tooling.contract import ToolServices

        return ToolServices()

    def turn_finished(self, turn_id):
        pass


# The bench turn's commands in the turn store (issue 34), per command: a model call that makes one
# call, the call, a model call that answers. Not counted: Celery's and kombu's own (each message's
# fetch and ack, its task-sent event, the workers' task events and heartbeats) and the first
# step's message (the control plane sends it after the creation script). ``rpush`` includes the test
# tool's own log line. Before the cuts of issue 34 (main 559d8b4, the same test): 78; before the
# layout mark (main 14e8d85): 67, with evalsha 8 (the end's own script), get 3 (the memo at each
# step, the plan), set 5 (2 x the memo, the plan), hsetnx 4 (2 x usage, the result), expire 7 (the
# result; the usage hash at the end), hmget 4 (the end's fence), zadd 5 (the watch at the two
# moves), hexists 1 (begin_call), hvals 1 (the usage rows for the answer's totals).
BENCH_TURN_STORE_COMMANDS = {
    # create, 2 x begin_step, 2 x the reply with its move (to the tools; the turn's end), begin_call, the result
    "evalsha": 7,
    "hget": 1,  # the creation's owner check
    "hset": 7,  # the hash at creation, running, at each move (with the usage record and the plan), the end; 2 x held
    "rpush": 5,  # the items: input, the reply's call, the output, the answer; the tool's log line
    "zadd": 3,  # the watch at creation (the moves keep its deadline); the two listing indexes
    "xadd": 8,  # turn_queued, turn_started, 2 x model_reply, call_planned, call_started, call_completed, turn_finished
    "expire": 5,  # the agent's index, the call's claim; at the end the hash, items, events
    "hgetall": 3,  # 2 x begin_step, begin_call (the plan with the hash)
    "lrange": 2,  # the items, at each model step
    "set": 2,  # 2 x the step claim (no memo: each reply moves the turn in its own script)
    "hsetnx": 1,  # the claim (the result closes the step and is not kept)
    "hmget": 3,  # the fences of the two replies and of the result
    "lpush": 2,  # the call's message, step 1's message (both in the scripts)
    "zrem": 1,  # the watch, at the end
}


def test_a_bench_turn_costs_the_pinned_commands_in_the_store(own_redis, gateway, script_name):
    from tests.support.scripts import fc, msg
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine
    from worker.turn.request import TurnRequest

    settings, d = Settings(model_stream=False), _ScriptedMessages()  # as the bench: no deltas
    store = TurnStore(redis.Redis.from_url(own_redis), progress_timeout=600, deadline_reuse=30)  # as a worker
    client = SyncModelClient(RESPONSES, gateway.base_url)
    engine = TurnEngine(store, settings, d, toolset_resolver(settings), client, redis=store._r)
    gateway.add_script(script_name, [{"output": [fc("read_thing", '{"label": "a"}')]}, {"output": [msg("done")]}] * 2)

    def turn() -> None:
        turn_id = uuid.uuid4().hex
        agent = f"cmds-{uuid.uuid4().hex[:6]}"
        engine.create_turn(TurnRequest(agent_id=agent, input="go", model=script_name, toolset="testing"), turn_id)
        assert engine.run_step(turn_id, 0).action == "dispatched"
        [(call_id, started)] = d.started.items()
        d.started.clear()
        assert started.startswith(",")  # claimed with its first read
        assert engine.run_call(turn_id, 0, call_id, 0, started).action == "advanced"
        assert engine.run_step(turn_id, 1).action == "completed"

    turn()  # the scripts loaded (a first EVALSHA of each is answered NOSCRIPT)
    with _counted(store._r) as counted:
        turn()
    counted.pop("script|load", None)
    counted.pop("zremrangebyscore", None)  # one creation in PRUNE_EVERY, by its milliseconds
    assert counted == BENCH_TURN_STORE_COMMANDS, str(sorted(counted.items()))
    assert sum(counted.values()) == 50
