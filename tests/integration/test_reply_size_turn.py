"""An answer above ``AGENT_MODEL_MAX_REPLY_BYTES`` ends the turn ``failed`` with the setting in
its reason, after one call: not retried (paid again), not a crash of the step."""

from __future__ import annotations

import uuid

import pytest
import redis

from tests.integration.test_idempotency import RecordingDispatcher
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient
from worker.settings import Settings
from worker.tools.toolsets import toolset_resolver
from worker.turn.engine import TurnEngine
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.store import TurnStore


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_a_too_large_answer_fails_the_turn_once(redis_url, gateway, script_name, streamed):
    settings = Settings(model_stream=streamed)
    store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=1.0)
    client = SyncModelClient(RESPONSES, gateway.base_url, max_reply_bytes=65_536, timeout=10)
    engine = TurnEngine(store, settings, RecordingDispatcher(), toolset_resolver(settings), client, redis=store._r)
    gateway.add_script(script_name, [{"output": [{"type": "message", "text": "x" * 300_000}]}] * 3)
    turn_id = uuid.uuid4().hex
    engine.create_turn(TurnRequest(input="go", model=script_name, toolset="testing"), turn_id)
    try:
        outcome = engine.run_step(turn_id, 0)
    finally:
        client.close()
    assert outcome.action == "ended"
    state = store.load(turn_id)
    assert state.status == TurnStatus.failed and "AGENT_MODEL_MAX_REPLY_BYTES" in (state.error or "")
    assert sum(1 for r in gateway.requests if r["model"] == script_name) == 1
