"""Claims: who runs a model step or a tool call.

Every operation is one round trip (a Lua script or a pipeline): a call is claimed with its
``call_started`` event; a model step is claimed with its progress deadline and, at the turn's first
step, the ``running`` mark. A call's result and the batch's barrier are ``worker.turn.barrier``'s.
``TurnStore`` (``worker.turn.store``) holds one ``Claims`` on its Redis client, as ``store.claims``.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import orjson
import redis

from worker.turn.durability import NO_REPLICAS, NotDurable, ReplicaAck, run_script
from worker.turn.guard import LUA_TERMINAL
from worker.turn.keys import WATCH_KEY
from worker.turn.keys import key as _k
from worker.turn.state import (
    EVENTS_MAXLEN,
    RETENTION_SECONDS,
    CallClaim,
    StepClaim,
    StepView,
    TurnState,
    event_json,
    hash_pairs,
)

# Claim a call for execution and announce it in one round trip.
_CLAIM_LUA = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'e', ARGV[4])
  return {1, false}
end
return {0, redis.call('HGET', KEYS[1], ARGV[1])}
"""

# Read a tool call's view (the turn hash, the step's plan, whether the call has a result, the
# cancel flag) and, when the call can be claimed at once, claim it with its ``call_started``
# event: one round trip. A call can be claimed at once when its message says so (it carries the
# end of its event: runnable, no approval, no computer, from the step's plan: the dispatcher's
# ``started``), it has no result, and the turn is at the step's tools phase, not ended. A message
# sent by an earlier version carries nothing: then ``turn:{id}:start:{n}`` (the old writers' hash of
# those ends) says it.
# KEYS: turn hash, plan, results, cancel, claims, events, start (old writers'); ARGV: step, call_id,
# claim JSON, ttl, the call_started event up to its call_id (the script ends it), events maxlen,
# the event's end from the message ('-': not claimable at once; '': none carried, read KEYS[7]).
# Returns {hash (flat), plan or '', has result, cancelled, claim, holder's claim or ''}: claim 0 =
# not tried, 1 = won, 2 = held.
_BEGIN_CALL_LUA = (
    LUA_TERMINAL
    + """
local h = redis.call('HGETALL', KEYS[1])
local f = {}
for i = 1, #h, 2 do f[h[i]] = h[i + 1] end
-- a layout-2 turn (``keys``) keeps its step's plan in the hash when the step asks no approval
local plan = f['layout'] == '2' and f['plan_step'] == ARGV[1] and f['plan'] or nil
if not plan then plan = redis.call('GET', KEYS[2]) or '' end
local function has() return redis.call('HEXISTS', KEYS[3], ARGV[2]) end
local cancelled = f['cancel'] == '1' and 1 or 0  -- the flag's hash field (KEYS[4], its key, is not read)
if #h == 0 or plan == '' or ARGV[7] == '-' then return {h, plan, has(), cancelled, 0, ''} end
-- the fence (the guard's test) on the hash just read: the script runs alone, it cannot have changed
if not f['status'] or terminal[f['status']] or f['step'] ~= ARGV[1] or f['phase'] ~= 'tools' then
  return {h, plan, has(), cancelled, 0, ''}
end
local rest = ARGV[7]
if rest == '' then rest = redis.call('HGET', KEYS[7], ARGV[2]) end
if not rest then return {h, plan, has(), cancelled, 0, ''} end
-- A call claimable at once that was never claimed has no result: only a claim's holder stores the
-- result of such a call (results written by the plan or the approval gate are those of calls
-- whose message says they are not claimable at once), so the result is asked only when the
-- claim is found taken.
if redis.call('HSETNX', KEYS[5], ARGV[2], ARGV[3]) == 1 then
  redis.call('EXPIRE', KEYS[5], ARGV[4])
  redis.call('XADD', KEYS[6], 'MAXLEN', '~', ARGV[6], '*', 'e', ARGV[5] .. rest)
  return {h, plan, 0, cancelled, 1, ''}
end
return {h, plan, has(), cancelled, 2, redis.call('HGET', KEYS[5], ARGV[2]) or ''}
"""
)


