"""The model's output streamed as it is written (issue 13, item 5): server-sent events from the
scripted gateway (real event names and shapes), deltas batched into the turn's event stream,
the reply memoized as before, a cut stream retried, a non-streaming endpoint still served."""

from __future__ import annotations

import uuid

import pytest
import redis
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from devtools.scripted_gateway import ScriptedGateway
from devtools.sse_script import sse_events
from tests.integration.test_idempotency import RecordingDispatcher
from tests.support.scripts import fc, msg
from worker.model.interface import Delta, GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.streaming import DeltaBatcher, stream_reply
from worker.model.sync_client import SyncModelClient
from worker.model.wire_styles import WIRE_STYLES
from worker.settings import Settings
from worker.tools.toolsets import toolset_resolver
from worker.turn.engine import TurnEngine
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.store import TurnStore


@pytest.fixture
def control(styled_control):
    """The end-to-end tests here run in both wire styles (``styled_control``, tests/conftest.py)."""
    return styled_control


def client_for(api_style: str, base_url: str):
    """The model client a worker in ``api_style`` uses, on ``base_url``."""
    return SyncModelClient(WIRE_STYLES[api_style], base_url)


TEXT = (
    "Streaming lets a person read the answer while the model is still writing it; "
    "every piece below arrives as its own delta, in order, and together they make the final text."
)


def test_text_deltas_arrive_in_order_before_the_step_ends(control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg(TEXT)], "stream_chunk": 5, "stream_delay_ms": 2}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=30)
    assert view.status == TurnStatus.completed and view.final_output == TEXT
    events = control.events(turn_id)
    order = [e["kind"] for e in events]
    deltas = [e for e in events if e["kind"] == "model_delta"]
    assert deltas, "the worker streamed"
    assert max(i for i, k in enumerate(order) if k == "model_delta") < order.index("model_reply")
    assert [d["seq"] for d in deltas] == list(range(len(deltas)))
    assert len({d["attempt"] for d in deltas}) == 1
    assert "".join(d["delta"] for d in deltas if d["type"] == "text") == TEXT
    assert [b.get("stream") for b in gateway.requests if b["model"] == script_name] == [True]


def test_function_call_argument_deltas_carry_the_call(control, gateway, script_name):
    args = '{"label": "streamed-arguments", "ms": 1}'
    gateway.add_script(script_name, [{"output": [fc("read_thing", args)], "stream_chunk": 4}, {"output": [msg("ok")]}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    deltas = [e for e in control.events(turn_id) if e["kind"] == "model_delta"]
    arg_deltas = [d for d in deltas if d["type"] == "arguments"]
    [call] = [i for i in control.items(turn_id) if i["type"] == "function_call"]
    assert "".join(d["delta"] for d in arg_deltas) == args
    assert {(d["call_id"], d["name"]) for d in arg_deltas} == {(call["call_id"], "read_thing")}


def test_a_stream_cut_mid_way_is_retried_and_the_reader_can_tell(control, gateway, script_name):
    served = []

    def step(body):
        served.append(1)
        # The first answer breaks after three deltas, without a terminal event.
        return {"output": [msg(TEXT)], "stream_chunk": 8, "stream_break_after": 3 if len(served) == 1 else None}

    gateway.add_script(script_name, [step])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=60)
    assert view.status == TurnStatus.completed and view.final_output == TEXT
    assert len(served) == 2
    events = control.events(turn_id)
    [broken] = [e for e in events if e["kind"] == "model_stream_broken"]
    assert "model stream ended before" in broken["error"]  # response.completed / a finish_reason
    assert [e["kind"] for e in events].count("model_retry") == 1
    deltas = [e for e in events if e["kind"] == "model_delta"]
    first, second = broken["attempt"], {d["attempt"] for d in deltas} - {broken["attempt"]}
    assert "".join(d["delta"] for d in deltas if d["attempt"] == first) == TEXT[:24]
    [second] = second
    assert "".join(d["delta"] for d in deltas if d["attempt"] == second) == TEXT


def test_a_streamed_incomplete_answer_follows_the_incomplete_rule(control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("The answer stops here bec")], "status": "incomplete"}])
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    view = control.wait(turn_id, timeout=30)
    assert view.status == TurnStatus.incomplete and "output-token limit" in view.error


@pytest.fixture
def engine(redis_url, gateway, api_style):
    settings = Settings()
    store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60.0)
    client = client_for(api_style, gateway.base_url)
    return TurnEngine(store, settings, RecordingDispatcher(), toolset_resolver(settings), client, redis=store._r)


