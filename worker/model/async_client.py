"""The asynchronous model client: a model call as a coroutine, so a waiting call holds no thread.

``AsyncModelClient(wire, base_url, ...)`` makes calls of one wire API (``worker.model.wire_format``:
``responses.RESPONSES`` or ``chat.CHAT``) on ``aiohttp``; ``create`` and ``stream`` are the
coroutine forms of ``ModelClient``'s, with the same request, reply, deltas and ``GatewayError``
mapping (``worker.model.http_pool``: the same retry rule). One instance per event loop: its
session belongs to the loop that first used it. Thousands of calls in flight cost a socket and
a coroutine each (memory), not a thread (docs/architecture.md, "Model calls off the worker's
threads").

Why aiohttp and not ``httpx.AsyncClient`` (bench/README.md, "Model calls off the worker's
threads"): measured against the same keep-alive endpoint, a call cost 0.9 ms of the loop's CPU
with httpx and 0.3 ms with aiohttp; and httpcore's async pool walks all its connections, polling
each socket, every time a request starts or a response closes, which at a thousand connections
took most of a node's CPU. Server-sent events are read with ``SSEEvents``, as in the synchronous client.

``worker.model.clients.async_model_client(settings)`` builds the client of ``OPENAI_API_STYLE``.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Callable

import aiohttp
import aiohttp.abc
import aiohttp.payload
import certifi
import orjson

from worker.model.background import Background, WatchCreated, background_body, cancel_url, resume_url
from worker.model.http_pool import ERROR_TEXT_BYTES, MAX_REPLY_BYTES, ReplySize, status_error_of, transport_failure
from worker.model.interface import GatewayError, ModelReply, ModelRequest, OnDelta
from worker.model.sse_lines import SSEEvents
from worker.model.wire_format import TAIL_WAIT, StreamReader, WireFormat


class AsyncModelClient:
    """Coroutine model calls of ``wire`` at ``base_url`` (like ``https://api.openai.com/v1``).

    ``timeout`` (seconds): the longest wait for the next bytes of an answer (a read timeout, as
    the synchronous client's); ``connect_timeout`` (seconds): opening a connection (a call that
    waits for a free connection of a full pool is bounded by ``deadline`` only); ``deadline`` (seconds, None: none): the longest a whole call may take,
    headers to last byte, since a stream that trickles a byte now and then never trips the read
    timeout; ``max_connections``: the pool's cap; ``max_reply_bytes``: the cap on one answer as read
    (``worker.model.http_pool.ReplySize``). The API key is sent as a bearer token and never logged.
    """

    def __init__(
        self,
        wire: WireFormat,
        base_url: str,
        api_key: str = "",
        *,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        deadline: float | None = None,
        max_connections: int = 2048,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.wire = wire
        self.max_reply_bytes = max_reply_bytes
        self.url = base_url.rstrip("/") + wire.path
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        # ``sock_connect``, not ``connect``: aiohttp's ``connect`` also counts the wait for a free
        # connection of the pool, so a burst beyond ``max_connections`` failed as "timed out" after
        # ``connect_timeout`` (and was retried) while no server was slow; a queued call waits for
        # its turn within ``deadline`` instead (bench/README.md, "Ten thousand turns in flight").
        self._timeout = aiohttp.ClientTimeout(total=deadline, sock_connect=connect_timeout, sock_read=timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled ``aiohttp.ClientSession`` (made on first use, on the calling loop)."""
        if self._session is None:
            tls = ssl.create_default_context(cafile=certifi.where())
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0, ssl=tls)
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers, timeout=self._timeout)
        return self._session

    async def create(self, request: ModelRequest) -> ModelReply:
        """POST the request; the parsed reply. Raises ``GatewayError`` (not retryable for an
        answer above ``max_reply_bytes``)."""
        wire = self.wire
        try:
            body = SentOnce(lambda: orjson.dumps(wire.body(request)))
            async with self.session.post(self.url, data=body) as resp:
                if resp.status >= 400:
                    raise status_error_of(resp.status, await _error_text(resp))
                return wire.parse(await _read_body(resp, self.max_reply_bytes))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _transport_error(exc, streamed=False) from exc

    async def stream(
        self, request: ModelRequest, on_delta: OnDelta, background: Background | None = None
    ) -> ModelReply:
        """POST the request streamed; ``on_delta`` (called on the loop) gets each piece in order.
        An endpoint that cannot stream answers whole. Raises ``GatewayError`` (not retryable for
        an answer, the whole event stream, above ``max_reply_bytes``).

        ``background`` (Responses only, ``worker.model.background``): the request is made in
        background mode and the created response's id reported to ``background.on_created``; with
        a ``background.response_id``, that response is fetched (its events from the first) instead,
        and a new one made only when the endpoint no longer has it (HTTP 404)."""
        wire = self.wire
        if background is not None and background.response_id:
            reply = await self._resume(background.response_id, on_delta)
            if reply is not None:
                return reply
        body, reader = wire.stream_body(request), wire.reader(on_delta)
        if background is not None:
            body, reader = background_body(body), WatchCreated(reader, background.on_created)
        try:
            async with self.session.post(self.url, data=SentOnce(lambda: orjson.dumps(body))) as resp:
                return await self._answer(resp, reader)
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _transport_error(exc, streamed=True) from exc

    async def _resume(self, response_id: str, on_delta: OnDelta) -> ModelReply | None:
        """The background response ``response_id`` streamed from its first event; None when the
        endpoint does not have it (HTTP 404: expired, or never stored). Raises ``GatewayError``."""
        try:
            async with self.session.get(resume_url(self.url, response_id)) as resp:
                if resp.status == 404:
                    return None
                return await self._answer(resp, self.wire.reader(on_delta))
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            raise _transport_error(exc, streamed=True) from exc

    async def _answer(self, resp: aiohttp.ClientResponse, reader: StreamReader) -> ModelReply:
        """The reply of a streamed request's answer: its events, or a whole body. Raises ``GatewayError``."""
        if resp.status >= 400:
            raise status_error_of(resp.status, await _error_text(resp))
        if "text/event-stream" not in resp.headers.get("Content-Type", ""):
            return self.wire.parse(await _read_body(resp, self.max_reply_bytes))
        return await _read_events(resp, reader, ReplySize(self.max_reply_bytes))

    async def cancel(self, response_id: str) -> bool:
        """Cancel the background response ``response_id`` (its generation stops: no more is paid);
        whether the endpoint took it. Never raises."""
        try:
            async with self.session.post(cancel_url(self.url, response_id), data=b"{}") as resp:
                return resp.status < 400
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def aclose(self) -> None:
        """Close the pooled connections."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


class SentOnce(aiohttp.payload.BytesPayload):
    """A JSON request body that lets its bytes go once written, made by ``make`` (the same bytes
    at each call: ``orjson.dumps`` of a request the caller holds while it waits anyway).

    aiohttp keeps a request's payload until its response arrives, and a model call may wait
    minutes for it: a waiting call held its whole serialized request (the conversation and every
    tool's schema, 8 KB in the benchmark's turn) for nothing. aiohttp writes a POST body a second
    time only to follow a 307 or 308 redirect (it retries idempotent methods only): that write
    makes the bytes again (and lets them go again), where a payload marked consumed would fail
    the call ("Cannot follow redirect with a consumed request body").
    """

    def __init__(self, make: Callable[[], bytes]):
        super().__init__(make(), content_type="application/json")
        self._make = make

    async def write(self, writer: aiohttp.abc.AbstractStreamWriter) -> None:
        """Write the bytes, then drop them."""
        await self.write_with_length(writer, None)

    async def write_with_length(self, writer: aiohttp.abc.AbstractStreamWriter, content_length: int | None) -> None:
        """Write the bytes (at most ``content_length``; made again when an earlier write let
        them go), then drop them."""
        if not self._value and self._size:
            self._value = self._make()
        try:
            await super().write_with_length(writer, content_length)
        finally:
            self._value = b""


async def _read_body(resp: aiohttp.ClientResponse, limit: int) -> bytes:
    """The whole body of ``resp``, at most ``limit`` bytes (``ReplySize``; past it the connection
    is closed, the rest unread). Raises ``GatewayError``."""
    try:
        size = ReplySize(limit, resp.headers.get("Content-Length"))
        parts = [size.add(chunk) async for chunk in resp.content.iter_any()]
    except GatewayError:
        resp.close()
        raise
    return b"".join(parts)


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    """The start of an error answer's body (``ERROR_TEXT_BYTES``), for its message; the rest unread."""
    return (await resp.content.read(ERROR_TEXT_BYTES)).decode("utf-8", "replace")


