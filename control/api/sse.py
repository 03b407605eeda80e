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

from control.api.hub import RawEntry, StreamHub, id_tuple
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


async def turn_events(
    hub: StreamHub,
    r: redis.asyncio.Redis,
    turn_id: str,
    after: str,
    *,
    heartbeat: float,
    kinds: frozenset[str] | None = None,
) -> AsyncIterator[bytes]:
    """The event stream of ``turn_id`` after stream id ``after``, as SSE frames. ``kinds``: only
    these kinds (the stream still ends at ``turn_finished``). Ends quietly when Redis fails on a
    read of its own (the client reconnects with its ``Last-Event-ID``)."""
    key = AsyncTurnReads.events_key(turn_id)
    yield RETRY

    def wanted(ev: dict[str, Any]) -> bool:
        return kinds is None or ev.get("kind") in kinds

    try:
        if await _terminal(r, turn_id):  # ended: its turn_finished is already in the stream
            async for eid, ev in read_range(r, key, after):
                if wanted(ev):
                    yield frame(eid, ev.get("kind", "event"), ev)
            return
    except redis.RedisError:
        return
    sub = hub.subscribe(key, after)
    last = after
    try:
        if sub.backlog is not None:
            async for eid, ev in read_range(r, key, *sub.backlog):
                last = eid
                if wanted(ev):
                    yield frame(eid, ev.get("kind", "event"), ev)
                if ev.get("kind") == "turn_finished":
                    return
        while True:
            if sub.lagging and sub.queue.empty():
                return
            try:
                _key, eid, ev = await asyncio.wait_for(sub.queue.get(), timeout=heartbeat)
            except asyncio.TimeoutError:
                yield KEEPALIVE
                if await _terminal(r, turn_id) and sub.queue.empty():
                    return  # ended with its last events trimmed away, or the turn's keys expired
                continue
            if id_tuple(eid) <= id_tuple(last):
                continue
            last = eid
            if wanted(ev):
                yield frame(eid, ev.get("kind", "event"), ev)
            if ev.get("kind") == "turn_finished":
                return
    except redis.RedisError:
        return
    finally:
        hub.unsubscribe(sub)
