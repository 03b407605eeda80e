"""Failure modes found by breaking the orchestration: each must end with a valid history and a clear status."""

from __future__ import annotations

import os
import time
import uuid

import orjson
import pytest

from tests.support.scripts import fc, msg
from worker.model.interface import GatewayError
from worker.model.items import normalize_reply_calls, unanswered_call_ids
from worker.model.responses import parse_response
from worker.turn.request import TurnStatus


@pytest.mark.parametrize(
    "body",
    [
        [],
        "str",
        {"output": {"type": "message"}},
        {"output": ["x"]},
        {"output": [{"type": "function_call", "call_id": "c", "name": ["a"], "arguments": "{}"}]},
        {"output": [{"type": "function_call", "call_id": "c", "name": "a", "arguments": {"x": 1}}]},
        {"status": "in_progress", "output": []},
    ],
)
def test_malformed_responses_are_gateway_errors_not_crashes(body):
    with pytest.raises(GatewayError) as exc:
        parse_response(body)
    assert exc.value.retryable


def test_failed_response_is_not_retried():
    with pytest.raises(GatewayError) as exc:
        parse_response({"status": "failed", "error": {"message": "bad"}})
    assert not exc.value.retryable and "bad" in str(exc.value)


def test_calls_without_call_id_get_ids_unique_in_the_turn():
    items0, calls0 = normalize_reply_calls([fc("a")], set(), step=0)
    items1, calls1 = normalize_reply_calls([fc("a")], {calls0[0]["call_id"]}, step=1)
    assert calls0[0]["call_id"] != calls1[0]["call_id"]
    assert calls1[0]["duplicate_of"] is None


def test_tool_output_with_undecodable_file_name_is_stored(control, gateway, script_name, homes_root):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    home = homes_root / agent
    home.mkdir(parents=True)
    with open(os.path.join(os.fsencode(home), b"bad\xffname.txt"), "w") as f:
        f.write("x")
    gateway.add_script(script_name, [{"output": [fc("list_files", '{"path": "."}')]}, {"output": [msg("ok")]}])
    turn_id = control.enqueue({"agent_id": agent, "input": "go", "model": script_name})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed
    out = [i for i in control.items(turn_id) if i["type"] == "function_call_output"][0]["output"]
    assert "bad" in out and "name.txt" in out


def test_answer_cut_at_the_token_limit_ends_incomplete(control, gateway, script_name):
    gateway.add_script(script_name, [{"status": "incomplete", "output": [msg("The answer is fo")]}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.incomplete
    assert "output-token limit" in view.error and view.final_output == "The answer is fo"


def test_cancel_while_the_model_answers_ends_cancelled(control, gateway, script_name):
    turn_id = uuid.uuid4().hex

    def answer(body):
        control.cancel(turn_id)  # the control plane cancels while this model call is in flight
        return {"output": [msg("too late")]}

    gateway.add_script(script_name, [answer])
    control.enqueue({"input": "go", "model": script_name, "toolset": "testing"}, turn_id=turn_id)
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.cancelled


def test_give_up_answers_every_call_and_hooks_are_resent(redis_url, gateway, script_name):
    import redis as redis_lib

    from tests.integration.test_idempotency import RecordingDispatcher
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine
    from worker.turn.request import TurnRequest
    from worker.turn.store import TurnStore

    settings = Settings()
    store = TurnStore(redis_lib.Redis.from_url(redis_url), progress_timeout=1.0)
    engine = TurnEngine(
        store,
        settings,
        RecordingDispatcher(),
        toolset_resolver(settings),
        SyncModelClient(RESPONSES, gateway.base_url),
        redis=store._r,
    )
    gateway.add_script(
        script_name, [{"output": [fc("read_thing", '{"label": "a"}'), fc("write_thing", '{"label": "w"}')]}]
    )
    turn_id = uuid.uuid4().hex
    # A background job's turn: its end hooks must run (a plain turn has none to send).
    request = TurnRequest(input="go", model=script_name, toolset="testing", metadata={"background_job_id": "job-1"})
    engine.create_turn(request, turn_id)
    engine.run_step(turn_id, 0)
    first = [s for s in engine.dispatcher.sent if s[0] == "batch"][0]
    engine.run_call(turn_id, 0, first[4][0])  # batch 0 ran; batch 1's message is lost
    time.sleep(1.1)
    for _ in range(3):
        engine.redrive(turn_id, max_redrives=1)
    state = store.load(turn_id)
    assert state.status == TurnStatus.failed
    items = store.items(turn_id)
    assert unanswered_call_ids(items) == []
    outs = [i["output"] for i in items if i["type"] == "function_call_output"]
    assert orjson.loads(outs[0])["label"] == "a"  # the finished call keeps its real output
    assert outs[1].startswith("Interrupted")
    assert store.is_cancelled(turn_id)  # tools still running are told to stop
    # the end hooks were sent; if that message is lost, the watchdog finds the turn again
    assert ("finished", turn_id) in engine.dispatcher.sent
    assert turn_id in store.hooks_overdue(time.time() + 61)
    store.hooks_done(turn_id)
    assert turn_id not in store.hooks_overdue(time.time() + 200)


def test_plain_turn_sends_no_end_hooks(redis_url, gateway, script_name):
    import redis as redis_lib

    from tests.integration.test_idempotency import RecordingDispatcher
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine
    from worker.turn.request import TurnRequest
    from worker.turn.store import TurnStore

    settings = Settings()
    store = TurnStore(redis_lib.Redis.from_url(redis_url), progress_timeout=60.0)
    engine = TurnEngine(
        store,
        settings,
        RecordingDispatcher(),
        toolset_resolver(settings),
        SyncModelClient(RESPONSES, gateway.base_url),
        redis=store._r,
    )
    gateway.add_script(script_name, [{"output": [{"type": "message", "text": "hi"}]}])
    turn_id = uuid.uuid4().hex
    engine.create_turn(TurnRequest(input="go", model=script_name), turn_id)
    engine.run_step(turn_id, 0)
    assert store.load(turn_id).status == TurnStatus.completed
    assert ("finished", turn_id) not in engine.dispatcher.sent  # nothing to run at its end
    assert turn_id not in store.hooks_overdue(time.time() + 200)


def test_control_plane_uses_its_own_redis(control, gateway, script_name):
    from control.client import ControlPlane
    from devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as other:
        cp = ControlPlane(other.url)
        turn_id = cp.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
        assert cp.status(turn_id).status == TurnStatus.queued
        assert control.store.load(turn_id) is None  # not in the default Redis
        import redis as redis_lib

        assert redis_lib.Redis.from_url(other.url).llen("turns") == 1  # the step message is on its broker


def test_dead_redis_after_connect_is_a_control_plane_error():
    from control.client import ControlPlane, ControlPlaneError
    from devtools.embedded_redis import EmbeddedRedis

    srv = EmbeddedRedis()
    cp = ControlPlane(srv.start())
    srv.stop()
    with pytest.raises(ControlPlaneError):
        cp.status("x")
    with pytest.raises(ControlPlaneError):
        cp.enqueue({"input": "go"})


def test_model_call_retries_back_off_with_jitter():
    """Equal jitter: retry n waits between half and all of min(60, 2**n) seconds, spread at random,
    so turns that failed together (a gateway outage) do not all retry in the same second."""
    from tasks.turns import retry_delay

    assert [retry_delay(n, rand=lambda: 0.0) for n in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert [retry_delay(n, rand=lambda: 1.0) for n in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    spread = {retry_delay(4) for _ in range(50)}
    assert len(spread) > 10 and all(8 <= d <= 16 for d in spread)
