"""The writes that fence side effects or money wait for a replica (``worker.turn.durability``,
docs/failover.md), against a real primary, replica and three Sentinels (``devtools.embedded_sentinel``).

- With the replica up, a destructive call's claim and a model reply's memo are each followed by
  ``WAIT`` on the connection that wrote them, in the same round trip, and acknowledged.
- With the replica down, a destructive call's claim is refused (``NotDurable``: its tool must not
  run) and released; a memo goes on, counted as not acknowledged, and the memos after it skip their
  ``WAIT`` for a while instead of each holding its thread for the whole timeout; a claim never skips.
- Without replicas configured (a single Redis), no ``WAIT`` is sent at all.
- A promoted replica has no scripts cached: the pipelined scripts are loaded there and sent again.
- Through a worker: a destructive call whose claim reaches no replica is deferred (its task sent
  again later, holding nothing) and runs exactly once when the replica is back; after its last
  deferral it is reported not run.
"""

from __future__ import annotations

import uuid

import pytest
import redis

from devtools.embedded_sentinel import EmbeddedSentinelSet
from tests.support.scripts import fc, msg, output_texts, wait_for
from worker.redis_connection import RedisEndpoint, Sentinels
from worker.settings import parse_host_ports
from worker.turn.durability import NO_REPLICAS, NotDurable, ReplicaAck
from worker.turn.store import TurnStore

TIMEOUT = 0.3  # seconds a fencing write waits for its acknowledgement here


@pytest.fixture(scope="module")
def redis_set():
    s = EmbeddedSentinelSet()
    s.start()
    yield s
    s.stop()


def _endpoint(redis_set: EmbeddedSentinelSet) -> RedisEndpoint:
    sentinels = Sentinels(parse_host_ports(redis_set.sentinel_addresses), "agent", redis_set.sentinel_password)
    return RedisEndpoint.parse(redis_set.url, sentinels=sentinels)


def _store(redis_set: EmbeddedSentinelSet, replicas: int = 1) -> TurnStore:
    return TurnStore(_endpoint(redis_set).client(), durability=ReplicaAck(replicas, TIMEOUT))


def _waits(client: redis.Redis) -> int:
    """``WAIT`` commands the server has run."""
    return int(client.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))


def _save_memo(store: TurnStore, turn_id: str, step: int = 0):
    return store.memo.save_and_check(turn_id, step, {"id": "r", "output": []}, {"step": step}, (str(step), b"{}"))


def _warm(store: TurnStore) -> None:
    """Load the store's scripts on the primary (the first pipelined script is answered NOSCRIPT
    and sent again: two WAITs, once)."""
    turn = uuid.uuid4().hex
    store.claims.claim(turn, 0, "warm", "node:1:1:1", 60, durable=True)
    _save_memo(store, turn)


def test_a_claim_and_a_memo_wait_for_the_replica(redis_set):
    store = _store(redis_set)
    _warm(store)
    r = _endpoint(redis_set).client()
    before = _waits(r)
    turn = uuid.uuid4().hex
    assert store.claims.claim(turn, 0, "call_1", "node:1:1:1", 60, durable=True) == (True, None)
    assert _save_memo(store, turn).durable
    assert _waits(r) == before + 2
    # A claim that is not destructive is not followed by WAIT.
    store.claims.claim(turn, 0, "call_2", "node:1:1:1", 60)
    assert _waits(r) == before + 2


