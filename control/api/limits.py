"""The request-size limit: an ASGI middleware that answers 413 (the API's error shape) for a body
over ``max_body_bytes``, by its ``Content-Length`` before reading it, or while reading a chunked
one, so an oversized body is never buffered whole."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.exceptions import HTTPException

from control.api.errors import error_body


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` once a chunked body passes the limit: an HTTP exception, so the
    framework's body parsing passes it on and its handler answers 413 in the error shape."""

    def __init__(self, limit: int):
        super().__init__(413, f"the request body is over {limit:,} bytes (AGENT_API_MAX_BODY_BYTES)")


class BodySizeLimit:
    """``BodySizeLimit(app, max_body_bytes)``: wraps an ASGI app."""

    def __init__(self, app: Any, max_body_bytes: int):
        self.app, self.max = app, max_body_bytes

    async def _refuse(self, send: Any) -> None:
        body = orjson.dumps(error_body(413, f"the request body is over {self.max:,} bytes (AGENT_API_MAX_BODY_BYTES)"))
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max
                except ValueError:
                    too_big = False
                if too_big:
                    await self._refuse(send)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max:
                    raise BodyTooLarge(self.max)
            return message

        def tracking_send(message: Any) -> Any:
            # Not a coroutine of its own: it hands back ``send``'s, a frame less per message sent
            # (each event of a stream is one).
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            return send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)
