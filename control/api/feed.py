"""The approvals change feed (``GET /v1/approvals/events``): server-sent ``changed`` events, each
naming a turn whose pending approvals changed, for the agents a token covers.

New waiting turns are found among the turns parked on approvals
(``worker.turn.async_reads.AsyncTurnReads.parked_turns``), read once a second; from then on the turn's own event stream (through the process's ``StreamHub``) says at
once when one of its calls is decided or the turn ends. A client lists the approvals again on
each ``changed`` (the page does).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, AsyncIterator

import redis
import redis.asyncio

from control.api.hub import Event, StreamHub, Subscription
from control.api.sse import KEEPALIVE, RETRY, frame, read_range
from control.api.tokens import Token
from worker.turn.async_reads import AsyncTurnReads

KINDS = ("approval_requested", "approval_decided", "turn_finished")


async def _discover(
    r: redis.asyncio.Redis,
    token: Token,
    known: dict[str, Subscription | None],
    hub: StreamHub,
    queue: asyncio.Queue[Event],
) -> list[dict[str, Any]]:
    """Follow turns new in the pending set (when the token covers their agent); drop the ones that
    left it. Returns the ``changed`` payloads to send."""
    turns = AsyncTurnReads(r)
    ids = await turns.parked_turns()
    changes: list[dict[str, Any]] = []
    fresh = [t for t in ids if t not in known]
    if fresh:
        for t, (agent, last) in zip(fresh, await turns.agents_and_last_events(fresh)):
            if not token.covers(agent):
                known[t] = None
                continue
            sub = known[t] = hub.subscribe(turns.events_key(t), last or "0-0", queue)
            sub.extra = {"turn_id": t, "agent_id": agent}
            changes.append({"turn_id": t, "agent_id": agent, "kind": "approval_requested"})
            if sub.backlog is not None:  # the hub was past our position: read the gap ourselves
                async for _eid, ev in read_range(r, sub.key, *sub.backlog):
                    if ev.get("kind") in KINDS:
                        changes.append({"turn_id": t, "agent_id": agent, "kind": ev["kind"]})
    now = set(ids)
    for t in [t for t in known if t not in now]:
        gone = known.pop(t)
        if gone is not None:
            hub.unsubscribe(gone)
            changes.append({"turn_id": t, "agent_id": gone.extra["agent_id"], "kind": "resolved"})
    return changes


async def approvals_feed(
    hub: StreamHub, r: redis.asyncio.Redis, token: Token, *, heartbeat: float, poll: float = 1.0
) -> AsyncIterator[bytes]:
    """The feed as SSE frames, until the client goes away. A Redis failure pauses it (keep-alives
    go on); the pending set is read again when Redis is back."""
    yield RETRY
    yield frame(None, "ready", {"agents": token.public()["agents"]})
    queue: asyncio.Queue[Event] = asyncio.Queue(hub.queue_size)
    known: dict[str, Subscription | None] = {}
    beat = time.monotonic()
    try:
        while True:
            try:
                for change in await _discover(r, token, known, hub, queue):
                    yield frame(None, "changed", change)
            except redis.RedisError:
                pass
            followed = {sub.key: sub for sub in known.values() if sub is not None}
            deadline = time.monotonic() + poll
            while (left := deadline - time.monotonic()) > 0:
                try:
                    key, _eid, ev = await asyncio.wait_for(queue.get(), timeout=left)
                except asyncio.TimeoutError:
                    break
                sub = followed.get(key)
                if ev.get("kind") in KINDS and sub is not None:
                    yield frame(None, "changed", {**sub.extra, "kind": ev["kind"], "call_id": ev.get("call_id")})
            if time.monotonic() - beat >= heartbeat:
                beat = time.monotonic()
                yield KEEPALIVE
    finally:
        for sub in known.values():
            if sub is not None:
                hub.unsubscribe(sub)