def test_a_redelivered_step_uses_the_memoized_reply(engine, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg(TEXT)]}])
    turn_id = uuid.uuid4().hex
    engine.create_turn(TurnRequest(input="go", model=script_name, toolset="testing"), turn_id)
    # a first delivery streamed the whole reply, memoized it, and died before recording the turn's end
    request = ModelRequest(model=script_name, input=engine.store.items(turn_id))
    reply = stream_reply(engine.client, request, lambda evs: engine.store.add_events(turn_id, evs), step=0)
    engine.store.memo.save(turn_id, 0, reply.to_json())
    n = len(gateway.requests)
    assert engine.run_step(turn_id, 0).action == "completed"
    assert len(gateway.requests) == n, "no second model call"
    assert engine.store.load(turn_id).final_output == TEXT


def test_an_endpoint_without_streaming_still_works(redis_url, api_style):
    plain = ScriptedGateway({"plain": [{"output": [msg("a whole answer at once")]}]}, streaming=False).start()
    try:
        settings = Settings()
        store = TurnStore(redis.Redis.from_url(redis_url), progress_timeout=60.0)
        client = client_for(api_style, plain.base_url)
        eng = TurnEngine(store, settings, RecordingDispatcher(), toolset_resolver(settings), client, redis=store._r)
        turn_id = uuid.uuid4().hex
        eng.create_turn(TurnRequest(input="go", model="plain", toolset="testing"), turn_id)
        assert eng.run_step(turn_id, 0).action == "completed"
        assert plain.requests[-1]["stream"] is True, "asked to stream; the endpoint answered JSON"
        assert store.load(turn_id).final_output == "a whole answer at once"
        assert not [e for _, e in store.events(turn_id) if e["kind"] == "model_delta"]
    finally:
        plain.stop()


def test_gateway_events_are_the_real_typed_events(gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("hi there"), fc("read_thing", '{"label": "x"}')]}])
    _, payload, _ = gateway.respond_step({"model": script_name, "input": "go"})
    adapter = TypeAdapter(ResponseStreamEvent)
    events = list(sse_events(payload, chunk=3))
    typed = [adapter.validate_python(e) for e in events]
    names = [type(t).__name__ for t in typed]
    assert names[0] == "ResponseCreatedEvent" and names[-1] == "ResponseCompletedEvent"
    assert "ResponseTextDeltaEvent" in names and "ResponseFunctionCallArgumentsDeltaEvent" in names
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # the guard: a broken event is refused by the typed models
    with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
        adapter.validate_python({"type": "response.output_text.delta", "sequence_number": 0})


def test_batcher_joins_deltas_and_flushes_at_close():
    published: list = []
    b = DeltaBatcher(published.extend, step=3, interval=60.0)
    for piece in ("a", "b", "c"):
        b.add(Delta("text", 0, piece))
    b.add(Delta("arguments", 1, '{"x"', "c1", "t"))
    b.add(Delta("arguments", 1, ": 1}", "c1", "t"))
    b.close()
    # the first delta goes at once (time to first token); the rest is joined per item and kind
    assert [(e["type"], e["delta"], e["seq"]) for _, e in published] == [
        ("text", "a", 0),
        ("text", "bc", 1),
        ("arguments", '{"x": 1}', 2),
    ]
    assert all(kind == "model_delta" and e["step"] == 3 for kind, e in published)


def test_the_last_deltas_can_be_handed_to_the_caller_instead_of_published():
    """``stream_reply_async(rest=...)``: what is pending when the reply is complete goes to the
    caller (which appends it with the reply in one round trip), numbered after what was published.
    The interval runs from the call's start: a delta that comes later than that is published as
    soon as the stream yields to the loop (its next read); a reply that completes within the
    interval publishes nothing on its own."""
    import asyncio

    from worker.model.interface import ModelReply
    from worker.model.streaming import stream_reply_async

    def run(reads: list[tuple[float, list[str]]], interval: float) -> tuple[list, list, list]:
        published: list = []
        rest: list = []
        before_read: list = []  # what was published when each read came

        async def stream(request, on_delta):
            for pause, read in reads:
                if pause:
                    await asyncio.sleep(pause)  # the model's pause: the loop runs
                before_read.append([e["delta"] for _, e in published])
                for piece in read:
                    on_delta(Delta("text", 0, piece))
            return ModelReply(id="r", status="completed", output=[], usage={})

        async def main() -> None:
            loop = asyncio.get_running_loop()
            await stream_reply_async(
                stream,
                None,
                published.extend,
                step=2,
                interval=interval,
                schedule=lambda delay, fn: loop.call_later(delay, fn).cancel,
                rest=rest,
            )

        asyncio.run(main())
        return published, rest, before_read

    # a first token later than the interval: out at the stream's next yield, before the next read
    published, rest, before_read = run([(0.05, ["a", "b"]), (0.005, ["c"])], interval=0.02)
    assert before_read == [[], ["ab"]]
    assert [(e["delta"], e["seq"]) for _, e in published] == [("ab", 0)]
    assert [(kind, e["delta"], e["seq"], e["step"]) for kind, e in rest] == [("model_delta", "c", 1, 2)]
    # a first token sooner than the interval: published when the interval has run
    published, rest, before_read = run([(0, ["a"]), (0.08, ["b"])], interval=0.03)
    assert before_read == [[], ["a"]]
    assert [(kind, e["delta"], e["seq"]) for kind, e in rest] == [("model_delta", "b", 1)]
    # a reply complete within the interval: every delta goes with it
    published, rest, _ = run([(0, ["a", "b"]), (0.001, ["c"])], interval=60.0)
    assert published == []
    assert [(kind, e["delta"], e["seq"]) for kind, e in rest] == [("model_delta", "abc", 0)]


