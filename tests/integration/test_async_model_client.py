"""The asynchronous model client (``worker.model.async_client``) against the scripted gateway in
both wire styles and against a keep-alive endpoint (``devtools.hosted_endpoint``, Responses):
the same replies and deltas as the synchronous client, an event far bigger than a line buffer,
hundreds of calls on one loop, and each failure as the ``GatewayError`` the retry rule expects.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from devtools.async_endpoint import AsyncEndpoint
from devtools.hosted_endpoint import HostedEndpoint
from devtools.ports import free_port
from devtools.scripted_gateway import ScriptedGateway
from worker.model.async_client import AsyncModelClient, SentOnce
from worker.model.interface import Delta, GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient
from worker.model.wire_styles import WIRE_STYLES

BIG = "x" * 200_000  # one streamed event (response.completed) far above aiohttp's 64 KiB line limit
STEP = {
    "output": [{"type": "message", "text": "hello"}, {"type": "function_call", "name": "f", "arguments": '{"a": 1}'}]
}


SCRIPTS = {
    "m": [STEP] * 1000,
    "big": [{"output": [{"type": "message", "text": BIG}]}] * 10,
    "cut": [{"output": [{"type": "message", "text": "a" * 500}], "stream_break_after": 3}],
}


@pytest.fixture
def endpoint():
    """Keep-alive HTTP/1.1, as a hosted API (Responses only)."""
    ep = HostedEndpoint(ScriptedGateway(SCRIPTS)).start()
    yield ep
    ep.stop()


@pytest.fixture
def gateway():
    """The scripted gateway itself: both wire styles, a connection per request."""
    gw = ScriptedGateway(SCRIPTS).start()
    yield gw
    gw.stop()


def _request(model: str = "m") -> ModelRequest:
    return ModelRequest(model=model, input=[{"role": "user", "content": "hi"}])


def _run(coro):
    return asyncio.run(coro)


async def _with(client: AsyncModelClient, coro_fn):
    try:
        return await coro_fn(client)
    finally:
        await client.aclose()


@pytest.mark.parametrize("style", WIRE_STYLES)
def test_create_and_stream_match_the_synchronous_client(gateway, style):
    wire = WIRE_STYLES[style]
    base = gateway.base_url
    expected = SyncModelClient(wire, base).create(_request())
    deltas: list[Delta] = []

    async def both(client):
        return await client.create(_request()), await client.stream(_request(), deltas.append)

    whole, streamed = _run(_with(AsyncModelClient(wire, base), both))
    assert whole.output == expected.output and streamed.output == expected.output
    assert whole.function_calls[0]["arguments"] == '{"a": 1}' and whole.text == "hello"
    assert "".join(d.text for d in deltas if d.kind == "text") == "hello"
    assert "".join(d.text for d in deltas if d.kind == "arguments") == '{"a": 1}'
    assert streamed.usage and streamed.usage.get("output_tokens")


@pytest.mark.parametrize("style", WIRE_STYLES)
def test_an_event_bigger_than_a_line_buffer_arrives_whole(gateway, endpoint, style):
    wire = WIRE_STYLES[style]
    for base in (gateway.base_url, endpoint.base_url) if style == "responses" else (gateway.base_url,):
        reply = _run(_with(AsyncModelClient(wire, base), lambda c: c.stream(_request("big"), lambda d: None)))
        assert reply.text == BIG


def test_hundreds_of_calls_at_once_on_one_loop(endpoint):
    endpoint.latency = 0.3

    async def many(client):
        return await asyncio.gather(*[client.create(_request()) for _ in range(300)])

    replies = _run(_with(AsyncModelClient(RESPONSES, endpoint.base_url), many))
    assert len(replies) == 300 and all(r.text == "hello" for r in replies)


def test_failures_map_to_gateway_errors(endpoint):
    async def unknown_model(client):
        return await client.create(_request("no-such-script"))

    with pytest.raises(GatewayError) as refused:
        _run(_with(AsyncModelClient(RESPONSES, endpoint.base_url), unknown_model))
    assert refused.value.status_code == 404 and not refused.value.retryable

    closed = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(GatewayError) as unreachable:
        _run(_with(AsyncModelClient(RESPONSES, closed), lambda c: c.create(_request())))
    assert unreachable.value.retryable and unreachable.value.status_code is None

    endpoint.latency = 1.5
    for call in (lambda c: c.create(_request()), lambda c: c.stream(_request(), lambda d: None)):
        with pytest.raises(GatewayError) as slow:
            _run(_with(AsyncModelClient(RESPONSES, endpoint.base_url, timeout=0.3), call))
        assert slow.value.retryable and "timed out" in str(slow.value)


@pytest.mark.parametrize("style", WIRE_STYLES)
def test_a_stream_cut_midway_is_retryable(gateway, style):
    wire = WIRE_STYLES[style]
    seen: list[Delta] = []
    with pytest.raises(GatewayError) as cut:
        _run(_with(AsyncModelClient(wire, gateway.base_url), lambda c: c.stream(_request("cut"), seen.append)))
    assert cut.value.retryable and seen


def test_a_waiting_call_holds_no_request_body():
    """The body reaches the server whole (the script's reply comes back), and while the answer is
    awaited the client's payload (``SentOnce``) holds none of its bytes: aiohttp keeps a request's
    payload until the response arrives, which for a model may be minutes."""
    ep = AsyncEndpoint(ScriptedGateway(SCRIPTS), latency=1.0).start()
    history = [{"role": "user", "content": "z" * 300_000}]

    async def call(client):
        for n, make in enumerate((client.create, lambda request: client.stream(request, lambda d: None))):
            task = asyncio.ensure_future(make(ModelRequest(model="m", input=history)))
            while ep.answered <= n:  # until the server has read the whole body
                await asyncio.sleep(0.01)
            bodies = [o for o in gc.get_objects() if isinstance(o, SentOnce)]
            assert len(bodies) == 1 and bodies[0].size > 300_000 and bodies[0].decode() == ""
            del bodies
            assert (await task).text == "hello"

    try:
        _run(_with(AsyncModelClient(RESPONSES, ep.base_url), call))
    finally:
        ep.stop()
    assert ep.answered == 2


def test_a_call_redirected_307_or_308_sends_its_whole_body_again(gateway):
    """An endpoint that answers a model call with 307 or 308 (a gateway that moved, a path with a
    trailing slash) gets the same POST again at its new place, as before the body was let go once
    written: the body is made again for the second write, whole (the gateway parses it and
    answers from its script), not refused as a payload already consumed."""
    from aiohttp import web

    async def call() -> None:
        app = web.Application()

        async def moved(request: web.Request) -> web.Response:
            status = 307 if request.path.endswith("307" + RESPONSES.path) else 308
            return web.Response(status=status, headers={"Location": gateway.base_url + RESPONSES.path})

        app.router.add_post("/{hop}" + RESPONSES.path, moved)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            for hop in ("307", "308"):
                client = AsyncModelClient(RESPONSES, f"http://127.0.0.1:{port}/{hop}")
                try:
                    assert (await client.create(_request())).text == "hello"
                    assert (await client.stream(_request(), lambda d: None)).text == "hello"
                finally:
                    await client.aclose()
        finally:
            await runner.cleanup()

    _run(call())