# Begin a model step in one round trip: read what the step needs (the turn hash, the history, the
# step's memoized reply, the cancel flag) and, when the step is the turn's current one, runnable
# and not memoized, take its model-call claim, push the progress deadline and, at the turn's
# first step, move it from queued to running with its turn_started event. A won claim also
# records the turn as held by the caller's node (KEYS[8], ``worker.turn.liveness``), so a node
# killed during its first model call is known to hold the turn before its heartbeat thread
# writes its held tasks.
# KEYS: turn hash, items, reply memo, cancel, step claim, watch zset, events, node's held tasks,
# [the step's background response id];
# ARGV: owner, lease s, deadline, step, now, events maxlen, turn id, the turn_started event's JSON
# up to its agent_id value (the script completes it with the turn's agent id), the lease's end.
# Returns {hash (flat), items, memo or '', cancelled, claim, started, holder}: claim 0 = not tried
# (nothing to claim), 1 = won, 2 = held by ``holder``.
_BEGIN_STEP_LUA = (
    LUA_TERMINAL
    + """
local h = redis.call('HGETALL', KEYS[1])
if #h == 0 then return {h, {}, '', 0, 0, 0, '', ''} end
local f, at = {}, {}
for i = 1, #h, 2 do f[h[i]] = h[i + 1]; at[h[i]] = i + 1 end
local items = redis.call('LRANGE', KEYS[2], 0, -1)
-- a layout-2 turn (``keys``) names the step whose reply is memoized in its hash: the memo is read
-- only then; a turn without the mark reads it at every step, as before
local memo = false
if f['layout'] ~= '2' or f['memo'] == ARGV[4] then memo = redis.call('GET', KEYS[3]) end
local cancelled = f['cancel'] == '1' and 1 or 0  -- the flag's hash field (KEYS[4], its key, is not read)
if memo or cancelled == 1 or terminal[f['status']] or f['step'] ~= ARGV[4] or f['phase'] ~= 'model' then
  return {h, items, memo or '', cancelled, 0, 0, '', ''}
end
local won = redis.call('SET', KEYS[5], ARGV[1], 'NX', 'EX', ARGV[2])
if won then redis.call('HSET', KEYS[8], 'step:' .. ARGV[7], ARGV[7]) end
-- the watch's deadline is pushed only when the claim's lease would outlive the one the turn's last
-- transition set (the hash's ``deadline``: never above the watch's score), most steps need no write
if (tonumber(f['deadline'] or '') or 0) < tonumber(ARGV[9]) then redis.call('ZADD', KEYS[6], 'XX', 'GT', ARGV[3], ARGV[7]) end
local response = KEYS[9] and redis.call('GET', KEYS[9]) or ''  -- only asked for in background mode
if not won then return {h, items, '', 0, 2, 0, redis.call('GET', KEYS[5]) or '', response} end
local started = 0
if f['status'] == 'queued' then
  redis.call('HSET', KEYS[1], 'status', 'running', 'updated_at', ARGV[5], 'redrives', 0)
  local event = ARGV[8] .. cjson.encode(f['agent_id'] or '') .. '}'
  redis.call('XADD', KEYS[7], 'MAXLEN', '~', ARGV[6], '*', 'e', event)
  h[at['status']] = 'running'
  started = 1
end
return {h, items, '', 0, 1, started, '', response}
"""
)


# Replace a dead holder's step claim, only if it still holds it, and record the new holder's
# node as holding the turn (``Claims.take_over_step``). KEYS: step claim, held key; ARGV: dead
# holder, new owner, lease (s), turn id.
_TAKE_OVER_STEP_LUA = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
redis.call('HSET', KEYS[2], 'step:' .. ARGV[4], ARGV[4])
return 1
"""

# Delete a claim only if it is still ours (one round trip).
_RELEASE_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# Delete a call's claim only if ``ARGV[2]`` still holds it (one round trip).
_RELEASE_CALL_LUA = """
local claim = redis.call('HGET', KEYS[1], ARGV[1])
if claim and cjson.decode(claim)['owner'] == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
"""


class CallRead(NamedTuple):
    """What ``Claims.begin_call`` read and did, raw (``TurnStore.call_view`` parses it)."""

    turn_hash: dict[bytes, bytes]
    """The turn's hash (empty: unknown turn)."""
    raw_plan: bytes
    """The step's plan as stored (``b""``: none)."""
    has_result: bool
    cancelled: bool
    claim: CallClaim


