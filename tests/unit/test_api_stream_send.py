"""An event stream's body messages go to the server's own ``send`` when the edge lent it
(``control.api.edge``, ``streams.SERVER_SEND``); its start and end go through the ``send`` it was
called with (the framework's layers, which count and watch the response's start), and its place
under the token's cap is given back however it ends."""

from __future__ import annotations

import asyncio
from typing import Any

from control.api.streams import SERVER_SEND, CappedStream, StreamCaps


def _run(scope_extra: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], StreamCaps]:
    wrapped: list[dict[str, Any]] = []
    server: list[dict[str, Any]] = []

    async def framework_send(message: dict[str, Any]) -> None:
        wrapped.append(message)

    async def server_send(message: dict[str, Any]) -> None:
        server.append(message)

    async def writer(send: Any) -> None:
        for chunk in (b"a", b"b"):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    caps = StreamCaps(2)
    caps.admit("t")
    scope = {"type": "http", "asgi": {"spec_version": "2.4"}, **scope_extra}
    if scope_extra:
        scope[SERVER_SEND] = server_send
    response = CappedStream(None, caps, "t", writer=writer)
    asyncio.run(response(scope, receive, framework_send))
    return wrapped, server, caps


def test_the_events_go_to_the_server_send_and_the_start_and_end_through_the_framework():
    wrapped, server, caps = _run({"lent": True})
    assert [m["type"] for m in wrapped] == ["http.response.start", "http.response.body"]
    assert wrapped[-1]["more_body"] is False
    assert [m["body"] for m in server] == [b"a", b"b"]
    assert caps.open_streams("t") == 0


def test_without_a_lent_send_everything_goes_through_the_framework():
    wrapped, server, caps = _run({})
    assert [m.get("body") for m in wrapped[1:]] == [b"a", b"b", b""]
    assert server == [] and caps.open_streams("t") == 0


def test_the_edge_lends_the_server_send_only_while_the_request_runs():
    # The server's send is a method of the object that holds the scope: left in the scope, it
    # would make a reference cycle of every finished request (kept until a collection).
    from control.api.edge import Edge

    seen: list[Any] = []

    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope.get(SERVER_SEND))

    async def send(message: dict[str, Any]) -> None:
        pass

    scope: dict[str, Any] = {"type": "http", "path": "/v1/turns/x/events", "method": "GET", "headers": []}
    asyncio.run(Edge(inner, object(), 1024)(scope, None, send))
    assert seen == [send] and SERVER_SEND not in scope
