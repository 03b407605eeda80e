"""Per-token caps on open streams (a turn's events and the approvals change feed alike), for one
API process.

A stream is admitted, or refused with 429, in the request itself, before its response starts:
``StreamCaps.admit`` checks and counts in one step of the event loop (no ``await`` between the
check and the count, so concurrent opens cannot all pass a check made before any of them counted),
and the ``CappedStream`` response gives its place back when it ends however it ends (the stream
finished, the client went away, the response failed or never started streaming).
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Awaitable, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from control.api.errors import ApiError


class StreamCaps:
    """Open streams per token in this process, at most ``cap`` each."""

    def __init__(self, cap: int):
        self.cap = cap
        self._open: dict[str, int] = {}

    def open_streams(self, token_id: str) -> int:
        """Streams the token holds open here now."""
        return self._open.get(token_id, 0)

    @property
    def total(self) -> int:
        """Streams open in this process now, over every token (a gauge's value)."""
        return sum(self._open.values())

    def admit(self, token_id: str) -> None:
        """Count one more stream for the token. Raises ``ApiError`` 429 (``Retry-After``) when it
        holds ``cap`` already."""
        held = self._open.get(token_id, 0)
        if held >= self.cap:
            raise ApiError(
                429,
                f"token {token_id} holds {self.cap} event streams here already "
                "(AGENT_API_MAX_STREAMS_PER_TOKEN); close one first",
                headers={"Retry-After": "5"},
            )
        self._open[token_id] = held + 1

    def release(self, token_id: str) -> None:
        """Give back one admitted stream's place."""
        left = self._open.get(token_id, 0) - 1
        if left > 0:
            self._open[token_id] = left
        else:
            self._open.pop(token_id, None)


# The scope key of the server's own ``send`` (``control.api.edge``): the events' body messages go
# straight to it, past the framework's wrappers of ``send``, which look at a response's start only.
SERVER_SEND = "agent.server_send"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


class CappedStream(StreamingResponse):
    """A server-sent event stream admitted by ``caps`` for ``token_id``: its place is released
    once, when the response ends. Its body: ``body``'s chunks (an async iterator of bytes), or
    what ``writer(send)`` writes with the ASGI ``send`` it is given (``http.response.body``
    messages with ``more_body`` set; the start and the end are this response's): the server's
    own (``SERVER_SEND`` in the scope) when there is one."""

    def __init__(
        self, body: Any, caps: StreamCaps, token_id: str, *, writer: Callable[[Send], Awaitable[None]] | None = None
    ):
        super().__init__(_nothing() if body is None else body, media_type="text/event-stream", headers=SSE_HEADERS)
        self._caps, self._token_id, self._released = caps, token_id, False
        self._writer = writer
        self._body_send: Send | None = None

    async def stream_response(self, send: Send) -> None:
        if self._writer is None:
            await super().stream_response(send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await self._writer(self._body_send or send)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._caps.release(self._token_id)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._body_send = scope.get(SERVER_SEND)
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.release()
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                await aclose()  # an async generator never started, or cut: its cleanup runs now
