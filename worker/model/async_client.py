"""The asynchronous model client: a model call as a coroutine, so a waiting call holds no thread.

``AsyncModelClient(wire, base_url, ...)`` makes calls of one wire API (``worker.model.wire_format``:
``responses.RESPONSES`` or ``chat.CHAT``) on ``httpx.AsyncClient``; ``create`` and ``stream`` are
the coroutine forms of ``ModelClient``'s, with the same request, reply, deltas and ``GatewayError``
mapping (``worker.model.http_pool``: the same retry rule). One instance per event loop: its
connection pools belong to the loop that first used them. Thousands of calls in flight cost a
socket and a coroutine each (memory), not a thread (docs/architecture.md, "Model calls off the
worker's threads").

The connections are split over small pools (``SHARD_CONNECTIONS`` each, requests dealt round
robin): httpcore's async pool walks all its connections, polling each socket, every time a
request starts or a response closes, so one pool of a thousand keep-alive connections spent most
of a node's CPU in that walk (bench/README.md, "Model calls off the worker's threads").

``async_model_client(settings)`` builds the client of ``OPENAI_API_STYLE`` (``worker.settings``).
"""

from __future__ import annotations

import itertools
import math
import ssl

import certifi
import httpx
import orjson
from httpx_sse import aconnect_sse

from worker.model.chat import CHAT
from worker.model.http_pool import status_error, transport_error
from worker.model.interface import ModelReply, ModelRequest, OnDelta
from worker.model.responses import RESPONSES
from worker.model.wire_format import WireFormat
from worker.settings import Settings

SHARD_CONNECTIONS = 16  # connections per pool: the cost of httpcore's per-request pool walk


class AsyncModelClient:
    """Coroutine model calls of ``wire`` at ``base_url`` (like ``https://api.openai.com/v1``).

    ``timeout`` and ``connect_timeout`` in seconds; ``max_connections``: the cap over all pools
    (calls beyond a pool's share wait for one of its connections, up to ``timeout``). The API key
    is sent as a bearer token and never logged. ``transport`` (tests) replaces the network.
    """

    def __init__(
        self,
        wire: WireFormat,
        base_url: str,
        api_key: str = "",
        *,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_connections: int = 2048,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        self.wire = wire
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        per_pool = min(SHARD_CONNECTIONS, max_connections)
        self._size = max(1, math.ceil(max_connections / per_pool))
        self._kwargs = {
            "base_url": base_url.rstrip("/"),
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=connect_timeout),
            "limits": httpx.Limits(max_connections=per_pool, max_keepalive_connections=per_pool),
        }
        self._transport = transport
        self._pools: list[httpx.AsyncClient] = []
        self._turn = itertools.count()

    @property
    def http(self) -> httpx.AsyncClient:
        """The next pooled ``httpx.AsyncClient``, round robin (made on first use, on the calling loop)."""
        if not self._pools:
            tls = ssl.create_default_context(cafile=certifi.where())
            self._pools = [
                httpx.AsyncClient(**self._kwargs, transport=self._transport, verify=tls)  # type: ignore[arg-type]
                for _ in range(self._size)
            ]
        return self._pools[next(self._turn) % self._size]

    async def create(self, request: ModelRequest) -> ModelReply:
        """POST the request; the parsed reply. Raises ``GatewayError``."""
        wire = self.wire
        try:
            resp = await self.http.post(wire.path, content=orjson.dumps(wire.body(request)))
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=False) from exc
        if resp.status_code >= 400:
            raise status_error(resp)
        return wire.parse(resp.content)

    async def stream(self, request: ModelRequest, on_delta: OnDelta) -> ModelReply:
        """POST the request streamed; ``on_delta`` (called on the loop) gets each piece in order.
        An endpoint that cannot stream answers whole. Raises ``GatewayError``."""
        wire = self.wire
        try:
            body = orjson.dumps(wire.stream_body(request))
            async with aconnect_sse(self.http, "POST", wire.path, content=body) as source:
                resp = source.response
                if resp.status_code >= 400:
                    await resp.aread()
                    raise status_error(resp)
                if "text/event-stream" not in resp.headers.get("content-type", ""):
                    await resp.aread()
                    return wire.parse(resp.content)
                reader = wire.reader(on_delta)
                events = source.aiter_sse()
                async for sse in events:
                    reply = reader.feed(sse.event, sse.data)
                    if reply is not None:
                        async for _ in events:  # to the end: the connection goes back to the pool clean
                            pass
                        return reply
                return reader.end()
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=True) from exc

    async def aclose(self) -> None:
        """Close the pooled connections."""
        pools, self._pools = self._pools, []
        for pool in pools:
            await pool.aclose()


def async_model_client(settings: Settings) -> AsyncModelClient:
    """An ``AsyncModelClient`` for ``settings.openai_base_url`` in ``settings.openai_api_style``."""
    return AsyncModelClient(
        CHAT if settings.openai_api_style == "chat" else RESPONSES,
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        timeout=settings.model_timeout,
        connect_timeout=settings.model_connect_timeout,
        max_connections=settings.model_max_connections,
    )
