"""The barrier: a call's result stored, and whose result closes a batch.

A result is stored (first write wins) with its ``call_completed`` event, the progress deadline
pushed, and the batch's barrier passed, in one round trip; the barrier fires once, for the caller
whose result completed the batch, or, given the step's closing writes (a one-call step), closes the
step in the same script. ``TurnStore`` (``worker.turn.store``) holds one ``Barrier`` on its Redis
client, as ``store.barrier``; the claims that come before a result are ``worker.turn.claims``'.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import redis

from worker.turn.guard import LUA_APPLY_WRITES, LUA_TERMINAL, Writes, encode_writes
from worker.turn.keys import WATCH_KEY
from worker.turn.keys import key as _k
from worker.turn.state import (
    EVENTS_MAXLEN,
    RETENTION_SECONDS,
    AdvanceView,
    CallResult,
    TurnState,
    event_json,
    hash_pairs,
    parse_results,
)

# Store a call's result (first write wins), announce it, push the progress deadline and pass the
# batch barrier, in one round trip. The barrier sets the "advanced" key once, only when every call
# of the batch has a result; its winner gets what closing the batch reads (the turn hash, the
# cancel flag, the step's results), or, given the step's closing writes (a one-call step,
# ``BatchCompletion.closing_writes``), has them applied here when this caller's result was the
# one stored and the turn is still at the step's tools phase, not ended and not cancelled: the
# step is closed in the same round trip.
# KEYS: results, turn hash, events, adv, cancel, watch zset, the closing writes' keys...;
# ARGV: call_id, result ('' = only check the barrier), ttl, terminate, event, maxlen, deadline
# ('' = none), turn id, step, number of call ids, call_ids..., then the closing writes
# (``LUA_APPLY_WRITES``), if any.
# Returns {stored, 0}, {stored, 1, turn hash (flat), cancelled, results (flat)} or {stored, 2}
# (closed).
_RECORD_LUA = (
    LUA_TERMINAL
    + LUA_APPLY_WRITES
    + """
local n = tonumber(ARGV[10])
local t = nil
-- The fence (``fence`` below) read once, up front, when this result may close the step by itself.
if ARGV[2] ~= '' and n == 1 and ARGV[11] == ARGV[1] and ARGV[12] then
  t = redis.call('HMGET', KEYS[2], 'status', 'step', 'phase', 'cancel', 'layout', 'plan_step', 'results_step')
  -- A layout-2 turn (``keys``) whose step kept its plan in the hash (it asked no approval) and is
  -- this one call, with no result stored yet (every writer of such a step's results names the step
  -- in the hash's ``results_step``): its result is not kept. The closing writes carry it to the
  -- turn's items, and nothing reads a closed step's results (a redelivery is fenced out by the
  -- move: the results of a step that ended the turn, or asked approvals, are stored as below).
  if t[5] == '2' and t[6] == ARGV[9] and t[7] ~= ARGV[9] and t[4] ~= '1' and t[1] and not terminal[t[1]]
    and t[2] == ARGV[9] and t[3] == 'tools' then
    if ARGV[5] ~= '' then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5]) end
    apply_writes(12, 7)
    return {1, 2}
  end
  -- The turn went on past this step: it was closed, perhaps without keeping this call's result (as
  -- above), so a late delivery stops here instead of storing it and passing the step's barrier.
  if t[5] == '2' and tonumber(t[2] or '') and tonumber(t[2]) > tonumber(ARGV[9]) then return {0, 0} end
end
local stored = 0
if ARGV[2] ~= '' then stored = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) end
if stored == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  -- a one-call step of a layout-2 turn with a stored result is never closed without it (above)
  if n == 1 then
    local layout
    if t then layout = t[5] else layout = redis.call('HGET', KEYS[2], 'layout') end
    if layout == '2' then redis.call('HSET', KEYS[2], 'results_step', ARGV[9]) end
  end
  if ARGV[4] == '1' then redis.call('HSET', KEYS[2], 'terminate', '1') end
  if ARGV[5] ~= '' then redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5]) end
end
local function push_deadline()
  if ARGV[7] ~= '' then redis.call('ZADD', KEYS[6], 'XX', ARGV[7], ARGV[8]) end
end
for i = 11, 10 + n do
  -- the caller's own call has a result now (HSETNX above stored it or found one): not asked again
  if (ARGV[2] == '' or ARGV[i] ~= ARGV[1]) and redis.call('HEXISTS', KEYS[1], ARGV[i]) == 0 then
    push_deadline(); return {stored, 0}
  end
