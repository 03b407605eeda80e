"""The model reply memo: a step's reply stored once, so a crash never pays for the same tokens twice.

``ReplyMemo.save_and_check`` stores a paid-for reply (first write wins) with the stream's last
deltas, its ``model_reply`` event and usage record, reads the cancel flag and, given the step's
move to its tools phase (``Moves.begin_tools_writes``), applies it when the reply was this
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
from worker.turn.keys import FINISHING_KEY
from worker.turn.keys import key as _k
from worker.turn.state import EVENTS_MAXLEN, RETENTION_SECONDS, event_json

# Store a model step's reply with its events, read the cancel flag and record the step's usage,
# and, given the step's move (to its tools phase, or the turn's end), apply it when the turn is not
# cancelled and still at the step's model phase, not ended. One round trip
# (``ReplyMemo.save_and_check``). The turn's layout mark (``keys``), read with the fence:
# - layout 2: a reply whose move applies here is not memoized (every later delivery of the step is
#   fenced out by the move) and its usage record is a field the move's own ``HSET`` writes; else
#   (no move given, a cancel) the reply is memoized (first write wins, the hash's ``memo`` names the
#   step) with its usage record, and the turn's usage rows are read back from the hash's fields.
# - layout 1 (a turn created before the mark): the memo first (first write wins), the usage record in
#   the usage hash, then the move, as before.
# KEYS: reply, cancel, usage, events, turn hash, ended turns awaiting hooks, the move's write keys...;
# ARGV: reply JSON, ttl, events maxlen, usage field, usage row, usage ttl, step, hooks deadline ('':
# the move does not end the turn), turn id, number of events, events..., then the move's writes
# (``LUA_APPLY_WRITES``), if any.
# Returns {won, stored reply when not won, cancelled, usage stored, usage rows, began, hooks}:
# began 1 = moved to the tools phase, 2 = ended (hooks: 1 when the ended turn has end hooks);
# no usage rows when the move was applied (the caller knows the totals it moved with, or needs none).
_SAVE_REPLY_LUA = (
    LUA_TERMINAL
    + LUA_APPLY_WRITES
    + """