class Claims:
    """Claims in the Redis at ``client`` (see the module docstring); ``progress_timeout``: seconds
    of the progress deadline a won step claim pushes."""

    def __init__(self, client: redis.Redis, *, progress_timeout: float = 600.0, durability: ReplicaAck = NO_REPLICAS):
        self._r = client
        self.progress_timeout = progress_timeout
        # A destructive call's claim waits for a replica before its tool runs (worker.turn.durability).
        self.durability = durability
        self._release_call = client.register_script(_RELEASE_CALL_LUA)
        self._claim = client.register_script(_CLAIM_LUA)
        self._release = client.register_script(_RELEASE_LUA)
        self._begin_step = client.register_script(_BEGIN_STEP_LUA)
        self._take_over = client.register_script(_TAKE_OVER_STEP_LUA)
        self._begin_call = client.register_script(_BEGIN_CALL_LUA)

    def claim(
        self,
        turn_id: str,
        step: int,
        call_id: str,
        owner: str,
        lease: float,
        started_event: dict[str, Any] | None = None,
        *,
        durable: bool = False,
    ) -> tuple[bool, dict[str, Any] | None]:
        """Claim a call for execution (``lease`` seconds) and, if won, append ``call_started``.
        ``durable`` (a destructive call): a won claim must reach a replica (``ReplicaAck``) before
        the tool may run, else ``NotDurable`` is raised (the claim stays, ours: release it).

        Returns ``(won, existing_claim)``.
        """
        claim = {"owner": owner, "lease_until": time.time() + lease}
        keys = [_k(turn_id, "claims", step), _k(turn_id, "events")]
        args: list[Any] = [
            call_id,
            orjson.dumps(claim),
            RETENTION_SECONDS,
            event_json("call_started", started_event or {"call_id": call_id}),
            EVENTS_MAXLEN,
        ]
        if durable and self.durability.enabled:
            (reply,), acked = self.durability.write(
                self._r, "claim", lambda p: run_script(p, self._claim, keys, args), required=True, scripts=[self._claim]
            )
            won, raw = reply
            if won and not acked:
                raise NotDurable(f"the claim of call {call_id} of turn {turn_id} reached no replica in time")
        else:
            won, raw = self._claim(keys=keys, args=args)
        if won:
            return True, None
        return False, orjson.loads(raw) if raw else None

    def begin_call(
        self, turn_id: str, step: int, call_id: str, owner: str, lease: float, started: str | None = None
    ) -> CallRead:
        """Read call ``call_id``'s view and, when it can be claimed at once (see the script), claim
        it for ``owner`` (``lease`` seconds) with its ``call_started`` event: one round trip.
        ``started``: what the call's message carries (``Plan.started_at_once``): the end of its
        event when it may be claimed at once, ``""`` when not; None for a message that carries
        nothing (sent by a version before it: the old writers' start hash is read). Raises
        redis-py's errors as they come (callers wait an outage out: ``worker.turn.outage``)."""
        claim = {"owner": owner, "lease_until": time.time() + lease}
        h, plan, has, cancelled, tried, existing = self._begin_call(
            keys=[
                _k(turn_id),
                _k(turn_id, "plan", step),
                _k(turn_id, "results", step),
                _k(turn_id, "cancel"),
                _k(turn_id, "claims", step),
                _k(turn_id, "events"),
                _k(turn_id, "start", step),
            ],
            args=[
                step,
                call_id,
                orjson.dumps(claim),
                RETENTION_SECONDS,
                event_json("call_started", {"step": step, "call_id": call_id})[:-1],
                EVENTS_MAXLEN,
                "" if started is None else (started or "-"),
            ],
        )
        outcome = CallClaim(
            tried=tried != 0, won=tried == 1, existing=orjson.loads(existing) if tried == 2 and existing else None
        )
        return CallRead(hash_pairs(h), plan, bool(has), bool(cancelled), outcome)

    def begin_step(
        self, turn_id: str, step: int, owner: str, lease: float, held_key: str, *, background: bool = True
    ) -> StepView:
        """Read model step ``step``'s view and, if it is runnable and not memoized, take its model
        call for ``owner`` (``lease`` seconds; the progress deadline is pushed past it when the
        turn's last transition did not set it past already: the hash's ``deadline``), moving a
        queued turn to ``running`` with its ``turn_started`` event: one round trip. ``held_key``:
        the caller's node's held tasks (``worker.turn.liveness.held_key``), where a won claim is
        recorded. The view's ``claim`` says what happened: ``StepClaim(tried, holder, started)``;
        its ``response_id``, the background response a former attempt of the step started
        (``ReplyMemo.note_response``), when the step may be claimed; not read with ``background``
        False (a node that does not use background mode has no use for it: always None)."""
        now = round(time.time(), 3)
        h, items, memo, cancelled, claim, started, holder, response = self._begin_step(
            keys=[
                _k(turn_id),
                _k(turn_id, "items"),
                _k(turn_id, "reply", step),
                _k(turn_id, "cancel"),
                _k(turn_id, "stepclaim", step),
                WATCH_KEY,
                _k(turn_id, "events"),
                held_key,
                *([_k(turn_id, "response", step)] if background else []),
            ],
            args=[
                owner,
                max(1, int(lease)),
                now + max(lease, self.progress_timeout),
                step,
                now,
                EVENTS_MAXLEN,
                turn_id,
                event_json("turn_started", {})[:-1] + b',"agent_id":',
                now + max(1, int(lease)),
            ],
        )
        pairs = hash_pairs(h)
        return StepView(
            TurnState.from_hash(turn_id, pairs) if pairs else None,
            [orjson.loads(x) for x in items],
            orjson.loads(memo) if memo else None,
            bool(cancelled),
            StepClaim(
                tried=claim != 0, holder=holder.decode() if claim == 2 and holder else None, started=bool(started)
            ),
            response.decode() if response else None,
            [v for k, v in pairs.items() if k.startswith(b"usage:")],
        )

    def take_over_step(self, turn_id: str, step: int, owner: str, lease: float, dead: str, held_key: str) -> bool:
        """Replace the step claim of ``dead`` (a holder found dead) with ``owner``'s (``lease``
        seconds), recorded in ``held_key`` as ``begin_step`` records a won claim; only while
        ``dead`` still holds it: of two deliveries that found the same dead holder (a re-drive and
        a message given back), one takes the step over and the other drops, instead of both
        paying for the call. Whether this one took it."""
        keys = [_k(turn_id, "stepclaim", step), held_key]
        return bool(self._take_over(keys=keys, args=[dead, owner, max(1, int(lease)), turn_id]))

    def release_step(self, turn_id: str, step: int, owner: str) -> None:
        """Drop ``owner``'s step claim (the reply is stored, or the call failed and will be retried).
        Never raises: a claim left behind expires with its lease."""
        try:
            self._release(keys=[_k(turn_id, "stepclaim", step)], args=[owner])
        except (redis.ConnectionError, redis.TimeoutError):
            pass

    def take_over_claim(
        self, turn_id: str, step: int, call_id: str, owner: str, lease: float, *, durable: bool = False
    ) -> None:
        """Replace an expired or dead owner's claim with ours (``lease`` seconds); ``durable`` as
        for ``claim`` (raises ``NotDurable``)."""
        claim = orjson.dumps({"owner": owner, "lease_until": time.time() + lease, "takeover": True})
        key = _k(turn_id, "claims", step)
        if not (durable and self.durability.enabled):
            self._r.hset(key, call_id, claim)
            return
        _, acked = self.durability.write(self._r, "claim", lambda p: p.hset(key, call_id, claim), required=True)
        if not acked:
            raise NotDurable(f"the claim of call {call_id} of turn {turn_id} reached no replica in time")

    def release_claim(self, turn_id: str, step: int, call_id: str, owner: str) -> bool:
        """Drop ``owner``'s claim on a call that did not run (its claim reached no replica in time),
        so that a later delivery can claim it. Returns False when ``owner`` no longer held it."""
        return bool(self._release_call(keys=[_k(turn_id, "claims", step)], args=[call_id, owner]))