end
-- the cancel flag is the hash's field (KEYS[5], its key, is not read); the fence on the same read
local function fence() return redis.call('HMGET', KEYS[2], 'status', 'step', 'phase', 'cancel') end
local function closes(t)  -- the closing writes carry this caller's result: applied if the fence holds
  if ARGV[11 + n] and t[4] ~= '1' and stored == 1 and t[1] and not terminal[t[1]] and t[2] == ARGV[9]
    and t[3] == 'tools' then
    apply_writes(11 + n, 7)  -- the closing writes set the next step's deadline
    return true
  end
  return false
end
-- The batch is this caller's call alone, given its closing writes: the caller that stores the
-- result applies them here, in the same script, so the turn moves on before anyone else can see
-- the result; a later delivery (its result not stored) finds it moved on and stops here. The
-- barrier key is only needed when the closing writes did not apply (a cancel, an ended turn).
if n == 1 and ARGV[11] == ARGV[1] and ARGV[12] then
  t = t or fence()
  if closes(t) then return {stored, 2} end
  if stored == 0 and (not t[1] or terminal[t[1]] or t[2] ~= ARGV[9] or t[3] ~= 'tools') then
    push_deadline(); return {stored, 0}
  end
end
if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', 86400) then push_deadline(); return {stored, 0} end
t = t or fence()
local cancelled = t[4] == '1' and 1 or 0
if closes(t) then return {stored, 2} end
push_deadline()
return {stored, 1, redis.call('HGETALL', KEYS[2]), cancelled, redis.call('HGETALL', KEYS[1])}
"""
)


class Barrier:
    """Results and the barrier in the Redis at ``client`` (see the module docstring);
    ``progress_timeout``: seconds of the progress deadline a stored result pushes."""

    def __init__(self, client: redis.Redis, *, progress_timeout: float = 600.0):
        self.progress_timeout = progress_timeout
        self._record = client.register_script(_RECORD_LUA)

    def record_and_check(
        self,
        turn_id: str,
        step: int,
        call_id: str,
        result: CallResult,
        batch_index: int,
        batch_call_ids: list[str],
        completed_event: dict[str, Any] | None = None,
        closing: Writes | None = None,
    ) -> tuple[bool, AdvanceView | None | Closed]:
        """Store a result (first write wins), append ``call_completed``, push the progress
        deadline, and pass the barrier: one round trip.

        ``closing``: the step's closing writes, applied with the barrier when this result
        completes the step and the turn is still at its tools phase, not ended nor cancelled.

        Returns ``(stored, view)``: ``view`` is ``CLOSED`` when ``closing`` was applied; else what
        closing the batch reads (as ``advance_view`` returns it), exactly once per batch, to the
        caller that completed it; else None. Raises redis-py's errors as they come (the caller
        keeps the result until Redis has it: ``worker.turn.outage``).
        """
        event = event_json("call_completed", completed_event) if completed_event else b""
        write_keys, write_args = encode_writes(closing) if closing is not None else ([], [])
        reply = self._record(
            keys=[*self._record_keys(turn_id, step, batch_index), *write_keys],
            args=[
                call_id,
                orjson.dumps(result.to_json()),
                RETENTION_SECONDS,
                "1" if result.terminate else "0",
                event,
                EVENTS_MAXLEN,
                time.time() + self.progress_timeout,
                turn_id,
                step,
                len(batch_call_ids),
                *batch_call_ids,
                *write_args,
            ],
        )
        return bool(reply[0]), CLOSED if reply[1] == 2 else _advance_view(turn_id, reply)

    def batch_done(self, turn_id: str, step: int, batch_index: int, call_ids: list[str]) -> AdvanceView | None:
        """The barrier alone: the batch's ``AdvanceView`` exactly once, for the caller that sees the
        batch's last result; else None."""
        reply = self._record(
            keys=self._record_keys(turn_id, step, batch_index),
            args=["", "", RETENTION_SECONDS, "0", "", EVENTS_MAXLEN, "", turn_id, step, len(call_ids), *call_ids],
        )
        return _advance_view(turn_id, reply)

    @staticmethod
    def _record_keys(turn_id: str, step: int, batch_index: int) -> list[str]:
        return [
            _k(turn_id, "results", step),
            _k(turn_id),
            _k(turn_id, "events"),
            _k(turn_id, "adv", step, batch_index),
            _k(turn_id, "cancel"),
            WATCH_KEY,
        ]


class Closed:
    """``Barrier.record_and_check``'s answer when the step's closing writes were applied."""

    def __repr__(self) -> str:
        return "CLOSED"


CLOSED = Closed()


def _advance_view(turn_id: str, reply: list[Any]) -> AdvanceView | None:
    """The ``AdvanceView`` in the record script's reply, when the caller completed the batch."""
    if not reply[1]:
        return None
    h = hash_pairs(reply[2])
    return AdvanceView(
        TurnState.from_hash(turn_id, h) if h else None, bool(reply[3]), parse_results(hash_pairs(reply[4]))
    )
