"""What the HTTP control plane reads of turns on its asyncio Redis client (``control.api``): a
turn's status, the turns parked on approvals, their agents and last event ids, and the name of a
turn's event stream (its ``StreamHub`` follows that key with one ``XREAD`` for every stream).

A part of the store (``worker.turn.keys`` names the keys; ``worker.turn.store`` writes them): the
API names no turn key itself. Read-only.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio

from worker.turn.keys import AGENT_FIELD, PENDING_APPROVALS_KEY, events_key, hash_key
from worker.turn.request import TurnStatus


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class AsyncTurnReads:
    """Reads of turns in the Redis at ``client`` (a ``redis.asyncio.Redis``, bytes replies).
    Every method raises redis-py's errors."""

    def __init__(self, client: redis.asyncio.Redis):
        self._r: Any = client

    @staticmethod
    def events_key(turn_id: str) -> str:
        """The turn's event stream (entries ``{"e": <event JSON>}``), as a key to follow."""
        return events_key(turn_id)

    async def status(self, turn_id: str) -> TurnStatus | None:
        """The turn's status, or None for an unknown (or expired) turn."""
        raw = await self._r.hget(hash_key(turn_id), "status")
        return TurnStatus(_text(raw)) if raw else None

    async def parked_turns(self) -> list[str]:
        """The turns parked on approvals (``approvals:pending``), by earliest deadline."""
        return [_text(x) for x in await self._r.zrange(PENDING_APPROVALS_KEY, 0, -1)]

    async def agents_and_last_events(self, turn_ids: list[str]) -> list[tuple[str | None, str | None]]:
        """For each of ``turn_ids``: its agent (None: unknown turn) and the id of the last entry of
        its event stream (None: no event yet), in one round trip."""
        async with self._r.pipeline(transaction=False) as p:
            for t in turn_ids:
                p.hget(hash_key(t), AGENT_FIELD)
                p.xrevrange(events_key(t), count=1)
            res = await p.execute()
        out: list[tuple[str | None, str | None]] = []
        for i in range(len(turn_ids)):
            agent, last = res[2 * i], res[2 * i + 1]
            out.append((_text(agent) if agent else None, _text(last[0][0]) if last else None))
        return out
