"""A model answer is read up to ``max_reply_bytes`` (``AGENT_MODEL_MAX_REPLY_BYTES``,
``worker.model.http_pool.ReplySize``) by every client, synchronous and asynchronous, whole or
streamed: past it the call fails with a ``GatewayError`` that is not retried and names the
setting, and the rest is never read. Against the scripted gateway (a real reply too big) and a
local server that never stops sending, or declares a body of a terabyte."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from devtools.scripted_gateway import ScriptedGateway
from tests.support.loopback import LoopbackServer
from worker.model.async_client import AsyncModelClient
from worker.model.chat import CHAT
from worker.model.interface import GatewayError, ModelRequest
from worker.model.responses import RESPONSES
from worker.model.sync_client import SyncModelClient

BIG = "x" * 300_000
SCRIPTS = {"big": [{"output": [{"type": "message", "text": BIG}]}] * 20}
CLIENTS = {
    "responses-sync": lambda url, cap: SyncModelClient(RESPONSES, url, max_reply_bytes=cap, timeout=10),
    "chat-sync": lambda url, cap: SyncModelClient(CHAT, url, max_reply_bytes=cap, timeout=10),
    "responses-async": lambda url, cap: AsyncModelClient(RESPONSES, url, max_reply_bytes=cap, timeout=10),
    "chat-async": lambda url, cap: AsyncModelClient(CHAT, url, max_reply_bytes=cap, timeout=10),
}


def _request(model: str = "big") -> ModelRequest:
    return ModelRequest(model=model, input=[{"role": "user", "content": "hi"}])


def _call(client, streamed: bool):
    """One call, whole or streamed, with a synchronous or an asynchronous client."""
    if isinstance(client, AsyncModelClient):

        async def run():
            try:
                if streamed:
                    return await client.stream(_request(), lambda d: None)
                return await client.create(_request())
            finally:
                await client.aclose()

        return asyncio.run(run())
    try:
        return client.stream(_request(), lambda d: None) if streamed else client.create(_request())
    finally:
        client.close()


@pytest.fixture(scope="module")
def gateway():
    gw = ScriptedGateway(SCRIPTS).start()
    yield gw
    gw.stop()


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", CLIENTS)
def test_an_answer_above_the_cap_fails_not_retryable_and_one_below_is_read(gateway, kind, streamed):
    reply = _call(CLIENTS[kind](gateway.base_url, 20_000_000), streamed)  # streamed: ~15x the text
    assert reply.text == BIG
    with pytest.raises(GatewayError) as too_big:
        _call(CLIENTS[kind](gateway.base_url, 100_000), streamed)
    assert not too_big.value.retryable
    assert "larger than 100000 bytes" in str(too_big.value) and "AGENT_MODEL_MAX_REPLY_BYTES" in str(too_big.value)


class _Flood(LoopbackServer):
    """A local HTTP server whose every answer is ``head`` then ``chunk`` forever (until the client
    goes); ``sent`` counts the bytes it managed to send, per connection."""

    def __init__(self, head: bytes, chunk: bytes):
        self.head, self.chunk = head, chunk
        self.sent: list[int] = []
        super().__init__(self._answer)

    def _answer(self, conn: socket.socket) -> None:
        conn.recv(65536)
        index = len(self.sent)
        self.sent.append(0)
        try:
            conn.sendall(self.head)
            while not self.stopped.is_set() and self.sent[index] < 1_000_000_000:
                conn.sendall(self.chunk)
                self.sent[index] += len(self.chunk)
        except OSError:
            pass
        finally:
            conn.close()


FLOODS = {
    # An event stream that never ends: one delta after another.
    "endless-events": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        lambda: _chunked(
            b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"'
            + b"y" * 8000
            + b'"}\n\n'
        ),  # fmt: skip
    ),
    # A JSON body that never ends.
    "endless-body": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        lambda: _chunked(b"[" * 8000),
    ),
    # A body declared a terabyte long: refused before it is read.
    "declared-terabyte": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000000000\r\n\r\n",
        lambda: b" " * 8000,
    ),
}


def _chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@pytest.mark.parametrize("flood", FLOODS)
@pytest.mark.parametrize("kind", CLIENTS)
def test_a_gateway_that_never_stops_sending_is_cut_at_the_cap(kind, flood):
    head, chunk = FLOODS[flood]
    server = _Flood(head, chunk())
    try:
        started = time.monotonic()
        with pytest.raises(GatewayError) as too_big:
            _call(CLIENTS[kind](server.base_url, 1_000_000), streamed=flood == "endless-events")
        assert not too_big.value.retryable and "AGENT_MODEL_MAX_REPLY_BYTES" in str(too_big.value)
        assert time.monotonic() - started < 8  # not the read timeout (10 s), nor a gigabyte later
        time.sleep(0.3)
        # The client stopped reading at the cap: the server could not send much more than the cap
        # plus what the sockets' buffers hold.
        assert server.sent and max(server.sent) < 20_000_000
    finally:
        server.stop()


@pytest.mark.parametrize("kind", CLIENTS)
def test_an_error_answer_is_read_only_as_far_as_its_message_needs(kind):
    server = _Flood(
        b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
        _chunked(b"boom " * 2000),
    )
    try:
        with pytest.raises(GatewayError) as failed:
            _call(CLIENTS[kind](server.base_url, 1_000_000), streamed=False)
        assert failed.value.retryable and failed.value.status_code == 500
        assert "boom" in str(failed.value) and len(str(failed.value)) < 1000
    finally:
        server.stop()
