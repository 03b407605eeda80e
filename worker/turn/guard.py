"""Guarded transitions: a turn's fencing check and the transition's writes in one Lua script;
and the turn's creation, guarded by its id and idempotency key, in another.

A transition (``worker.turn.store``) may only change a turn that is still at the step and phase
its caller saw, and not ended (fencing, docs/architecture.md "Claims and fencing"). ``WATCH``/``HMGET``/``MULTI``
did that in three round trips; ``GuardScript`` does it in one: the script reads the guard fields,
and only if they match runs the writes it was given, atomically (a Lua script runs alone on the
server, and its writes invalidate other clients' ``WATCH`` like any write).

The writes are recorded with redis-py's own command methods (``Writes`` is its ``CoreCommands``
mixin with ``execute_command`` replaced by a recorder), so each one is built exactly as a
pipeline would build it; only single-key write commands are accepted, and each key is passed in
``KEYS``.

``CreateScript`` stores a new turn only if no turn has its id and its agent has not used its
idempotency key, with its first items, watch deadline, places in the
listing indexes (``worker.turn.listing``) and ``turn_queued`` event: one round trip where
``WATCH``/``GET``/``HGET``/``MULTI`` and the event took four.
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import redis
from redis.client import Pipeline
from redis.commands.core import CoreCommands

from worker.turn.keys import key
from worker.turn.request import TurnRefused, TurnStatus
from worker.turn.state import StaleStep

# Write commands a transition may record: each takes its one key as the first argument.
SINGLE_KEY_WRITES = frozenset(
    {
        "RPUSH",
        "LPUSH",
        "LTRIM",
        "SET",
        "DEL",
        "HSET",
        "HDEL",
        "HINCRBY",
        "EXPIRE",
        "ZADD",
        "ZREM",
        "XADD",
        "SADD",
        "SREM",
    }
)

_CHUNK = 1000  # arguments per recorded write (an even number: HSET takes field/value pairs)
# Writes whose arguments after the key are values (or HSET's pairs) that may be split in chunks.
_CHUNKED = frozenset({"RPUSH", "LPUSH", "SADD", "SREM", "HDEL", "ZREM", "HSET"})

# One creation in this many (by its ``created_at`` milliseconds) prunes its agent's listing index.
PRUNE_EVERY = 16

# A Lua table of the terminal statuses (``TurnStatus.terminal``), for the scripts that fence on them.
LUA_TERMINAL = "local terminal = {" + ", ".join(f"['{s.value}'] = true" for s in TurnStatus if s.terminal) + "}\n"


# A Lua function applying recorded writes (``encode_writes``): from ARGV[i] on, per write, its
# argument count after the key, the command name, its arguments; its key is KEYS[k], KEYS[k + 1]...
LUA_APPLY_WRITES = """
local function apply_writes(i, k)
  while i <= #ARGV do
    local n = tonumber(ARGV[i])
    local cmd = {ARGV[i + 1], KEYS[k]}
    for j = 1, n do cmd[j + 2] = ARGV[i + 1 + j] end
    redis.call(unpack(cmd))
    i, k = i + 2 + n, k + 1
  end
end
"""

# KEYS[1] turn hash, KEYS[2] the ended turns awaiting hooks (``turns:finishing``), KEYS[3..] the
# writes' keys in order. ARGV: step, phase, only if status ('' = any; another status skips the
# writes without an error), hooks deadline ('' = the turn does not end here), turn id, then per
# write: its argument count after the key, the command name, its arguments.
# Returns {1, hooks} (hooks: 1 when the ended turn has end hooks), or {0, reason} when fenced out.
_GUARD_LUA = (
    LUA_TERMINAL
    + LUA_APPLY_WRITES
    + """
