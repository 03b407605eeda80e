"""A turn's events as server-sent events (the WHATWG ``text/event-stream`` format).

Each entry of the turn's Redis Stream (``turn:{id}:events``) becomes one event: ``id:`` is the
stream id (so a client's ``Last-Event-ID`` is a position in the stream), ``event:`` the kind
(``turn_started``, ``model_delta``, ``call_planned``, ``call_started``, ``call_completed``,
``approval_requested``, ``approval_decided``, ``turn_finished``...) and ``data:`` the event's
JSON. The stream ends after ``turn_finished``; for a turn already ended, after its last event.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, cast

import orjson
import redis
import redis.asyncio
from starlette.types import Send

from control.api.hub import HEARTBEAT, Event, HubEvent, RawEntry, StreamHub, id_tuple
from worker.turn.async_reads import AsyncTurnReads

KEEPALIVE = b": keep-alive\n\n"
RETRY = b"retry: 2000\n\n"  # ms before a browser's EventSource reconnects (with Last-Event-ID)
PAGE = 500  # entries per XRANGE when a client reads a backlog itself


def frame(event_id: str | None, kind: str, data: Any) -> bytes:
    """One event in the wire format (``data`` as compact JSON on one line)."""
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {kind}\ndata: ".encode() + orjson.dumps(data) + b"\n\n"


async def read_range(
    r: redis.asyncio.Redis, key: str, after: str, upto: str = "+"
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Entries of stream ``key`` after id ``after`` up to ``upto`` (inclusive), in pages."""
    start = f"({after}"
    while True:
        entries = cast("list[RawEntry]", await r.xrange(key, start, upto, count=PAGE))  # see RawEntry
        for eid, fields in entries:
            yield eid.decode(), orjson.loads(fields[b"e"])
        if len(entries) < PAGE:
            return
        start = f"({entries[-1][0].decode()}"


async def _terminal(r: redis.asyncio.Redis, turn_id: str) -> bool:
    status = await AsyncTurnReads(r).status(turn_id)
    return status is None or status.terminal


async def send_turn_events(
    send: Send, hub: StreamHub, r: redis.asyncio.Redis, turn_id: str, after: str, *, kinds: frozenset[str] | None = None
) -> None:
    """Write the event stream of ``turn_id`` after stream id ``after`` with ``send`` (ASGI
    ``http.response.body`` messages, ``more_body`` set: the response's start and end are the
    caller's, ``streams.CappedStream``), as SSE frames. ``kinds``: only these kinds (the stream
    still ends at ``turn_finished``); a keep-alive comment when the hub says the stream was idle
    (``StreamHub``'s ``heartbeat``). Returns quietly when Redis fails on a read of its own (the
    client reconnects with its ``Last-Event-ID``).

    Written with ``send`` itself, not yielded to a streaming response: an async generator between
    the hub's queue and the socket cost a resumption and a suspension per event and client, and
    each layer of them was a share of the fan-out's CPU (bench/README.md, the HTTP edge)."""
    body = "http.response.body"
    key = AsyncTurnReads.events_key(turn_id)
    await send({"type": body, "body": RETRY, "more_body": True})
    try:
        if await _terminal(r, turn_id):  # ended: its turn_finished is already in the stream
            async for eid, ev in read_range(r, key, after):
                if kinds is None or ev.get("kind") in kinds:
                    await send({"type": body, "body": frame(eid, ev.get("kind", "event"), ev), "more_body": True})
            return
    except redis.RedisError:
        return
    sub = hub.subscribe(key, after, beats=True)
    # Then the backlog the client reads itself, then the live events. Live events come framed by
    # the hub (``HubEvent``: decoded and encoded once per entry, whatever the number of clients);
    # what has arrived when this client's task runs goes out in one write (one chunk); keep-alives
    # come from the hub's one timer (``HEARTBEAT``), not a timer per wait.
    try:
        last = id_tuple(sub.backlog[0]) if sub.backlog is not None else (0, 0)
        if sub.backlog is not None:
            async for eid, ev in read_range(r, sub.key, *sub.backlog):
                last = id_tuple(eid)
                if kinds is None or ev.get("kind") in kinds:
                    await send({"type": body, "body": frame(eid, ev.get("kind", "event"), ev), "more_body": True})
                if ev.get("kind") == "turn_finished":
                    return
        queue = sub.queue
        while True:
            if sub.lagging and queue.empty():
                return
            first = await queue.get()
            if first is HEARTBEAT:
                await send({"type": body, "body": KEEPALIVE, "more_body": True})
                if await _terminal(r, turn_id) and queue.empty():
                    return  # ended with its last events trimmed away, or the turn's keys expired
                continue
            chunk, last, finished = _batch(first, queue, last, kinds)
            if chunk:
                await send({"type": body, "body": chunk, "more_body": True})
            if finished:
                return
    except redis.RedisError:
        return
    finally:
        hub.unsubscribe(sub)


def _batch(
    first: Event, queue: asyncio.Queue[Event], last: tuple[int, int], kinds: frozenset[str] | None
) -> tuple[bytes, tuple[int, int], bool]:
    """``first`` and every entry waiting in ``queue`` after it, as one chunk of frames: the
    entries after position ``last`` of the ``kinds`` wanted (None: all), up to ``turn_finished``.
    Returns ``(chunk, new last position, finished)``."""
    entries = [first]
    while not queue.empty():
        entries.append(queue.get_nowait())
    out: list[bytes] = []
    for entry in entries:
        if entry is HEARTBEAT:  # events came with it: they keep the connection alive enough
            continue
        _key, eid, ev = entry
        position = ev.position if isinstance(ev, HubEvent) else id_tuple(eid)
        if position <= last:
            continue
        last = position
        kind = ev.get("kind")
        if kinds is None or kind in kinds:
            out.append(ev.frame if isinstance(ev, HubEvent) else frame(eid, ev.get("kind", "event"), ev))
        if kind == "turn_finished":
            return b"".join(out), last, True
    return b"".join(out), last, False