def test_events_the_reply_does_not_need_are_not_parsed():
    """``response.created`` / ``response.in_progress`` echo the request (tools, instructions): the
    Responses reader skips their JSON by the event's name; events it needs are still checked."""
    from worker.model.responses import ResponsesStream

    seen: list = []
    stream = ResponsesStream(seen.append)
    assert stream.feed("response.created", "{not json, and never read") is None
    assert stream.feed("response.in_progress", "[]") is None
    stream.feed(
        "response.output_text.delta", '{"type": "response.output_text.delta", "output_index": 0, "delta": "hi"}'
    )
    assert [d.text for d in seen] == ["hi"]
    with pytest.raises(GatewayError, match="non-JSON event"):
        stream.feed("response.output_text.delta", "{not json")
    with pytest.raises(GatewayError, match="non-JSON event"):
        stream.feed("", "{not json")  # no event name (llama.cpp): always read


def test_gateway_failures_map_to_gateway_errors(gateway):
    client = SyncModelClient(RESPONSES, gateway.base_url)
    request = ModelRequest(model="no-such-script", input=[{"type": "message", "role": "user", "content": "go"}])
    with pytest.raises(GatewayError) as info:
        stream_reply(client, request, lambda evs: None, step=0)
    assert info.value.status_code == 404 and not info.value.retryable


def test_transcript_prints_the_streamed_text_once_as_written(control, gateway, script_name):
    import io

    from rich.console import Console

    from control.transcript import print_transcript

    intro = "First I read the thing, then I answer."
    gateway.add_script(
        script_name,
        [{"output": [msg(intro), fc("read_thing", {"label": "t"})], "stream_chunk": 4}, {"output": [msg(TEXT)]}],
    )
    turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
    out = io.StringIO()
    final = print_transcript(control, turn_id, Console(file=out, width=1000), follow=True, timeout=30)
    assert final["status"] == "completed"
    text = out.getvalue()
    assert text.count(intro) == 1, "streamed text is not printed again with the model call's summary"
    assert f"model: {intro}" in text and f"model: {TEXT}" in text


@pytest.mark.parametrize("style", ["responses", "chat"])
@pytest.mark.parametrize(
    ("error", "retryable"),
    [
        (
            {
                "code": 500,
                "message": "The model produced output that does not match the format",
                "type": "server_error",
            },
            True,
        ),
        (
            {"code": 400, "message": "the request exceeds the available context size", "type": "invalid_request_error"},
            False,
        ),
    ],
)
def test_a_bare_error_object_mid_stream_is_the_servers_error(gateway, script_name, style, error, retryable):
    """llama.cpp's server ends a stream that failed mid-way with ``data: {"error": {...}}`` in either
    style: the client raises with the server's message, retryable unless the request is wrong."""
    gateway.add_script(script_name, [{"output": [msg(TEXT)], "stream_error": error, "stream_error_after": 2}])
    request = ModelRequest(model=script_name, input=[{"type": "message", "role": "user", "content": "go"}])
    published: list = []
    with pytest.raises(GatewayError) as info:
        stream_reply(client_for(style, gateway.base_url), request, published.extend, step=0)
    assert error["message"] in str(info.value) and error["type"] in str(info.value)
    assert info.value.retryable is retryable
    kinds = [kind for kind, _ in published]
    assert kinds.count("model_delta") >= 1 and kinds[-1] == "model_stream_broken"
