"""What the API does in front of the framework (FastAPI, Starlette), where the framework's layers
cost as much as the work itself: ``Edge``, the outermost ASGI app.

1. ``POST /v1/turns``: the enqueue route's common case answered here, everything else handed on
   to the FastAPI app unchanged.
2. Every HTTP request's scope carries the server's own ``send`` (``SERVER_SEND``): an event stream
   (``streams.CappedStream``) writes its events with it. Between the stream and the server, the
   framework's layers wrap ``send`` (its error middleware's, its exception handlers', the API's
   metrics and body limit), and each looks only at the response's start: the events' body
   messages went through four calls, two of them coroutines, per event and client, for nothing
   (about 7% of the API's samples during a burst of 2,000 events). The response's start and
   its end still go through them.

The enqueue:

The common case is a request from a token this process authenticated before
(``routes.enqueue_known``) with a JSON body (``Content-Type: application/json``, a
``Content-Length`` within the body limit) that parses and validates as a ``TurnRequest`` (and
has no run of 19 digits, which may be an integer orjson would read as a float: ``worker.wide_integers``). For it,
``Edge`` reads the body, validates it as FastAPI would (``json`` parsed, then the model
validated from the Python value), runs ``routes.enqueue_known`` (the token's checks and the turn's
creation in one script), answers its errors through ``errors.answer`` (the handlers FastAPI's app
uses) and counts the request in the API's metrics as ``RequestMetrics`` does. Any request that
is not the common case, and any it declines with nothing created (``enqueue_known``'s None), goes to
the FastAPI app with its body replayed: the framework's route gives the answer, so every refusal
(401, 403, 429, a body that does not parse or validate, 413) keeps its order and its shape.

Why: the framework's request handling around the route (nine ASGI layers of middleware and
routers, the dependencies solved per request, the body read through a ``Request``) was about as
much of the server's CPU per enqueue as the route's own work (bench/README.md, the HTTP edge).
"""

from __future__ import annotations

import time

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from control.api import errors, metrics
from control.api.json_response import JsonResponse
from control.api.routes import enqueue_known
from control.api.streams import SERVER_SEND
from worker.turn.request import IDEMPOTENCY_KEY_MAX, TurnRequest
from worker.wide_integers import has_long_digit_run

ROUTE = "/v1/turns"
_JSON = b"application/json"
# The headers the common case reads, each at most once (a repeated one: the framework answers).
_READ = frozenset((b"authorization", b"content-length", b"content-type", b"idempotency-key"))


class Edge:
    """``Edge(inner, app, max_body_bytes)``: an ASGI app answering ``POST /v1/turns``'s common
    case itself and handing every other request to ``inner`` (the whole app as served: the
    FastAPI ``app`` under its ASGI wrappers), its scope carrying the server's ``send`` (module
    docstring). ``app``: the FastAPI app, whose ``state`` holds what its lifespan opened. While
    FastAPI's own telemetry is on, every request goes to ``inner`` as it came."""

    def __init__(self, inner: ASGIApp, app: FastAPI, max_body_bytes: int):
        self.inner, self.app, self.max = inner, app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or self._traced():
            await self.inner(scope, receive, send)
            return
        if scope["path"] != ROUTE or scope["method"] != "POST":
            await self._lent(scope, receive, send)
            return
        heads = self._headers(scope["headers"])
        if heads is None:
            await self.inner(scope, receive, send)
            return
        token, idempotency_key = heads
        started = time.perf_counter()
        received: list[Message] = []
        body = await self._body(receive, received)
        response = None
        if body is not None:
            request = _request(body)
            if request is not None:
                response = await self._enqueue(scope, token, request, idempotency_key)
        if response is None:  # not the common case: the framework answers, the body replayed
            await self._lent(scope, _replay(received, receive), send)
            return
        await response(scope, receive, send)
        metrics.count(ROUTE, "POST", response.status_code, time.perf_counter() - started)

    async def _lent(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``inner``'s answer, its scope carrying ``send`` while it runs. Taken out after: the
        server's ``send`` is a method of the object holding the scope, and that cycle would keep
        every finished request's objects until a collection (at 2,000 streams, tens of MB and
        longer collections)."""
        scope[SERVER_SEND] = send
        try:
            await self.inner(scope, receive, send)
        finally:
            scope.pop(SERVER_SEND, None)

    def _traced(self) -> bool:
        """True when FastAPI's own telemetry is on (a tracer or meter provider configured in this
        process): its spans and measures come from the framework's path only."""
        telemetry = getattr(self.app, "_native_telemetry", None)
        return telemetry is not None and bool(telemetry.enabled())

    def _headers(self, headers: list[tuple[bytes, bytes]]) -> tuple[str, str | None] | None:
        """``(bearer token, Idempotency-Key or None)`` of a request the common case can take:
        one ``Authorization: Bearer`` header, a JSON ``Content-Type``, a ``Content-Length`` within
        the limit, at most one ``Idempotency-Key`` of at most ``IDEMPOTENCY_KEY_MAX`` characters,
        no ``Transfer-Encoding``; else None (the framework answers)."""
        found: dict[bytes, bytes] = {}
        for name, value in headers:
            if name == b"transfer-encoding" or (name in _READ and name in found):
                return None
            if name in _READ:
                found[name] = value
        auth, length, kind = found.get(b"authorization"), found.get(b"content-length"), found.get(b"content-type")
        if auth is None or length is None or kind is None or kind.lower() != _JSON:
            return None
        if not length.isdigit() or int(length) > self.max:
            return None
        scheme, _, credentials = auth.decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not credentials:
            return None
        key = found.get(b"idempotency-key")
        idempotency_key = key.decode("latin-1") if key is not None else None
        if idempotency_key is not None and len(idempotency_key) > IDEMPOTENCY_KEY_MAX:
            return None
        return credentials, idempotency_key

    @staticmethod
    async def _body(receive: Receive, received: list[Message]) -> bytes | None:
        """The request's body, every message read kept in ``received`` (for a replay); None when
        the client went away first."""
        chunks = []
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _enqueue(
        self, scope: Scope, token: str, request: TurnRequest, idempotency_key: str | None
    ) -> JsonResponse | None:
        state = self.app.state
        client = scope.get("client")
        try:
            return await enqueue_known(state, token, request, idempotency_key, client[0] if client else "unknown")
        except Exception as exc:  # the route's errors, answered as the app's handlers answer them
            return errors.answer(exc, state.settings.retry_after)


def _request(body: bytes) -> TurnRequest | None:
    """``body`` as a ``TurnRequest``, as FastAPI reads it (JSON to Python values, then the model
    validated from them); None for a body that does not parse or validate (the framework answers
    its errors), and for one that may hold an integer orjson cannot read exactly (``has_long_digit_run``)."""
    if has_long_digit_run(body):  # orjson would read such an integer as a float: the framework keeps it
        return None
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    try:
        return TurnRequest.model_validate(value, from_attributes=True)
    except ValidationError:
        return None


def _replay(received: list[Message], receive: Receive) -> Receive:
    """A ``receive`` giving the messages already read, then ``receive``'s."""
    pending = list(received)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