local h = redis.call('HMGET', KEYS[1], 'status', 'step', 'phase', 'end_hooks')
if not h[1] then return {0, 'turn does not exist'} end
if terminal[h[1]] then return {0, 'turn is ' .. h[1]} end
if h[2] ~= ARGV[1] or h[3] ~= ARGV[2] then
  return {0, 'turn is at step ' .. tostring(h[2]) .. '/' .. tostring(h[3]) .. ', not ' .. ARGV[1] .. '/' .. ARGV[2]}
end
if ARGV[3] ~= '' and h[1] ~= ARGV[3] then return {1, 0} end
apply_writes(6, 3)
local hooks = 0
if ARGV[4] ~= '' and h[4] == '1' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[5])
  hooks = 1
end
return {1, hooks}
"""
)


# A queue message as the Redis commands that send it: ``("LPUSH", queue list, payload)`` and
# ``("PUBLISH", channel, payload)`` for its monitoring event (``Dispatcher.step_message``).
MessageCommands = list[tuple[str, str, bytes]]


class Writes(CoreCommands):
    """Records redis-py write commands (``rpush``, ``hset``, ``xadd``... as on a pipeline) for a
    ``GuardScript`` to run; nothing is sent. Raises ``ValueError`` for a command that is not a
    single-key write (``SINGLE_KEY_WRITES``)."""

    _event_dispatcher: Any = None  # CoreCommands expects a client's; nothing is sent from here
    # A sync client's mark (redis-py's ``SyncClientProtocol``): its stubs give a command method's
    # sync signature only to a client that has it, and recording is synchronous.
    _is_async_client: Literal[False] = False

    def __init__(self) -> None:
        self.recorded: list[tuple[Any, ...]] = []
        self.sends_message = False

    def send_message(self, commands: MessageCommands) -> None:
        """Record a queue message's commands (``Dispatcher.step_message``), after the writes
        recorded so far: applied with them, the message is sent in the same script as the state
        change that decided it, and a worker that sees the message sees that state. Sets
        ``sends_message``. Raises ``ValueError`` for a command other than ``LPUSH`` (the queue's
        list) and ``PUBLISH`` (its event; the channel goes where a write's key goes, in ``KEYS``,
        which a standalone Redis allows)."""
        for name, target, payload in commands:
            if name not in ("LPUSH", "PUBLISH"):
                raise ValueError(f"{name} is not a queue message's command")
            self.recorded.append((name, target, payload))
        self.sends_message = True

    def execute_command(self, *args: Any, **options: Any) -> "Writes":
        """Record ``args`` (``(COMMAND, key, *arguments)``, as redis-py's command methods build
        them); returns ``self`` so calls chain as on a pipeline. Raises ``ValueError`` as the
        class says, or for a write too long for the script (see below)."""
        name = str(args[0]).upper()
        if name not in SINGLE_KEY_WRITES:
            raise ValueError(f"{name} cannot be part of a guarded transition (single-key writes only)")
        target, values = args[1], args[2:]
        if name == "DEL" and values:
            raise ValueError("DEL of several keys cannot be part of a guarded transition (single-key writes only)")
        # The script unpacks each write's arguments, and Lua's unpack takes a few thousand at most:
        # long lists of values or field/value pairs go as several writes of _CHUNK values; any
        # other write that long is refused here, before anything runs (a script that failed
        # half-way would leave half a transition: scripts do not roll back).
        if len(values) <= _CHUNK:
            self.recorded.append((name, target, *values))
        elif name in _CHUNKED:
            for i in range(0, len(values), _CHUNK):
                self.recorded.append((name, target, *values[i : i + _CHUNK]))
        else:
            raise ValueError(f"{name} with {len(values)} arguments is too long for a guarded transition")
        return self


WriteTarget = Writes | Pipeline
"""Where a move's writes go: recorded for a script (``Writes``), or queued on a pipeline (the
``MULTI`` of a ``WATCH`` transaction: ``Moves.fail``)."""


def encode_writes(writes: Writes) -> tuple[list[Any], list[Any]]:
    """``writes`` as ``(keys, args)`` for ``LUA_APPLY_WRITES``: one key per write, and per write
    its argument count after the key, its command name and its arguments."""
    keys: list[Any] = []
    args: list[Any] = []
    for name, write_key, *rest in writes.recorded:
        keys.append(write_key)
        args.append(len(rest))
        args.append(name)
        args.extend(rest)
    return keys, args


class GuardScript:
    """The guard script registered on ``client`` (a ``redis.Redis``)."""

    def __init__(self, client: redis.Redis, finishing_key: str):
        self._script = client.register_script(_GUARD_LUA)
        self._finishing_key = finishing_key

    def run(
        self,
        turn_id: str,
        step: int,
        phase: str,
        writes: Writes,
        *,
        only_if_status: str | None = None,
        hooks_deadline: float | None = None,
    ) -> bool:
        """Apply ``writes`` if the turn is at ``step``/``phase`` and not ended; with
        ``only_if_status``, a turn in another status is left as it is (no error).
        ``hooks_deadline`` (epoch seconds): the turn ends here, and a turn with end hooks is added
        to the finishing set with that deadline.

        Returns True when the ended turn has end hooks to run. Raises ``StaleStep`` (nothing
        written) when fenced out.
        """
        write_keys, write_args = encode_writes(writes)
        keys = [key(turn_id), self._finishing_key, *write_keys]
        args: list[Any] = [step, phase, only_if_status or "", "" if hooks_deadline is None else hooks_deadline, turn_id]
        ok, detail = self._script(keys=keys, args=[*args, *write_args])
        if not ok:
            raise StaleStep(detail.decode() if isinstance(detail, bytes) else str(detail))
        return bool(detail)


# KEYS: turn hash, items, watch zset, events, the index of every turn, the agent's index
# (``keys.index_key``), the idempotency key ('' for none), then the target of each message command (a
# queue's list, an event's channel). ARGV: agent id, turn id, retention s, watch deadline, turn_queued
# event, events maxlen, hash argument count, hash field/value pairs..., created_at, the initial
# items' count, the items..., then per message command its name (LPUSH or PUBLISH) and payload.
# The indexes are scored by ``created_at``. The agent's index expires twice the retention after its
# newest turn; its entries older than that are pruned here at one creation in ``PRUNE_EVERY`` (by the
# creation time's milliseconds: a listing skips and drops stale entries anyway), the index of every
# turn by the watchdog's sweep (``TurnListing.prune``): no command of their own at most creations.
# The message commands run only when the turn is created, after its writes.
# Returns {1, turn id} (created), {0, existing turn id} (the key or the id of this agent was used),
# or {-1, ''} (the id belongs to another agent).
_CREATE_LUA = """
if KEYS[7] ~= '' then
  local existing = redis.call('GET', KEYS[7])
  if existing then return {0, existing} end
