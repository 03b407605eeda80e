"""Per-agent JSON records in Redis with an atomic cap on active ones.

Used by schedules (``worker.records.schedules``) and background agent jobs
(``worker.records.jobs``). Keys for a record kind ``<kind>`` (e.g. ``job``):

- ``<kind>:<id>``: the record (orjson; never pickle);
- ``agent:<agent_id>:<kind>s``: sorted set of the agent's ids by creation time (epoch s);
- ``agent:<agent_id>:<kind>s:active``: set of the agent's active ids (what the cap counts).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import orjson
import redis
from redis.client import Pipeline

# 2: exists already (the same call ran again); 0: the agent is at the cap; 1: created.
_CREATE_LUA = """
local rec_key, active_key, all_key = KEYS[1], KEYS[2], KEYS[3]
local cap, id, rec, score = tonumber(ARGV[1]), ARGV[2], ARGV[3], ARGV[4]
if redis.call('EXISTS', rec_key) == 1 then return 2 end
if redis.call('SCARD', active_key) >= cap then return 0 end
redis.call('SET', rec_key, rec)
redis.call('SADD', active_key, id)
redis.call('ZADD', all_key, score, id)
return 1
"""

CREATED, AT_CAP, EXISTED = 1, 0, 2


class AgentRecords:
    """Records of one ``kind`` over a ``redis.Redis`` client (bytes or str responses both work).

    ``is_active(record) -> bool`` says whether a record still counts against the cap.
    """

    def __init__(self, client: redis.Redis, kind: str, is_active: Callable[[dict[str, Any]], bool]):
        self.r = client
        self.kind = kind
        self.is_active = is_active
        self._create = client.register_script(_CREATE_LUA)

    def key(self, record_id: str) -> str:
        """Redis key of one record: ``<kind>:<id>``."""
        return f"{self.kind}:{record_id}"

    def all_key(self, agent_id: str) -> str:
        """Sorted set of the agent's record ids by creation time."""
        return f"agent:{agent_id}:{self.kind}s"

    def active_key(self, agent_id: str) -> str:
        """Set of the agent's active record ids (what the cap counts)."""
        return f"agent:{agent_id}:{self.kind}s:active"

    def get(self, record_id: str) -> dict[str, Any] | None:
        """The record, or None."""
        raw = self.r.get(self.key(record_id))
        return orjson.loads(raw) if raw else None

    def list(self, agent_id: str, limit: int) -> list[dict[str, Any]]:
        """The agent's records, newest first (at most ``limit``)."""
        ids = [
            x.decode() if isinstance(x, bytes) else str(x)
            for x in self.r.zrevrange(self.all_key(agent_id), 0, limit - 1)
        ]
        if not ids:
            return []
        return [orjson.loads(x) for x in self.r.mget([self.key(i) for i in ids]) if x]

    def active_count(self, agent_id: str) -> int:
        """How many of the agent's records are active."""
        return int(self.r.scard(self.active_key(agent_id)))

    def create(self, record_id: str, agent_id: str, record: dict[str, Any], cap: int) -> int:
        """Store a new active record atomically with the per-agent cap: ``CREATED``, ``AT_CAP`` or ``EXISTED``."""
        return int(
            self._create(
                keys=[self.key(record_id), self.active_key(agent_id), self.all_key(agent_id)],
                args=[cap, record_id, orjson.dumps(record), time.time()],
            )
        )

    def update(
        self, record_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Apply ``change(record) -> fields`` atomically (WATCH/MULTI); a record that stops being
        active leaves the active set. Returns the new record, or None if there is none or ``change``
        returned None."""
        key = self.key(record_id)
        out: dict[str, Any] | None = None

        def txn(pipe: Pipeline) -> None:
            nonlocal out
            out = None
            raw = pipe.get(key)
            if not raw:
                return
            rec = orjson.loads(raw)
            fields = change(dict(rec))
            if fields is None:
                return
            rec.update(fields)
            pipe.multi()
            pipe.set(key, orjson.dumps(rec))
            if not self.is_active(rec):
                pipe.srem(self.active_key(rec["agent_id"]), record_id)
            out = rec

        self.r.transaction(txn, key)
        return out

    def remove(self, record_id: str) -> None:
        """Forget a record entirely (e.g. its turn could not be enqueued)."""
        rec = self.get(record_id)
        if rec is None:
            return
        p = self.r.pipeline(transaction=True)
        p.delete(self.key(record_id))
        p.srem(self.active_key(rec["agent_id"]), record_id)
        p.zrem(self.all_key(rec["agent_id"]), record_id)
        p.execute()
