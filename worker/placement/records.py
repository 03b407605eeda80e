"""Placement records in Redis: which node holds each agent's home, which nodes host homes, and
the last snapshot of each home (``docs/placement.md``).

A *node* is a homes root with the tools workers that serve it; it is named (``node_name``) and
has its own queue, ``tools.node.<name>`` (``node_queue``). An agent's computer-tool calls go to
the queue of the node its record names.

The rule (``rendezvous``): a new agent, or one whose node is gone, goes to the live node, not
draining, with the highest ``sha1(agent_id + "\\n" + node)``: rendezvous (highest random weight)
hashing. Every dispatcher computes the same choice from the same live set without coordination;
agents spread evenly; when a node dies its agents spread over all the others instead of piling
onto one; a node that joins takes no agent from anyone (records are sticky). The choice is made
and written in one Lua script, so two dispatchers placing one agent at once agree.

Fencing: each (re-)placement increments the record's ``epoch``. A node materializes a home for
one epoch (``worker.placement.homes``); a snapshot is accepted only from the node and epoch the
record names, so a node declared dead that still runs cannot overwrite its successor's snapshot.

Keys (times are the Redis server's clock, seconds):

- ``agent:homes:nodes``: sorted set, node -> time of its last heartbeat; a node is live while its
  heartbeat is at most ``ttl`` seconds old;
- ``agent:homes:draining``: set of nodes that take no new placement (``drain``);
- ``agent:homes:node:<node>``: hash of what a node tells operators (``store``, ``root``, ``drained_at``);
- ``agent:homes:node:<node>:agents``: set of the agents placed there;
- ``agent:homes:node:<node>:dirty``: set of its agents whose home changed since their last snapshot;
- ``agent:placement:<agent_id>``: hash ``node`` ('' once released by a drain), ``epoch``,
  ``reason`` (``new``, ``node_down``, ``drained``), ``prev`` (the node before), ``at``;
- ``agent:snapshot:<agent_id>``: hash ``object``, ``epoch``, ``node``, ``taken_at``, ``bytes``,
  ``uploaded``, ``format``; ``failure``, ``failed_at``, ``failed_node`` while the last attempt failed.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, cast

import redis
from redis.typing import EncodableT, FieldT

NODES_KEY = "agent:homes:nodes"
DRAINING_KEY = "agent:homes:draining"
NODE_PREFIX = "agent:homes:node:"
QUEUE_PREFIX = "tools.node."


def node_queue(node: str) -> str:
    """The queue of ``node``'s tools workers: ``tools.node.<node>``."""
    return QUEUE_PREFIX + node


def placement_key(agent_id: str) -> str:
    """The placement record of ``agent_id``."""
    return f"agent:placement:{agent_id}"


def snapshot_key(agent_id: str) -> str:
    """The record of ``agent_id``'s last snapshot."""
    return f"agent:snapshot:{agent_id}"


def node_key(node: str, part: str = "") -> str:
    """``agent:homes:node:<node>`` and its ``:agents`` / ``:dirty`` sets."""
    return f"{NODE_PREFIX}{node}{':' + part if part else ''}"


def rendezvous(agent_id: str, nodes: list[str]) -> str | None:
    """The node the rule picks for ``agent_id`` among ``nodes`` (live, not draining), or None.

    The same choice as the Lua script's (``redis.sha1hex`` of ``agent_id + "\\n" + node``, the
    highest hex digest wins), for tests and tools.
    """
    if not nodes:
        return None
    return max(nodes, key=lambda n: hashlib.sha1(f"{agent_id}\n{n}".encode()).hexdigest())


_LUA_NOW = "local t = redis.call('TIME')\nlocal now = tonumber(t[1]) + tonumber(t[2]) / 1000000\n"

# KEYS: placement record, nodes, draining. ARGV: agent id, ttl (s), node key prefix, the node asking
# ('' for a dispatcher), 1 to mark the home changed when it is that node's. Returns {node ('' when no
# node can take it), epoch, reason, prev, 1 when placed by this call}.
_LOCATE_LUA = (
    _LUA_NOW
    + """
local ttl = tonumber(ARGV[2])
local rec = redis.call('HMGET', KEYS[1], 'node', 'epoch', 'reason', 'prev')
local node = rec[1] or false
local epoch = tonumber(rec[2] or '0')
local function alive(n)
  local s = redis.call('ZSCORE', KEYS[2], n)
  return s and (now - tonumber(s)) <= ttl
end
local placed = 0
if not (node and node ~= '' and alive(node)) then
  local best, best_h = false, false
  for _, n in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], now - ttl, '+inf')) do
    if redis.call('SISMEMBER', KEYS[3], n) == 0 then
      local h = redis.sha1hex(ARGV[1] .. '\\n' .. n)
      if not best_h or h > best_h then best, best_h = n, h end
    end
  end
  if not best then
    return {'', epoch, rec[3] or '', rec[4] or '', 0}
  end
  local reason, prev
  if not node then
    reason, prev = 'new', ''
  elseif node == '' then
    reason, prev = rec[3] or 'drained', rec[4] or ''
  else
    reason, prev = 'node_down', node
  end
  epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
  redis.call('HSET', KEYS[1], 'node', best, 'reason', reason, 'prev', prev, 'at', tostring(now))
  if node and node ~= '' then redis.call('SREM', ARGV[3] .. node .. ':agents', ARGV[1]) end
  redis.call('SADD', ARGV[3] .. best .. ':agents', ARGV[1])
  node, rec[3], rec[4], placed = best, reason, prev, 1
end
if ARGV[5] == '1' and node == ARGV[4] then redis.call('SADD', ARGV[3] .. node .. ':dirty', ARGV[1]) end
return {node, epoch, rec[3] or '', rec[4] or '', placed}
"""
)

