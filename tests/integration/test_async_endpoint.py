"""The hosted-like endpoint on one event loop (``devtools.async_endpoint``) that ``bench/inflight.py``
serves the model from: the Responses wire the runtime's asynchronous client reads (the same reply
streamed or not), a thousand streams held at once, and a burst beyond the client's pool waiting for
a connection instead of failing as a timeout (``worker.model.async_client``)."""

from __future__ import annotations

import asyncio

import pytest

from devtools.async_endpoint import AsyncEndpoint
from devtools.scripted_gateway import ScriptedGateway
from worker.model.async_client import AsyncModelClient
from worker.model.interface import Delta, ModelRequest
from worker.model.responses import RESPONSES

STEP = {
    "output": [{"type": "message", "text": "hello"}, {"type": "function_call", "name": "f", "arguments": '{"a": 1}'}]
}


@pytest.fixture
def endpoint():
    ep = AsyncEndpoint(ScriptedGateway({"m": [STEP] * 10})).start()
    yield ep
    ep.stop()


def _request() -> ModelRequest:
    return ModelRequest(model="m", input=[{"role": "user", "content": "hi"}])


async def _with(client: AsyncModelClient, coro_fn):
    try:
        return await coro_fn(client)
    finally:
        await client.aclose()


def test_streamed_and_whole_answers_are_the_same_reply(endpoint):
    deltas: list[Delta] = []

    async def both(client):
        return await client.create(_request()), await client.stream(_request(), deltas.append)

    whole, streamed = asyncio.run(_with(AsyncModelClient(RESPONSES, endpoint.base_url), both))
    assert streamed.output == whole.output and streamed.text == "hello"
    assert "".join(d.text for d in deltas if d.kind == "text") == "hello"
    assert endpoint.stats()["answered"] == 2 and endpoint.connections == 1  # kept alive


def test_a_thousand_streams_are_held_at_once(endpoint):
    endpoint.latency = 2.0

    async def many(client):
        return await asyncio.gather(*[client.stream(_request(), lambda d: None) for _ in range(1000)])

    replies = asyncio.run(_with(AsyncModelClient(RESPONSES, endpoint.base_url), many))
    assert len(replies) == 1000 and all(r.text == "hello" for r in replies)
    assert endpoint.peak_in_flight == 1000


def test_calls_beyond_the_pool_wait_for_a_connection_not_a_timeout(endpoint):
    # Two connections, six calls of 1 s: four wait about 1 s and 2 s for a connection, longer than
    # the 0.3 s connect timeout (which counted that wait before: "model call timed out").
    endpoint.latency = 1.0
    client = AsyncModelClient(RESPONSES, endpoint.base_url, max_connections=2, connect_timeout=0.3, deadline=30)

    async def six(client):
        return await asyncio.gather(*[client.create(_request()) for _ in range(6)])

    replies = asyncio.run(_with(client, six))
    assert [r.text for r in replies] == ["hello"] * 6
    assert endpoint.peak_in_flight == 2
