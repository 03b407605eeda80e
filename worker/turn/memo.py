"""The model reply memo: a step's reply stored once, so a crash never pays for the same tokens twice.

``ReplyMemo.save_and_check`` stores a paid-for reply (first write wins) with the stream's last
deltas, its ``model_reply`` event and usage record, reads the cancel flag and, given the step's
move to its tools phase (``TurnStore.begin_tools_writes``), applies it when the reply was this
caller's to store and the turn is not cancelled and still at the step's model phase: one round
trip where a pipeline and a guarded transition took two (docs/architecture.md, "A turn, step by
step"). ``TurnStore`` holds one ``ReplyMemo`` on its Redis client, as ``store.memo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson
import redis

from worker.turn.durability import NO_REPLICAS, ReplicaAck, run_script
from worker.turn.guard import LUA_APPLY_WRITES, LUA_TERMINAL, Writes, encode_writes
from worker.turn.keys import key as _k
from worker.turn.state import EVENTS_MAXLEN, RETENTION_SECONDS, event_json

# Store a model step's reply (first write wins) with its events, read the cancel flag, record the
# step's usage (first write wins) and read the turn's usage rows; when the reply was this caller's
# to store, the turn is not cancelled and is still at the step's model phase, not ended, apply
# the step's move to its tools phase. One round trip (``ReplyMemo.save_and_check``).
# KEYS: reply, cancel, usage, events, turn hash, the move's write keys...; ARGV: reply JSON, ttl,
# events maxlen, usage field, usage row, usage ttl, step, number of events, events..., then the
# move's writes (``LUA_APPLY_WRITES``), if any.
# Returns {won, stored reply when not won, cancelled, usage stored, usage rows, began}; no usage
# rows when the move was applied (the turn goes on to its tools: nothing reads its totals now).
_SAVE_REPLY_LUA = (
    LUA_TERMINAL
    + LUA_APPLY_WRITES
    + """
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
local n = tonumber(ARGV[8])
for i = 9, 8 + n do redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i]) end
-- the cancel flag is the hash's field (KEYS[2], its key, is not read); the fence on the same read
local t = redis.call('HMGET', KEYS[5], 'status', 'step', 'phase', 'cancel')
local cancelled = t[4] == '1' and 1 or 0
local usage_stored = redis.call('HSETNX', KEYS[3], ARGV[4], ARGV[5])
-- the usage hash expires with the turn (``TurnStore._retire``); a record made after the end has its own
if usage_stored == 1 and (not t[1] or terminal[t[1]]) then redis.call('EXPIRE', KEYS[3], ARGV[6]) end
if not won then
  return {0, redis.call('GET', KEYS[1]) or '', cancelled, usage_stored, redis.call('HVALS', KEYS[3]), 0}
end
if cancelled == 0 and ARGV[9 + n] then
  if t[1] and not terminal[t[1]] and t[2] == ARGV[7] and t[3] == 'model' then
    apply_writes(9 + n, 6)
    return {1, '', 0, usage_stored, {}, 1}  -- the turn goes on: its totals are not needed now
  end
end
return {1, '', cancelled, usage_stored, redis.call('HVALS', KEYS[3]), 0}
"""
)


@dataclass(frozen=True)
class SavedReply:
    """What ``ReplyMemo.save_and_check`` did: the stored ``reply`` (another delivery's when
    it stored first), the cancel flag, ``usage`` as ``(stored, the turn's usage rows)`` (no rows
    when ``began``), and whether the move to the tools phase it was given was applied
    (``began``)."""

    reply: dict[str, Any]
    cancelled: bool
    usage: tuple[bool, list[bytes]]
    began: bool
    # A replica acknowledged the memo in time (``worker.turn.durability``; True without replicas).
    durable: bool = True


class ReplyMemo:
    """Model replies of turns in the Redis at ``client`` (see the module docstring)."""

    def __init__(self, client: redis.Redis, durability: ReplicaAck = NO_REPLICAS):
        self._r: Any = client
        self._save = client.register_script(_SAVE_REPLY_LUA)
        # The memo is followed by a WAIT for a replica (best effort: the reply is paid for already).
        self.durability = durability

    def save_and_check(
        self,
        turn_id: str,
        step: int,
        reply: dict[str, Any],
        event: dict[str, Any],
        usage: tuple[str, bytes],
        deltas: Sequence[tuple[str, dict[str, Any]]] = (),
        then: Writes | None = None,
    ) -> SavedReply:
        """Memoize the model reply of ``step`` (first one wins), append the ``model_reply`` event
        (after the events ``deltas``: the stream's last deltas), read the cancel flag and record the
        step's usage (``usage``: its field and row, ``UsageLedger.row``; first write wins) with the
        turn's usage rows read back: one round trip (``_SAVE_REPLY_LUA``). ``then``: the writes of
        the step's move to its tools phase (``TurnStore.begin_tools_writes``), applied in the same round trip
        when the reply was this caller's to store, the turn is not cancelled and still at ``step``'s
        model phase, not ended. Raises redis-py's errors as they come (the caller keeps the paid
        reply until Redis has it: ``worker.turn.outage``)."""
        field, row = usage
        events = [event_json(kind, data) for kind, data in deltas] + [event_json("model_reply", event)]
        write_keys, write_args = encode_writes(then) if then is not None else ([], [])
        keys = [_k(turn_id, "reply", step), _k(turn_id, "cancel"), _k(turn_id, "usage"), _k(turn_id, "events")]
        keys += [_k(turn_id), *write_keys]
        args = [orjson.dumps(reply), RETENTION_SECONDS, EVENTS_MAXLEN, field, row, RETENTION_SECONDS, step]
        args += [len(events), *events, *write_args]
        (saved,), durable = self.durability.write(
            self._r, "memo", lambda p: run_script(p, self._save, keys, args), required=False, scripts=[self._save]
        )
        won, raw, cancelled, usage_stored, rows, began = saved
        stored = reply if won else (orjson.loads(raw) if raw else reply)
        return SavedReply(stored, bool(cancelled), (bool(usage_stored), list(rows)), bool(began), durable)

    def note_response(self, turn_id: str, step: int, response_id: str) -> bool:
        """Record ``response_id``, the background response step ``step``'s call just started
        (``worker.model.background``): a re-driven step fetches it instead of paying for a new one
        (``Claims.begin_step`` reads it). Followed by ``WAIT`` for a replica, best effort as a
        memo's (``worker.turn.durability``); whether a replica acknowledged it. Raises redis-py's
        errors."""
        key = _k(turn_id, "response", step)
        _, durable = self.durability.write(
            self._r, "response", lambda p: p.set(key, response_id, ex=RETENTION_SECONDS), required=False
        )
        return durable

    def save(self, turn_id: str, step: int, reply: dict[str, Any]) -> dict[str, Any]:
        """Memoize the model reply of ``step`` (first one wins); returns the stored reply."""
        key = _k(turn_id, "reply", step)
        if self._r.set(key, orjson.dumps(reply), nx=True, ex=RETENTION_SECONDS):
            return reply
        stored: dict[str, Any] = orjson.loads(self._r.get(key))
        return stored
