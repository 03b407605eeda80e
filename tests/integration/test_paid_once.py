"""A model answer is paid for once, whatever happens to the node that asked for it.

- The scripted gateway speaks the Responses API's background mode as the real API does: checked
  with the ``openai`` package's own client (create, the client going away, retrieve, resume a
  stream after a sequence number, cancel, the errors).
- A turn node SIGKILLed while its call streams: with ``AGENT_MODEL_BACKGROUND=1`` the re-driven
  step fetches the response the dead node started; the gateway generated the answer once. A
  stream cut mid-way: the retry fetches the response too.
- A turn cancelled while its background call streams: the response is cancelled by id (the
  provider stops generating; closing the connection would not stop it).
- A planned stop (SIGTERM) while a call is in flight: the node waits for the call and stores its
  reply before it exits; the answer is made once and the turn goes on elsewhere.

Real workers on a private stack, the session's scripted gateway in this process.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.support.scripts import fc, msg, wait_for

BACKGROUND = {"AGENT_MODEL_BACKGROUND": "1"}
SLOW_TEXT = "a slow answer, written piece by piece. " * 8  # 40 deltas of 8 characters


def _slow_step(delay_ms: int = 100) -> dict:
    return {"output": [msg(SLOW_TEXT)], "stream_delay_ms": delay_ms, "stream_chunk": 8}


def test_background_mode_speaks_the_responses_wire(gateway, script_name):
    """The gateway's background mode through the ``openai`` client: the answer is made after the
    client went, retrieved whole and as a resumed stream, counted once; cancel and errors."""
    from openai import BadRequestError, NotFoundError, OpenAI

    gateway.add_script(script_name, [_slow_step(20), _slow_step(200)])
    client = OpenAI(base_url=gateway.base_url, api_key="test", max_retries=0)
    stream = client.responses.create(model=script_name, input="hi", background=True, store=True, stream=True)
    first = next(iter(stream))
    assert first.type == "response.created" and first.sequence_number == 0
    assert first.response.background is True and first.response.status == "queued"
    response_id = first.response.id
    stream.close()  # the client goes; the answer is still made

    done = wait_for(lambda: (r := client.responses.retrieve(response_id)).status == "completed" and r, timeout=30)
    assert done.output_text == SLOW_TEXT
    resumed = list(client.responses.retrieve(response_id, stream=True, starting_after=3))
    assert resumed[0].sequence_number == 4 and resumed[-1].type == "response.completed"
    assert resumed[-1].response.output_text == SLOW_TEXT
    assert gateway.background.generated[(script_name, "hi", 0)] == 1

    # Cancel: the generation stops, nothing more is made.
    earlier = {
        "type": "message",
        "id": "msg_s0_0",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "x"}],
    }
    history = [{"role": "user", "content": "again"}, earlier]
    queued = client.responses.create(model=script_name, input=history, background=True, store=True)  # type: ignore[arg-type]
    assert queued.status in ("queued", "in_progress")
    assert client.responses.cancel(queued.id).status == "cancelled"
    time.sleep(0.5)
    assert client.responses.retrieve(queued.id).status == "cancelled"
    assert gateway.background.generated[(script_name, "again", 1)] == 0

    with pytest.raises(NotFoundError):
        client.responses.retrieve("resp_unknown")
    with pytest.raises(BadRequestError):
        client.responses.create(model=script_name, input="hi", background=True, store=False)


def test_two_deliveries_that_find_the_same_dead_holder_take_the_step_over_once(redis_url):
    """A re-drive and a message given back, both read the step claimed by a dead node: one takes it
    over (and its node holds the turn), the other drops; before, both made the call (the soak saw
    two answers made 10 ms apart for one step, background mode or not)."""
    import uuid

    import redis

    from worker.turn.store import TurnStore

    store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60)
    tid = uuid.uuid4().hex
    store.create(tid, {"agent_id": "takeover-a", "input": "x"}, [])
    held = f"agent:node:test-{tid}:tasks"
    assert store.claims.begin_step(tid, 0, "dead-owner", 30, held).claim.holder is None
    first = store.claims.begin_step(tid, 0, "owner-1", 30, held)
    second = store.claims.begin_step(tid, 0, "owner-2", 30, held)
    assert first.claim.holder == second.claim.holder == "dead-owner"
    assert store.claims.take_over_step(tid, 0, "owner-1", 30, "dead-owner", held) is True
    assert store.claims.take_over_step(tid, 0, "owner-2", 30, "dead-owner", held) is False
    assert store.claims.begin_step(tid, 0, "owner-3", 30, held).claim.holder == "owner-1"


def _run_until_streaming(stack, gateway, script_name: str, agent: str) -> tuple[str, str]:
    """Enqueue a turn whose first answer streams slowly; its id and its background response id,
    once the node has recorded it (a moment after ``response.created``)."""
    before = set(gateway.background.responses)
    tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"})
    gen = wait_for(
        lambda: next((g for i, g in gateway.background.responses.items() if i not in before and g.payload["model"] == script_name), None),
        timeout=60,
    )  # fmt: skip
    wait_for(lambda: len(gen.frames) > 8, timeout=30)  # deltas streamed; the id was recorded long before
    return tid, gen.id


def test_a_killed_node_s_call_is_fetched_not_paid_again(stack, gateway, script_name):
    """SIGKILL of the node while its background call streams: the heartbeat path re-drives the
    step on another node, which fetches the response by its recorded id; one generation, one
    creating request, the whole answer in the turn."""
    gateway.add_script(script_name, [_slow_step(100), {"output": [msg("second")]}])
    doomed = stack.start_worker(env=BACKGROUND)
    stack.start_beat()
    tid, response_id = _run_until_streaming(stack, gateway, script_name, "bg-kill")
    stack.kill(doomed)
    stack.start_worker(env=BACKGROUND)
    view = stack.control.wait(tid, timeout=90)
    assert view.status.value == "completed", view
    assert [r for r in gateway.requests if r.get("model") == script_name][0]["background"] is True
    assert sum(1 for r in gateway.requests if r.get("model") == script_name) == 1  # one created, then fetched
    assert gateway.background.generated[(script_name, "go", 0)] == 1
    replies = [e for e in stack.control.events(tid) if e.get("kind") == "model_reply"]
    assert len(replies) == 1 and replies[0]["text"].startswith("a slow answer")
    assert gateway.background.responses[response_id].status == "completed"


def test_a_cut_stream_is_resumed_by_id_not_paid_again(stack, gateway, script_name):
    """The creating stream is cut after 5 deltas (a proxy or the network): the step's retry
    fetches the response it started; one generation, one creating request."""
    gateway.add_script(script_name, [{**_slow_step(30), "stream_break_after": 5}])
    stack.start_worker(env=BACKGROUND)
    tid = stack.control.enqueue({"agent_id": "bg-cut", "input": "go", "model": script_name})
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == SLOW_TEXT
    assert sum(1 for r in gateway.requests if r.get("model") == script_name) == 1
    assert gateway.background.generated[(script_name, "go", 0)] == 1
    assert any(e.get("kind") == "model_retry" for e in stack.control.events(tid))


def test_a_cancelled_turn_cancels_its_background_response(stack, gateway, script_name):
    """The cancel watch aborts the call and cancels the response by id: the provider stops."""
    gateway.add_script(script_name, [_slow_step(150)])
    stack.start_worker(env={**BACKGROUND, "AGENT_MODEL_CANCEL_POLL": "0.2"})
    tid, response_id = _run_until_streaming(stack, gateway, script_name, "bg-cancel")
    assert stack.control.cancel(tid)
    assert stack.control.wait(tid, timeout=30).status.value == "cancelled"
    wait_for(lambda: response_id in gateway.background.cancelled, timeout=10)
    assert gateway.background.responses[response_id].status == "cancelled"
    assert gateway.background.generated[(script_name, "go", 0)] == 0


def test_a_planned_stop_waits_for_the_call_in_flight(stack, gateway, script_name):
    """SIGTERM while the first answer is being made (12 s): the node keeps its heartbeat, waits for
    the call, stores the reply and sends the tool call on, then exits; another node finishes the
    turn. The answer was asked for once (before, the node handed the call on after 8 s and the
    next node paid for it again)."""
    calls = []
    started = threading.Event()

    def slow(body: dict) -> dict:
        calls.append(time.time())
        started.set()
        time.sleep(12)  # longer than the 8 s a stopping node used to wait
        return {"output": [fc("read_thing", {"label": "x"})]}

    gateway.add_script(script_name, [slow, {"output": [msg("after the stop")]}])
    stopping = stack.start_worker(queues="turns")
    tid = stack.control.enqueue({"agent_id": "drain-b", "input": "go", "model": script_name, "toolset": "testing"})
    assert started.wait(60)
    os.killpg(stopping.pid, signal.SIGTERM)
    assert stopping.wait(60) == 0
    stopped_at = time.time()
    stack.start_worker()
    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "after the stop"
    assert len(calls) == 1, calls  # the first answer was asked for once
    replies = [e for e in stack.control.events(tid) if e.get("kind") == "model_reply"]
    assert len(replies) == 2, replies
    assert float(replies[0]["at"]) < stopped_at  # stored by the stopping node, before it exited