-- the cancel flag is the hash's field (KEYS[2], its key, is not read); the fence on the same read
local t = redis.call('HMGET', KEYS[5], 'status', 'step', 'phase', 'cancel', 'layout', 'memo', 'end_hooks')
local n = tonumber(ARGV[10])
for i = 11, 10 + n do redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'e', ARGV[i]) end
local cancelled = t[4] == '1' and 1 or 0
local live = t[1] and not terminal[t[1]] and t[2] == ARGV[7] and t[3] == 'model'
local moves = ARGV[11 + n]
if t[5] == '2' then
  local function rows()  -- the usage records of steps 0..step, the hash's fields
    local out, names = {}, {}
    for i = 0, tonumber(ARGV[7]) do names[#names + 1] = 'usage:' .. i end
    for i = 1, #names, 1000 do
      local got = redis.call('HMGET', KEYS[5], unpack(names, i, math.min(i + 999, #names)))
      for j = 1, #got do if got[j] then out[#out + 1] = got[j] end end
    end
    return out
  end
  if t[6] == ARGV[7] then  -- another delivery memoized its reply first
    return {0, redis.call('GET', KEYS[1]) or '', cancelled, 0, rows(), 0, 0}
  end
  if live and cancelled == 0 and moves then
    apply_writes(11 + n, 7)  -- the move's HSET carries the usage record
    if ARGV[8] == '' then return {1, '', 0, 1, {}, 1, 0} end
    local hooks = 0
    if t[7] == '1' then redis.call('ZADD', KEYS[6], ARGV[8], ARGV[9]); hooks = 1 end
    return {1, '', 0, 1, {}, 2, hooks}
  end
  if not live then  -- moved on or ended: no memo to keep; its usage counted if no reply's was (first wins)
    return {1, '', cancelled, redis.call('HSETNX', KEYS[5], ARGV[4], ARGV[5]), rows(), 0, 0}
  end
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
  redis.call('HSET', KEYS[5], 'memo', ARGV[7], ARGV[4], ARGV[5])
  return {1, '', cancelled, 1, rows(), 0, 0}
end
local won = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2])
local usage_stored = redis.call('HSETNX', KEYS[3], ARGV[4], ARGV[5])
-- the usage hash expires with the turn (``worker.turn.moves``); a record made after the end has its own
if usage_stored == 1 and (not t[1] or terminal[t[1]]) then redis.call('EXPIRE', KEYS[3], ARGV[6]) end
if not won then
  return {0, redis.call('GET', KEYS[1]) or '', cancelled, usage_stored, redis.call('HVALS', KEYS[3]), 0, 0}
end
if cancelled == 0 and moves and ARGV[8] == '' and live then
  apply_writes(11 + n, 7)
  return {1, '', 0, usage_stored, {}, 1, 0}  -- the turn goes on: its totals are not needed now
end
return {1, '', cancelled, usage_stored, redis.call('HVALS', KEYS[3]), 0, 0}
"""
)


# A reply memoized alone (``ReplyMemo.save``). KEYS: reply, turn hash; ARGV: reply JSON, ttl, step.
# Returns {won, stored reply when not won}.
_MEMO_ONLY_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  if redis.call('HGET', KEYS[2], 'layout') == '2' then redis.call('HSET', KEYS[2], 'memo', ARGV[3]) end
  return {1, ''}
end
return {0, redis.call('GET', KEYS[1])}
"""


@dataclass(frozen=True)
class SavedReply:
    """What ``ReplyMemo.save_and_check`` did: the stored ``reply`` (another delivery's when
    it stored first), the cancel flag, ``usage`` as ``(stored, the turn's usage rows)`` (no rows
    when ``began`` or ``ended``), and whether the move it was given was applied: to the tools
    phase (``began``) or the turn's end (``ended``; ``hooks``: the ended turn has end hooks)."""

    reply: dict[str, Any]
    cancelled: bool
    usage: tuple[bool, list[bytes]]
    began: bool
    # A replica acknowledged the memo in time (``worker.turn.durability``; True without replicas).
    durable: bool = True
    ended: bool = False
    hooks: bool = False


class ReplyMemo:
    """Model replies of turns in the Redis at ``client`` (see the module docstring)."""

    def __init__(self, client: redis.Redis, durability: ReplicaAck = NO_REPLICAS):
        self._r: Any = client
        self._save = client.register_script(_SAVE_REPLY_LUA)
        self._save_only = client.register_script(_MEMO_ONLY_LUA)
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
        hooks_deadline: float | None = None,
    ) -> SavedReply:
        """Memoize the model reply of ``step`` (first one wins), append the ``model_reply`` event
        (after the events ``deltas``: the stream's last deltas), read the cancel flag and record the
        step's usage (``usage``: its field and row, ``UsageLedger.row``; first write wins) with the
        turn's usage rows read back: one round trip (``_SAVE_REPLY_LUA``). ``then``: the writes of
        the step's move to its tools phase (``Moves.begin_tools_writes``), applied in the same round trip
        when the reply was this caller's to store, the turn is not cancelled and still at ``step``'s
        model phase, not ended; ``hooks_deadline`` (epoch s): ``then`` ends the turn (a layout-2
        turn's final reply, ``Moves.end_writes``), and a turn with end hooks joins the finishing
        set with that deadline. ``usage``'s field is the usage hash's (layout 1) or the turn hash's
        (layout 2: ``keys.usage_field``, also in ``then``'s ``HSET``). Raises redis-py's errors as
        they come (the caller keeps the paid reply until Redis has it: ``worker.turn.outage``)."""
        field, row = usage
        events = [event_json(kind, data) for kind, data in deltas] + [event_json("model_reply", event)]
        write_keys, write_args = encode_writes(then) if then is not None else ([], [])
        keys = [_k(turn_id, "reply", step), _k(turn_id, "cancel"), _k(turn_id, "usage"), _k(turn_id, "events")]
        keys += [_k(turn_id), FINISHING_KEY, *write_keys]
        args = [orjson.dumps(reply), RETENTION_SECONDS, EVENTS_MAXLEN, field, row, RETENTION_SECONDS, step]
        args += ["" if hooks_deadline is None else hooks_deadline, turn_id, len(events), *events, *write_args]
        (saved,), durable = self.durability.write(
            self._r, "memo", lambda p: run_script(p, self._save, keys, args), required=False, scripts=[self._save]
        )
        won, raw, cancelled, usage_stored, rows, moved, hooks = saved
        stored = reply if won else (orjson.loads(raw) if raw else reply)
        usage_read = (bool(usage_stored), list(rows))
        return SavedReply(stored, bool(cancelled), usage_read, moved == 1, durable, ended=moved == 2, hooks=bool(hooks))

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
        """Memoize the model reply of ``step`` (first one wins; a layout-2 turn's hash names the
        step in ``memo``, which its step's claim reads); returns the stored reply."""
        won, raw = self._save_only(
            keys=[_k(turn_id, "reply", step), _k(turn_id)], args=[orjson.dumps(reply), RETENTION_SECONDS, step]
        )
        if won:
            return reply
        stored: dict[str, Any] = orjson.loads(raw)
        return stored
