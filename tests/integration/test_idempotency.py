"""Crash and redelivery semantics of the engine against a real Redis (docs/architecture.md, "Claims and fencing").

The queue layer is replaced by a dispatcher that records what it would send, so each
redelivery and crash can be staged exactly; the state transitions are the real ones.
"""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
import redis

from tests.support.scripts import fc
from worker.model.interface import ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient
from worker.settings import Settings
from worker.tooling.contract import ToolServices
from worker.tools.toolsets import toolset_resolver
from worker.turn.engine import TurnEngine
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.store import TurnStore


class RecordingDispatcher:
    def __init__(self):
        self.sent = []

    def enqueue_step(self, turn_id, step, *, queue, label=""):
        self.sent.append(("step", turn_id, step))

    def step_message(self, turn_id, step, *, queue, label=""):
        return None  # sent by enqueue_step, so the test sees it

    def batch_message(self, turn_id, step, batch, *, queue, labels=None, started=None):
        return None  # sent by dispatch_batch, so the test sees it

    def dispatch_batch(self, turn_id, step, batch_index, batch, *, queue, labels=None, computer=None, started=None):
        self.sent.append(("batch", turn_id, step, batch_index, list(batch.call_ids), batch.mode))

    def services(self, request):
        return ToolServices()

    def turn_finished(self, turn_id):
        self.sent.append(("finished", turn_id))


@pytest.fixture
def engine(redis_url, gateway):
    settings = Settings()
    store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=1.0)
    client = SyncModelClient(RESPONSES, gateway.base_url)
    return TurnEngine(store, settings, RecordingDispatcher(), toolset_resolver(settings), client, redis=store._r)


def start(engine, gateway, script_name, steps):
    gateway.add_script(script_name, steps)
    turn_id = uuid.uuid4().hex
    engine.create_turn(TurnRequest(input="go", model=script_name, toolset="testing"), turn_id)
    engine.dispatcher.sent.clear()
    return turn_id


def tool_log(engine, turn_id):
    return [orjson.loads(x) for x in engine.redis.lrange(f"test:log:{turn_id}", 0, -1)]


def test_duplicate_step_delivery_calls_model_once_and_plans_once(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "a"}')]}])
    assert engine.run_step(turn_id, 0).action == "dispatched"
    assert engine.run_step(turn_id, 0).action == "dropped"
    assert sum(1 for r in gateway.requests if r["model"] == script_name) == 1
    assert [s[0] for s in engine.dispatcher.sent] == ["batch"]


def test_crash_after_model_reply_reuses_memoized_reply(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "a"}')]}])
    # a first delivery got the reply and died before recording the plan
    request = ModelRequest(model=script_name, input=engine.store.items(turn_id))
    engine.store.memo.save(turn_id, 0, engine.client.create(request).to_json())
    n = len(gateway.requests)
    assert engine.run_step(turn_id, 0).action == "dispatched"
    assert len(gateway.requests) == n, "the redelivered step must not pay for the same tokens twice"


def test_redelivered_tool_call_runs_once(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "a"}')]}])
    engine.run_step(turn_id, 0)
    call_id = engine.dispatcher.sent[0][4][0]
    assert engine.run_call(turn_id, 0, call_id).action == "advanced"
    assert engine.run_call(turn_id, 0, call_id).action == "dropped"  # the step moved on: fenced out
    assert len(tool_log(engine, turn_id)) == 1


def test_destructive_call_whose_worker_died_is_reported_not_rerun(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("write_thing", '{"label": "w"}')]}])
    engine.run_step(turn_id, 0)
    call_id = engine.dispatcher.sent[0][4][0]
    # a worker claimed the call and died: its lease has expired, no result was stored
    engine.redis.hset(
        f"turn:{{{turn_id}}}:claims:0", call_id, orjson.dumps({"owner": "dead:1", "lease_until": time.time() - 1})
    )
    assert engine.run_call(turn_id, 0, call_id).action == "advanced"
    assert tool_log(engine, turn_id) == []
    out = [i for i in engine.store.items(turn_id) if i["type"] == "function_call_output"][0]["output"]
    assert "outcome of this write_thing call is unknown" in out