# KEYS: nodes. ARGV: node. The heartbeat, stamped with the server's clock.
_BEAT_LUA = _LUA_NOW + "redis.call('ZADD', KEYS[1], now, ARGV[1])\nreturn tostring(now)\n"

# KEYS: placement record, snapshot record. ARGV: node, epoch, object, bytes, 1 to release the agent
# (a drain), node key prefix, agent id, bytes uploaded, format. Accepted only from the node and epoch
# the record names; returns {1, the object it replaces ('' if none)} or {0, ''}.
_COMMIT_LUA = (
    _LUA_NOW
    + """
local rec = redis.call('HMGET', KEYS[1], 'node', 'epoch')
if rec[1] ~= ARGV[1] or rec[2] ~= ARGV[2] then return {0, ''} end
local old = ''
if ARGV[3] ~= '' then
  old = redis.call('HGET', KEYS[2], 'object') or ''
  redis.call('HSET', KEYS[2], 'object', ARGV[3], 'epoch', ARGV[2], 'node', ARGV[1],
    'taken_at', tostring(now), 'bytes', ARGV[4], 'uploaded', ARGV[8], 'format', ARGV[9])
  redis.call('HDEL', KEYS[2], 'failure', 'failed_at', 'failed_node')
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'node', '', 'prev', ARGV[1], 'reason', 'drained', 'at', tostring(now))
  redis.call('SREM', ARGV[6] .. ARGV[1] .. ':agents', ARGV[7])
end
return {1, old}
"""
)


@dataclass(frozen=True)
class Located:
    """Where an agent's home is: ``node`` ('' when no live node can take it), the record's
    ``epoch``, why it was last placed (``reason``: ``new``, ``node_down``, ``drained``), the node
    before (``prev``), and whether this very lookup placed it (``placed``)."""

    node: str
    epoch: int
    reason: str = ""
    prev: str = ""
    placed: bool = False