end
local owner = redis.call('HGET', KEYS[1], 'agent_id')
if owner then
  if owner ~= ARGV[1] then return {-1, ''} end
  return {0, ARGV[2]}
end
if KEYS[7] ~= '' then redis.call('SET', KEYS[7], ARGV[2], 'EX', ARGV[3]) end
local nh = tonumber(ARGV[7])
redis.call('HSET', KEYS[1], unpack(ARGV, 8, 7 + nh))
local ni = tonumber(ARGV[9 + nh])
local last = 9 + nh + ni
for i = 10 + nh, last, 1000 do  -- unpack is limited to a few thousand values: push in chunks
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, math.min(i + 999, last)))
end
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5])
local created = tonumber(ARGV[8 + nh])  -- the hash's created_at, as the caller wrote it
local kept = 2 * tonumber(ARGV[3])
redis.call('ZADD', KEYS[5], created, ARGV[2])
redis.call('ZADD', KEYS[6], created, ARGV[2])
redis.call('EXPIRE', KEYS[6], kept)
if math.floor(created * 1000) % PRUNE_EVERY == 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', '(' .. (created - kept))
end
local k = 8
for i = last + 1, #ARGV, 2 do
  redis.call(ARGV[i], KEYS[k], ARGV[i + 1])
  k = k + 1
end
return {1, ARGV[2]}
""".replace("PRUNE_EVERY", str(PRUNE_EVERY))
CREATE_LUA = _CREATE_LUA  # for a caller that registers it on its own (asyncio) client


# KEYS: turn hash, cancel flag, recent cancels (``keys.CANCELS_KEY``), events; ARGV: retention s,
# now, turn id, recent cancels kept since (epoch s), events maxlen, cancel_requested event.
# The flag goes three ways: the hash's ``cancel`` field (read by the scripts that already read the
# hash, for free), the flag key (tools' abort probe), the recent cancels (a node's watch over its
# model calls: one read for all of them). The field only on a turn that exists (HSET would create one).
_CANCEL_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then redis.call('HSET', KEYS[1], 'cancel', '1') end
redis.call('SET', KEYS[2], '1', 'EX', ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[4])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'e', ARGV[6])
"""


class CancelScript:
    """The cancel request script registered on ``client`` (a ``redis.Redis``)."""

    def __init__(self, client: redis.Redis):
        self._script = client.register_script(_CANCEL_LUA)

    def run(self, keys: list[str], *, retention: int, now: float, turn_id: str, kept_since: float, events_maxlen: int,
            event: bytes) -> None:  # fmt: skip
        """Set the cancel flag of ``turn_id`` (``keys``: its hash, flag key, the recent cancels,
        its events) with its ``cancel_requested`` event ``event``. Raises redis-py's errors."""
        self._script(keys=keys, args=[retention, now, turn_id, kept_since, events_maxlen, event])


class CreateScript:
    """The creation script registered on ``client`` (a ``redis.Redis``)."""

    def __init__(self, client: redis.Redis):
        self._script = client.register_script(_CREATE_LUA)

    @staticmethod
    def arguments(
        keys: list[str],
        agent_id: str,
        turn_id: str,
        fields: dict[str, Any],
        items: list[bytes],
        *,
        retention: int,
        deadline: float,
        event: bytes,
        events_maxlen: int,
        idempotency_key: str | None = None,
        message: Sequence[tuple[str, str, bytes]] = (),
    ) -> tuple[list[str], list[Any]]:
        """The script's ``(keys, args)`` (see ``run``), for a caller that runs ``CREATE_LUA`` on a
        client of its own (an asyncio one). ``message``: a queue message's commands (``LPUSH`` onto
        its queue, ``PUBLISH`` of its event: ``Dispatcher.step_message``), sent only if the turn is
        created, atomically with it. Raises ``ValueError`` for another command."""
        for name, _target, _payload in message:
            if name not in ("LPUSH", "PUBLISH"):
                raise ValueError(f"{name} is not a queue message's command")
        pairs: list[Any] = [x for kv in fields.items() for x in kv]
        created = fields["created_at"]  # the indexes' score (``worker.turn.listing``)
        args = [agent_id, turn_id, retention, deadline, event, events_maxlen, len(pairs), *pairs, created]
        args += [len(items), *items]
        for name, _target, payload in message:
            args += [name, payload]
        return [*keys, idempotency_key or "", *(target for _name, target, _payload in message)], args

    @staticmethod
    def outcome(turn_id: str, reply: Any) -> tuple[str, bool]:
        """The script's reply as ``(turn id, created)``: ``(turn_id, True)`` when created,
        ``(existing_id, False)`` when the key or the id was already used by this agent. Raises
        ``TurnRefused`` when ``turn_id`` is another agent's."""
        code, tid = int(reply[0]), reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        if code < 0:
            raise TurnRefused(f"turn id {turn_id!r} is already used by another agent; choose another id")
        return tid, code == 1

    def run(self, turn_id: str, keys: list[str], args: list[Any]) -> tuple[str, bool]:
        """Store the turn ``turn_id`` (``arguments``' ``keys`` and ``args``): ``outcome``."""
        return self.outcome(turn_id, self._script(keys=keys, args=args))