def test_read_only_call_whose_worker_died_runs_again(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "r"}')]}])
    engine.run_step(turn_id, 0)
    call_id = engine.dispatcher.sent[0][4][0]
    engine.redis.hset(
        f"turn:{{{turn_id}}}:claims:0", call_id, orjson.dumps({"owner": "dead:1", "lease_until": time.time() - 1})
    )
    engine.run_call(turn_id, 0, call_id)
    assert len(tool_log(engine, turn_id)) == 1


def test_call_running_elsewhere_is_not_duplicated(engine, gateway, script_name):
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "r"}')]}])
    engine.run_step(turn_id, 0)
    call_id = engine.dispatcher.sent[0][4][0]
    engine.store.claims.claim(turn_id, 0, call_id, "other:2", lease=60)
    assert engine.run_call(turn_id, 0, call_id).action == "dropped"
    assert tool_log(engine, turn_id) == []


def test_barrier_advances_exactly_once(engine, gateway, script_name):
    turn_id = start(
        engine,
        gateway,
        script_name,
        [{"output": [fc("read_thing", '{"label": "a"}'), fc("read_thing", '{"label": "b"}')]}],
    )
    engine.run_step(turn_id, 0)
    a, b = engine.dispatcher.sent[0][4]
    assert engine.run_call(turn_id, 0, a).action == "ran"
    assert engine.run_call(turn_id, 0, b).action == "advanced"
    steps = [s for s in engine.dispatcher.sent if s[0] == "step"]
    assert steps == [("step", turn_id, 1)]


def test_watchdog_redrives_lost_messages_then_gives_up(engine, gateway, script_name):
    turn_id = start(
        engine,
        gateway,
        script_name,
        [{"output": [fc("read_thing", '{"label": "a"}'), fc("write_thing", '{"label": "w"}')]}],
    )
    engine.run_step(turn_id, 0)
    first = engine.dispatcher.sent[0]
    engine.run_call(turn_id, 0, first[4][0])  # batch 0 done; batch 1's message is "lost"
    engine.dispatcher.sent.clear()
    time.sleep(1.1)
    assert turn_id in engine.store.overdue()
    assert engine.redrive(turn_id, max_redrives=2).action == "redriven"
    assert engine.dispatcher.sent[-1][0] == "batch" and engine.dispatcher.sent[-1][3] == 1
    engine.redrive(turn_id, max_redrives=2)
    assert engine.redrive(turn_id, max_redrives=2).action == "failed"
    state = engine.store.load(turn_id)
    assert state.status == TurnStatus.failed and "re-drives" in state.error


class CapturingDispatcher(RecordingDispatcher):
    """Gives the step's and the batch's messages as commands (``step_message``/``batch_message``)
    that push a tag on a list of its own: what the scripts sent is in that list, what the engine
    published itself in ``sent``."""

    def __init__(self):
        super().__init__()
        self.queue = f"test:queue:{uuid.uuid4().hex}"

    def step_message(self, turn_id, step, *, queue, label=""):
        return [("LPUSH", self.queue, f"step {turn_id} {step}".encode())]

    def batch_message(self, turn_id, step, batch, *, queue, labels=None, started=None):
        return [("LPUSH", self.queue, f"batch {turn_id} {step}".encode())]


def test_messages_sent_by_the_scripts_are_sent_once_and_not_published_again(redis_url, gateway, script_name):
    settings, d = Settings(), CapturingDispatcher()
    store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=1.0)
    engine = TurnEngine(
        store, settings, d, toolset_resolver(settings), SyncModelClient(RESPONSES, gateway.base_url), redis=store._r
    )
    turn_id = start(engine, gateway, script_name, [{"output": [fc("read_thing", '{"label": "a"}')]}, {"output": []}])
    assert engine.run_step(turn_id, 0).action == "dispatched"
    assert engine.run_step(turn_id, 0).action == "dropped"  # a redelivery
    assert engine.redis.lrange(d.queue, 0, -1) == [f"batch {turn_id} 0".encode()] and d.sent == []
    call_id = engine.store.plan(turn_id, 0).calls[0].call_id
    assert engine.run_call(turn_id, 0, call_id).action == "advanced"
    assert engine.run_call(turn_id, 0, call_id).action == "dropped"  # a redelivery
    assert engine.redis.lrange(d.queue, 0, -1) == [f"step {turn_id} 1".encode(), f"batch {turn_id} 0".encode()]
    assert d.sent == [] and engine.store.load(turn_id).step == 1
    engine.redis.delete(d.queue)
