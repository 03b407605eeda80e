"""The Redis commands a turn costs (issue 34), counted with ``INFO commandstats`` on a Redis of the
test's own (no worker, beat or other test sends anything to it, so every count is exact): a command a
Lua script runs counts as one, and so do ``MULTI`` and ``EXEC``.

- kombu's record of a fetched message and its ack (``tasks.broker.QoS``): a plain pipeline each, no
  transaction; a fetched message is still given back by kombu's restore (a dead worker's).
- The turn's scripts (``worker.turn.guard``, ``claims``, ``store``): the reads and writes each one
  does not need are gone (the fence's second read of the turn hash, the barrier's check of the
  caller's own result, the deadline an ending undoes, the list trim below its length, the
  ``model_calls`` increment, the cancel flag's second expiry).
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from tasks import broker
from tests.integration.conftest import broker_app
from tests.support.turn_store import begin_tools, call_view
from worker.turn.claims import CLOSED
from worker.turn.dispatch import Batch, Plan, PlannedCall
from worker.turn.guard import PRUNE_EVERY, CreateScript
from worker.turn.keys import WATCH_KEY, index_key, key
from worker.turn.request import TurnStatus
from worker.turn.state import RETENTION_SECONDS, CallResult
from worker.turn.store import TurnStore


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
    with _counted(store._r) as read:
        view = call_view(store, tid, 0, "c1", "owner-a", 60)
    assert view.claim.won
    assert "hmget" not in read and read["hgetall"] == 1  # the fence reads the hash the script read
    assert "exists" not in read  # the cancel flag is the hash's field
    assert "hget" not in read and not store._r.exists(key(tid, "start", 0))  # claimable: the message says
    closing = store.next_step_writes(tid, 0, [{"type": "function_call_output", "call_id": "c1", "output": "o"}])
    with _counted(store._r) as recorded:
        stored, closed = store.claims.record_and_check(tid, 0, "c1", CallResult("o"), 0, ["c1"], closing=closing)
    assert stored and closed is CLOSED
    assert "hexists" not in recorded  # the caller's own result was just stored
    assert "exists" not in recorded and recorded["hmget"] == 1  # the flag and the fence in one read
    assert "set" not in recorded and not store._r.exists(key(tid, "adv", 0, 0))  # closed with it: no barrier key
    again = store.claims.record_and_check(tid, 0, "c1", CallResult("o2"), 0, ["c1"], closing=closing)
    assert again == (False, None)  # a redelivery finds the turn moved on
    # a second call of the batch still waits for the other's result
    tid2 = _create(store)
    calls = [PlannedCall(c, "read_thing", 0, data={}) for c in ("c1", "c2")]
    begin_tools(store, tid2, 0, [{"type": "function_call", "call_id": c.call_id} for c in calls],
                Plan(calls, [Batch("parallel", ["c1", "c2"])]), {}, {})  # fmt: skip
    assert store.claims.record_and_check(tid2, 0, "c1", CallResult("o1"), 0, ["c1", "c2"]) == (True, None)
    stored, view = store.claims.record_and_check(tid2, 0, "c2", CallResult("o2"), 0, ["c1", "c2"])
    assert stored and view is not None and view is not CLOSED


def test_an_ending_pushes_no_deadline_and_counts_the_model_call_in_its_hash_write(store):
    tid = _create(store)
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    with _counted(store._r) as ended:
        store.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done", model_calls=1)
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
    assert store.fail(tid, TurnStatus.cancelled, "cancelled")
    assert 0 < store._r.ttl(key(tid, "cancel")) and 0 < store._r.ttl(key(tid))
    assert store._r.zscore(WATCH_KEY, tid) is None


def test_a_step_reads_its_background_response_only_on_a_node_in_background_mode(store):
    plain, background = _create(store), _create(store)
    with _counted(store._r) as begun:
        assert store.claims.begin_step(plain, 0, "owner-a", 60, "held-test", background=False).claim.tried
    assert begun["get"] == 1  # the reply memo only
    store.memo.note_response(background, 0, "resp_1")
    with _counted(store._r) as begun:
        view = store.claims.begin_step(background, 0, "owner-a", 60, "held-test")
    assert begun["get"] == 2 and view.response_id == "resp_1"


def test_a_steps_usage_record_sets_no_expiry_until_the_turn_ends(store):
    tid = _create(store)
    store.claims.begin_step(tid, 0, "owner-a", 60, "held-test")
    with _counted(store._r) as saved:
        store.memo.save_and_check(tid, 0, {"id": "r0"}, {"step": 0}, ("0", b'{"step":0}'))
    assert "expire" not in saved and store._r.ttl(key(tid, "usage")) == -1
    store.end_at_model_step(tid, 0, [], TurnStatus.completed, final_output="done", model_calls=1)
    assert 0 < store._r.ttl(key(tid, "usage")) <= RETENTION_SECONDS
    # a reply stored after the end (a late delivery) gives its new usage hash an expiry of its own
    late = _create(store)
    assert store.fail(late, TurnStatus.cancelled, "cancelled")
    store._r.delete(key(late, "usage"))
    with _counted(store._r) as saved:
        store.memo.save_and_check(late, 0, {"id": "r0"}, {"step": 0}, ("0", b'{"step":0}'))
    assert saved["expire"] == 1 and 0 < store._r.ttl(key(late, "usage"))


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
# tool's own log line. Before the cuts (main 559d8b4, the same test): 78, with lpush 3 (the agent's
# list), zremrangebyscore 2 (the indexes), expire 10 (the index of every turn, the usage hash at
# each record, the start hash), zadd 7 (each begin_step's push), hset 8 and hget 2 (the start hash),
# set 6 (the barrier key).
BENCH_TURN_STORE_COMMANDS = {
    # create, 2 x begin_step, 2 x the reply's memo (with the move, or not), begin_call, the result, the end
    "evalsha": 8,
    "hget": 1,  # the creation's owner check
    "hset": 7,  # the hash at creation, running, at each move, the end; 2 x the node's held step
    "rpush": 5,  # the items: input, the reply's call, the output, the answer; the tool's log line
    "zadd": 5,  # the watch at creation and at the two moves; the two listing indexes
    "xadd": 8,  # turn_queued, turn_started, 2 x model_reply, call_planned, call_started, call_completed, turn_finished
    "expire": 7,  # the agent's index, the call's claim and result; at the end the hash, items, events, usage
    "hgetall": 3,  # 2 x begin_step, begin_call
    "lrange": 2,  # the items, at each model step
    "get": 3,  # the reply memo at each begin_step, the plan at begin_call
    "set": 5,  # 2 x the step claim, 2 x the memo, the plan
    "hsetnx": 4,  # 2 x usage, the claim, the result
    "hmget": 4,  # the fences of the two memos, of the result, of the end
    "hexists": 1,  # begin_call: the call has no result yet
    "hvals": 1,  # the usage rows, for the answer's totals
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
    store = TurnStore(redis.Redis.from_url(own_redis), progress_timeout=600)
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
    assert counted == BENCH_TURN_STORE_COMMANDS, counted
    assert sum(counted.values()) == 67
