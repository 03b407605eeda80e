"""Claims and the barrier: who runs a model step or a tool call, and whose result closes a batch.

Every operation is one round trip (a Lua script or a pipeline): a call is claimed with its
``call_started`` event; a result is stored (first write wins) with ``call_completed`` and the
batch's barrier, which fires once; a model step is claimed with its progress deadline and, at the
turn's first step, the ``running`` mark. A mixin of ``TurnStore`` (``worker.turn.store``), which
registers the scripts on its Redis client.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from worker.turn.state import EVENTS_MAXLEN, RETENTION_SECONDS
from worker.turn.state import key as _k

# Claim a call for execution and announce it in one round trip.
_CLAIM_LUA = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'e', ARGV[4])
  return {1, false}
end
return {0, redis.call('HGET', KEYS[1], ARGV[1])}
"""

# Store a call's result (first write wins), announce it, and pass the batch barrier, in one round trip.
# The barrier sets the "advanced" key once, only when every call of the batch has a result.
# KEYS: results, turn hash, events, adv; ARGV: call_id, result ('' = only check the barrier), ttl,
# terminate, event, maxlen, call_ids...
_RECORD_LUA = """
local stored = 0
if ARGV[2] ~= '' then stored = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) end
if stored == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  if ARGV[4] == '1' then redis.call('HSET', KEYS[2], 'terminate', '1') end
  if ARGV[5] ~= '' then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5]) end
end
for i = 7, #ARGV do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then return {stored, 0} end
end
if redis.call('SET', KEYS[4], '1', 'NX', 'EX', 86400) then return {stored, 1} end
return {stored, 0}
"""

# Begin a step's model call in one round trip: take the step claim, push the progress deadline
# and, at the turn's first step, move it from queued to running with its turn_started event.
# It also records the turn as held by the caller's node (KEYS[5], ``worker.turn.liveness``), so
# a node killed during its first model call is known to hold the turn before its heartbeat
# thread writes its held tasks.
# KEYS: turn hash, step claim, watch zset, events, node's held tasks; ARGV: owner, lease s,
# deadline, step, now, event JSON, events maxlen, turn id.
_BEGIN_MODEL_LUA = """
local won = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2])
if won then redis.call('HSET', KEYS[5], 'step:' .. ARGV[8], ARGV[8]) end
redis.call('ZADD', KEYS[3], 'XX', 'GT', ARGV[3], ARGV[8])
if not won then return {0, redis.call('GET', KEYS[2])} end
local h = redis.call('HMGET', KEYS[1], 'status', 'step', 'phase')
if h[1] == 'queued' and h[2] == ARGV[4] and h[3] == 'model' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[5], 'redrives', 0)
  redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'e', ARGV[6])
  return {1, 1}
end
return {1, 0}
"""


# Delete a claim only if it is still ours (one round trip).
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Claims:
    """``TurnStore``'s claims and barrier (see the module docstring)."""

    def claim(
        self,
        turn_id: str,
        step: int,
        call_id: str,
        owner: str,
        lease: float,
        started_event: dict[str, Any] | None = None,
    ) -> tuple[bool, dict | None]:
        """Claim a call for execution (``lease`` seconds) and, if won, append ``call_started``.

        Returns ``(won, existing_claim)``.
        """
        claim = {"owner": owner, "lease_until": time.time() + lease}
        won, raw = self._claim(
            keys=[_k(turn_id, "claims", step), _k(turn_id, "events")],
            args=[
                call_id,
                orjson.dumps(claim),
                RETENTION_SECONDS,
                self._event_json("call_started", started_event or {"call_id": call_id}),
                EVENTS_MAXLEN,
            ],
        )
        if won:
            return True, None
        return False, orjson.loads(raw) if raw else None

    def begin_model_call(
        self,
        turn_id: str,
        step: int,
        owner: str,
        lease: float,
        started_event: dict[str, Any] | None = None,
        held_key: str = "agent:node:unknown:tasks",
    ) -> tuple[str | None, bool]:
        """Take step ``step``'s model call for ``owner``, push the progress deadline past ``lease``
        seconds and, for a queued turn, move it to ``running`` with the ``turn_started`` event
        ``started_event``: one round trip. Returns ``(None, started)`` when won (``started``: the
        turn was moved to running), else ``(holder, False)``. ``held_key``: the caller's node's held
        tasks (``worker.turn.liveness.held_key``), where the turn is recorded."""
        now = time.time()
        won, held = self._begin_model(
            keys=[_k(turn_id), _k(turn_id, "stepclaim", step), "turns:watch", _k(turn_id, "events"), held_key],
            args=[
                owner,
                max(1, int(lease)),
                now + max(lease, self.progress_timeout),
                step,
                now,
                self._event_json("turn_started", started_event or {}),
                EVENTS_MAXLEN,
                turn_id,
            ],
        )
        if won:
            return None, bool(held)
        return (held.decode() if held else None), False

    def take_over_step(self, turn_id: str, step: int, owner: str, lease: float) -> None:
        """Replace a dead holder's step claim with ours."""
        self.r.set(_k(turn_id, "stepclaim", step), owner, ex=max(1, int(lease)))

    def release_step(self, turn_id: str, step: int, owner: str) -> None:
        """Drop ``owner``'s step claim (the reply is stored, or the call failed and will be retried).
        Never raises: a claim left behind expires with its lease."""
        try:
            self._release(keys=[_k(turn_id, "stepclaim", step)], args=[owner])
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    def take_over_claim(self, turn_id: str, step: int, call_id: str, owner: str, lease: float) -> None:
        """Replace an expired or dead owner's claim with ours (``lease`` seconds)."""
        self.r.hset(
            _k(turn_id, "claims", step),
            call_id,
            orjson.dumps({"owner": owner, "lease_until": time.time() + lease, "takeover": True}),
        )

    def record_and_check(
        self,
        turn_id: str,
        step: int,
        call_id: str,
        result: dict[str, Any],
        batch_index: int,
        batch_call_ids: list[str],
        completed_event: dict[str, Any] | None = None,
    ) -> tuple[bool, bool]:
        """Store a result (first write wins), append ``call_completed``, and pass the barrier.

        Returns ``(stored, batch_done)``; ``batch_done`` is True exactly once per batch.
        """
        event = self._event_json("call_completed", completed_event) if completed_event else b""
        p = self.r.pipeline(transaction=False)
        self._record(
            keys=[
                _k(turn_id, "results", step),
                _k(turn_id),
                _k(turn_id, "events"),
                _k(turn_id, "adv", step, batch_index),
            ],
            args=[
                call_id,
                orjson.dumps(result),
                RETENTION_SECONDS,
                "1" if result.get("terminate") else "0",
                event,
                EVENTS_MAXLEN,
                *batch_call_ids,
            ],
            client=p,
        )
        p.zadd("turns:watch", {turn_id: time.time() + self.progress_timeout}, xx=True)
        (stored, done), _ = p.execute()
        return bool(stored), bool(done)

    def batch_done(self, turn_id: str, step: int, batch_index: int, call_ids: list[str]) -> bool:
        """The barrier alone: True exactly once, for the caller that sees the batch's last result."""
        _, done = self._record(
            keys=[
                _k(turn_id, "results", step),
                _k(turn_id),
                _k(turn_id, "events"),
                _k(turn_id, "adv", step, batch_index),
            ],
            args=["", "", RETENTION_SECONDS, "0", "", EVENTS_MAXLEN, *call_ids],
        )
        return bool(done)