def test_without_the_replica_a_destructive_claim_is_refused_and_a_memo_goes_on(redis_set):
    store = _store(redis_set)
    _warm(store)
    r = _endpoint(redis_set).client()
    replica = next(s for s in redis_set.servers if s.port != redis_set.primary_port())
    replica.halt(kill=True)
    try:
        turn = uuid.uuid4().hex
        with pytest.raises(NotDurable):
            store.claims.claim(turn, 0, "call_1", "node:1:1:1", 60, durable=True)
        assert store.claims.release_claim(turn, 0, "call_1", "node:1:1:1")
        assert not store.claims.release_claim(turn, 0, "call_1", "node:1:1:1")  # gone
        before = _waits(r)
        assert not _save_memo(store, turn, 0).durable
        assert _waits(r) == before + 1
        # The next memos skip their WAIT for a while (a replica that is gone would cost each of
        # them the whole timeout); a destructive claim still waits, and is still refused.
        assert not _save_memo(store, turn, 1).durable
        assert _waits(r) == before + 1
        with pytest.raises(NotDurable):
            store.claims.claim(turn, 0, "call_3", "node:1:1:1", 60, durable=True)
        assert _waits(r) == before + 2
        with pytest.raises(NotDurable):  # taking over a claim (our own, after an outage) waits too
            store.claims.take_over_claim(turn, 0, "call_3", "node:1:1:1", 60, durable=True)
    finally:
        redis_set.restart(replica)
    assert store.claims.claim(uuid.uuid4().hex, 0, "call_1", "node:1:1:1", 60, durable=True)[0]


def test_without_replicas_configured_no_wait_is_sent(redis_url):
    client = redis.Redis.from_url(redis_url)
    store = TurnStore(client, durability=NO_REPLICAS)
    before = _waits(client)
    turn = uuid.uuid4().hex
    assert store.claims.claim(turn, 0, "call_1", "node:1:1:1", 60, durable=True) == (True, None)
    assert _save_memo(store, turn).durable
    assert _waits(client) == before


def test_a_promoted_replica_loads_the_scripts_it_lacks(redis_set):
    store = _store(redis_set)
    turn = uuid.uuid4().hex
    assert _save_memo(store, turn, 0).durable  # the script is cached on this primary
    old = redis_set.kill_primary()
    redis_set.wait_for_failover(old.port)
    redis_set.restart(old)  # a replica again, so that the next WAIT is acknowledged
    saved = wait_for(lambda: _try(lambda: _save_memo(store, turn, 1)), timeout=30)
    assert saved.durable
    r = _endpoint(redis_set).client()
    assert r.exists(f"turn:{{{turn}}}:reply:0") and r.exists(f"turn:{{{turn}}}:reply:1")


def _try(run):
    try:
        return run()
    except (redis.ConnectionError, redis.TimeoutError):  # the client follows the failover
        return None


def test_a_worker_defers_a_destructive_call_until_its_claim_is_durable(gateway, script_name, homes_root):
    """Through a real worker: the replica is down, so the destructive call's claim is not
    acknowledged; the call is sent again later (not run), and runs once when the replica is back."""
    from tests.support.private_stack import PrivateStack

    stack = PrivateStack(EmbeddedSentinelSet(), AGENT_REDIS_REPLICA_ACK_TIMEOUT=str(TIMEOUT))
    try:
        stack.start_worker(pool="threads", concurrency=4)
        primary = stack.sentinels.primary_port()
        replica = next(s for s in stack.sentinels.servers if s.port != primary)
        gateway.add_script(script_name, [{"output": [fc("append_marker", {"label": "once", "ms": 0})]}, msg("done")])
        replica.halt(kill=True)
        agent = f"fence-{uuid.uuid4().hex[:6]}"
        tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"})
        # The call was claimed and released at least once without running.
        wait_for(lambda: _started(stack, tid) >= 2, timeout=60)
        markers = homes_root / agent / "markers.txt"
        assert not markers.exists()
        redis_set = stack.sentinels
        redis_set.restart(replica)
        view = stack.control.wait(tid, timeout=90)
        assert view.status.value == "completed", view
        assert markers.read_text().split() == ["once"]
        assert output_texts(stack.control, tid) == ["appended once"]
    finally:
        stack.close()


def _started(stack, turn_id: str) -> int:
    return sum(1 for e in stack.control.events(turn_id) if e.get("kind") == "call_started")