async def _read_events(resp: aiohttp.ClientResponse, reader: StreamReader, size: ReplySize) -> ModelReply:
    """Feed the response's server-sent events (``SSEEvents``: any size, the SSE standard's line
    ends only) to ``reader`` up to the terminal event, then read what follows (``_finish_body``);
    the reply. The stream's bytes are counted by ``size``. Raises ``GatewayError``."""
    events = SSEEvents()
    async for chunk in resp.content.iter_any():
        for sse in events.feed(size.add(chunk)):
            if sse is not None and (reply := reader.feed(sse.event, sse.data)) is not None:
                await _finish_body(resp, size)
                return reply
    for sse in events.close():  # an unterminated last event
        if sse is not None and (reply := reader.feed(sse.event, sse.data)) is not None:
            return reply
    return reader.end()


async def _finish_body(resp: aiohttp.ClientResponse, size: ReplySize) -> None:
    """Read the body to its end, so the connection goes back to the pool clean. The reply is
    already in hand (paid for): a body that does not end within ``TAIL_WAIT`` s (a proxy that
    keeps the stream open, keep-alive comments), that breaks, or that runs past ``size``'s limit
    costs the connection (closed), never the reply: raising here would retry, and pay for, a call
    that succeeded."""

    async def drain() -> None:
        async for chunk in resp.content.iter_any():
            size.add(chunk)

    try:
        await asyncio.wait_for(drain(), TAIL_WAIT)
    except (aiohttp.ClientError, asyncio.TimeoutError, GatewayError):
        resp.close()


def _transport_error(exc: BaseException, *, streamed: bool) -> GatewayError:
    """``http_pool.transport_failure`` for aiohttp's errors."""
    return transport_failure(exc, streamed=streamed, timed_out=isinstance(exc, asyncio.TimeoutError))