@dataclass(frozen=True)
class SnapshotInfo:
    """The last accepted snapshot of a home: its ``object`` key in the store, the placement
    ``epoch`` and ``node`` that took it, when (``taken_at``, Unix seconds), the data it holds
    (``bytes``), what was uploaded for it (``uploaded``), its ``format`` (``manifest``; '' for one
    taken by a version that did not sign snapshots), and the last ``failure`` since ('' if none)."""

    object: str
    epoch: int
    node: str
    taken_at: float
    bytes: int
    uploaded: int = 0
    format: str = ""
    failure: str = ""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Placement:
    """The placement records in the Redis at ``r``; a node is live while its heartbeat is at most
    ``ttl`` seconds old (``Settings.liveness_ttl``, as for worker liveness). Methods raise redis errors."""

    def __init__(self, r: redis.Redis, ttl: float):
        self.r = r
        self.ttl = ttl
        self._locate = r.register_script(_LOCATE_LUA)
        self._beat = r.register_script(_BEAT_LUA)
        self._commit = r.register_script(_COMMIT_LUA)

    # ----- where an agent's home is ------------------------------------------
    def locate(self, agent_id: str, asking: str = "", changed: bool = False) -> Located:
        """The node holding ``agent_id``'s home, placing it first (rule in the module docstring)
        when it has none or its node is not live. One round trip.

        ``asking``: the node about to run one of the agent's calls; with ``changed`` the home is
        marked changed (a snapshot is due) when that node holds it.
        """
        node, epoch, reason, prev, placed = self._locate(
            keys=[placement_key(agent_id), NODES_KEY, DRAINING_KEY],
            args=[agent_id, self.ttl, NODE_PREFIX, asking, 1 if changed else 0],
        )
        return Located(_text(node), int(epoch), _text(reason), _text(prev), bool(placed))

    def record(self, agent_id: str) -> dict[str, str]:
        """The raw placement record (empty when the agent was never placed)."""
        return {_text(k): _text(v) for k, v in self.r.hgetall(placement_key(agent_id)).items()}

    # ----- nodes -------------------------------------------------------------
    def _now(self) -> float:
        sec, usec = self.r.time()  # the server's clock, as the scripts use
        return float(sec) + float(usec) / 1e6

    def beat(self, node: str, info: dict[str, str] | None = None) -> float:
        """``node`` is live (call every ``ttl / 3``); ``info`` is what it tells operators. Returns
        the server time of the beat."""
        if info:
            fields: dict[FieldT, EncodableT] = {k: v for k, v in info.items()}  # redis-py's key type is invariant
            self.r.hset(node_key(node), mapping=fields)
        return float(_text(self._beat(keys=[NODES_KEY], args=[node])))

    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node that ever beat: ``{node: {"age": seconds since its heartbeat, "live",
        "draining", "agents": how many agents it holds, **info}}``."""
        now = self._now()
        draining = {_text(n) for n in self.r.smembers(DRAINING_KEY)}
        out: dict[str, dict[str, Any]] = {}
        # (member, score) pairs: redis-py's stubs type ZRANGE's reply as members only
        scored = cast("list[tuple[bytes, float]]", self.r.zrange(NODES_KEY, 0, -1, withscores=True))
        for raw, score in scored:
            n = _text(raw)
            info = {_text(k): _text(v) for k, v in self.r.hgetall(node_key(n)).items()}
            age = max(0.0, now - float(score))
            out[n] = {
                **info,
                "age": round(age, 1),
                "live": age <= self.ttl,
                "draining": n in draining,
                "agents": int(self.r.scard(node_key(n, "agents"))),
            }
        return out

    def dead_nodes(self, since: float) -> list[str]:
        """Nodes whose heartbeat is older than ``ttl`` but younger than ``since`` seconds."""
        now = self._now()
        return [_text(n) for n in self.r.zrangebyscore(NODES_KEY, now - since, now - self.ttl)]

    def drain(self, node: str, on: bool = True) -> None:
        """Mark ``node`` draining (it takes no new placement and releases its agents) or not."""
        if on:
            self.r.sadd(DRAINING_KEY, node)
        else:
            self.r.srem(DRAINING_KEY, node)
            self.r.hdel(node_key(node), "drained_at")

    def draining(self, node: str) -> bool:
        """True while ``node`` is marked draining."""
        return bool(self.r.sismember(DRAINING_KEY, node))

    def agents_on(self, node: str) -> set[str]:
        """The agents whose record names ``node``."""
        return {_text(a) for a in self.r.smembers(node_key(node, "agents"))}

    def take_dirty(self, node: str) -> set[str]:
        """The agents of ``node`` whose home changed since their last snapshot (and forget them:
        a call admitted from now on marks its home again)."""
        key = node_key(node, "dirty")
        with self.r.pipeline() as p:
            p.smembers(key)
            p.delete(key)
            members, _ = p.execute()
        return {_text(a) for a in members}

    def mark_dirty(self, node: str, agent_id: str) -> None:
        """Mark ``agent_id``'s home on ``node`` changed again (a snapshot that could not be taken)."""
        self.r.sadd(node_key(node, "dirty"), agent_id)

    # ----- snapshots ---------------------------------------------------------
    def commit(
        self,
        agent_id: str,
        node: str,
        epoch: int,
        obj: str = "",
        size: int = 0,
        release: bool = False,
        uploaded: int = 0,
        fmt: str = "manifest",
    ) -> tuple[bool, str]:
        """Record snapshot ``obj`` ('' for none; ``size`` data bytes, ``uploaded`` bytes sent, format
        ``fmt``) of ``agent_id``'s home, taken by ``node`` at ``epoch`` (and forget a failure recorded
        before), and with ``release`` let the agent go (a drain). Accepted only if the record still
        names that node and epoch. Returns ``(accepted, object it replaces or '')``."""
        ok, old = self._commit(
            keys=[placement_key(agent_id), snapshot_key(agent_id)],
            args=[node, epoch, obj, size, 1 if release else 0, NODE_PREFIX, agent_id, uploaded, fmt],
        )
        return bool(ok), _text(old)

    def record_failure(self, agent_id: str, node: str, reason: str) -> None:
        """Record why a snapshot of ``agent_id``'s home failed or was refused (``failure``, ``failed_at``,
        ``failed_node`` in its snapshot record; cleared by the next accepted snapshot), for operators."""
        self.r.hset(
            snapshot_key(agent_id),
            mapping={"failure": reason[:1000], "failed_at": f"{self._now():.3f}", "failed_node": node},
        )

    def snapshot(self, agent_id: str) -> SnapshotInfo | None:
        """The last accepted snapshot of ``agent_id``'s home, or None."""
        h = {_text(k): _text(v) for k, v in self.r.hgetall(snapshot_key(agent_id)).items()}
        if not h.get("object"):
            return None
        return SnapshotInfo(
            h["object"],
            int(h["epoch"]),
            h["node"],
            float(h["taken_at"]),
            int(h.get("bytes", 0)),
            int(h.get("uploaded", 0)),
            h.get("format", ""),
            h.get("failure", ""),
        )

    def snapshot_record(self, agent_id: str) -> dict[str, str]:
        """The raw snapshot record (with ``failure``/``failed_at``/``failed_node`` when the last
        attempt failed), empty when none."""
        return {_text(k): _text(v) for k, v in self.r.hgetall(snapshot_key(agent_id)).items()}