class _Recorded:
    """A dispatcher that records what it would send (the engine runs in this process)."""

    def __init__(self):
        self.sent = []

    def enqueue_step(self, turn_id, step, *, queue, label=""):
        self.sent.append(("step", turn_id, step))

    def step_message(self, turn_id, step, *, queue, label=""):
        return None

    def batch_message(self, turn_id, step, batch, *, queue, labels=None, started=None):
        return None

    def dispatch_batch(self, turn_id, step, batch_index, batch, *, queue, labels=None, computer=None, started=None):
        self.sent.append(("batch", turn_id, step, list(batch.call_ids)))

    def services(self, request):
        from worker.tooling.contract import ToolServices

        return ToolServices()

    def turn_finished(self, turn_id):
        self.sent.append(("finished", turn_id))


def _engine(store: TurnStore, client: redis.Redis):
    from worker.model.clients import model_client
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine

    settings = Settings()
    return TurnEngine(store, settings, _Recorded(), toolset_resolver(settings), model_client(settings), redis=client)


def _planned_call(engine, gateway, script_name, tool: str) -> tuple[str, str]:
    from worker.turn.request import TurnRequest

    gateway.add_script(script_name, [{"output": [fc(tool, {"label": "w", "ms": 0})]}, msg("done")])
    turn_id = uuid.uuid4().hex
    engine.create_turn(TurnRequest(input="go", model=script_name, toolset="testing"), turn_id)
    engine.run_step(turn_id, 0)
    return turn_id, next(s for s in engine.dispatcher.sent if s[0] == "batch")[3][0]


def test_after_its_last_deferral_a_destructive_call_is_reported_not_run(redis_set, gateway, script_name):
    from worker.turn.call_runner import DEFERRALS

    client = _endpoint(redis_set).client()
    engine = _engine(TurnStore(client, durability=ReplicaAck(1, TIMEOUT)), client)
    turn_id, call_id = _planned_call(engine, gateway, script_name, "write_thing")
    replica = next(s for s in redis_set.servers if s.port != redis_set.primary_port())
    replica.halt(kill=True)
    try:
        assert engine.run_call(turn_id, 0, call_id, deferrals=0).action == "deferred"
        assert engine.run_call(turn_id, 0, call_id, deferrals=len(DEFERRALS)).action == "advanced"
    finally:
        redis_set.restart(replica)
    assert not engine.redis.exists(f"test:log:{turn_id}")  # never ran
    out = [i for i in engine.store.items(turn_id) if i["type"] == "function_call_output"][0]["output"]
    assert out.startswith("Error: write_thing did not run") and "Nothing was done" in out


def test_a_destructive_call_whose_result_a_failover_lost_is_not_run_again(redis_url, gateway, script_name):
    """This very thread ran the call; the primary that stored its result (and closed the step) died
    before a replica had it: the call's claim (durable) is ours, its result gone. A re-sent call
    reports its outcome unknown instead of running the tool a second time."""
    client = redis.Redis.from_url(redis_url)
    engine = _engine(TurnStore(client), client)
    turn_id, call_id = _planned_call(engine, gateway, script_name, "write_thing")
    assert engine.run_call(turn_id, 0, call_id).action == "advanced"
    r = engine.redis
    # What the failover lost: the result, the barrier and the step's close.
    r.hdel(f"turn:{{{turn_id}}}:results:0", call_id)
    r.delete(f"turn:{{{turn_id}}}:adv:0:0")
    r.hset(f"turn:{{{turn_id}}}", mapping={"step": 0, "phase": "tools"})
    r.ltrim(f"turn:{{{turn_id}}}:items", 0, -2)  # the output item appended by the close
    assert engine.run_call(turn_id, 0, call_id).action == "advanced"
    assert len(r.lrange(f"test:log:{turn_id}", 0, -1)) == 1  # ran once
    out = [i for i in engine.store.items(turn_id) if i["type"] == "function_call_output"][0]["output"]
    assert "outcome of this write_thing call is unknown" in out
