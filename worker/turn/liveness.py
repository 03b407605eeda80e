"""Who owns work, and whether the owner is still alive.

A *node* is one worker main process (``host:pid``); its pool children and threads share it.
Each node keeps a heartbeat key in Redis with a short TTL (``Settings.liveness_ttl``) and a
hash of the turn tasks it holds (received, running, or reserved by prefetch). When a node's
heartbeat is gone, the watchdog re-drives the turns it held at once, instead of waiting for
the broker's ``visibility_timeout`` (on the Redis broker, messages reserved by a dead worker
come back only after it; docs/architecture.md "Re-drive").

A claim owner (a tool call's or a model step's) is ``host:node_pid:pid:thread``: the thread that
runs it, in its process, under its node (under a threads pool a duplicate delivery runs in
another thread of the same process, and must not pass for the claim's owner). It is dead when
its process is gone on this host, or its node's heartbeat has expired.

Keys: ``agent:alive:<node>`` (heartbeat, TTL), ``agent:nodes`` (set of known nodes),
``agent:node:<node>:tasks`` (hash ``task_id`` -> ``turn_id``), ``agent:suspect:<node>``
(when the watchdog first saw the heartbeat missing: one missed sweep never kills a node
whose heartbeat only paused while Redis restarted), ``agent:dead:<node>`` (a tombstone, one day).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import redis

HOST = socket.gethostname()
NODES_KEY = "agent:nodes"

# The node of this process: set by the Celery edge in the worker main process before the
# pool forks (``tasks.liveness``), inherited by prefork children. None outside a worker.
_node: str | None = None


def set_node(node: str | None) -> None:
    """Declare this process (and the children it forks from now on) part of ``node``."""
    global _node
    _node = node


def node() -> str:
    """This process's node: the worker main process ``host:pid``, or this process outside a worker."""
    return _node or f"{HOST}:{os.getpid()}"


def owner() -> str:
    """This thread as a claim owner: ``host:node_pid:pid:thread`` (computed per call: prefork
    children fork after import, and each pool thread is its own owner)."""
    return f"{node()}:{os.getpid()}:{threading.get_ident()}"


def _alive_key(node_id: str) -> str:
    return f"agent:alive:{node_id}"


def held_key(node_id: str) -> str:
    """The hash of the turn tasks ``node_id`` holds (``task_id`` -> ``turn_id``)."""
    return f"agent:node:{node_id}:tasks"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class Liveness:
    """Heartbeats and held tasks of nodes, in the Redis at ``client`` (bytes replies); its keys
    (``agent:nodes``, ``agent:alive:*``, ``agent:node:*:tasks``, ``agent:suspect:*``,
    ``agent:dead:*``) are read and written here only. ``ttl`` in seconds."""

    def __init__(self, client: redis.Redis, ttl: float):
        # redis-py types every reply as ``bytes | str``; the parsing below says what each reply is.
        self._r: Any = client
        self.ttl = ttl

    def beat(self, node_id: str) -> None:
        """Refresh ``node_id``'s heartbeat (call every ``ttl / 3``). Raises redis errors."""
        with self._r.pipeline(transaction=False) as p:
            p.set(_alive_key(node_id), time.time(), px=int(self.ttl * 1000))
            p.sadd(NODES_KEY, node_id)
            p.delete(f"agent:suspect:{node_id}")
            p.execute()

    def retire(self, node_id: str) -> None:
        """A clean shutdown: forget the node (its held tasks go back to the broker unacked)."""
        with self._r.pipeline(transaction=False) as p:
            p.delete(_alive_key(node_id))
            p.srem(NODES_KEY, node_id)
            p.execute()

    def hold(self, node_id: str, task_id: str, turn_id: str) -> None:
        """Record that ``node_id`` holds a task of ``turn_id`` (received, reserved or running)."""
        self._r.hset(held_key(node_id), task_id, turn_id)

    def replace_held(self, node_id: str, held: dict[str, str]) -> None:
        """Write the node's whole held set (``task_id`` -> ``turn_id``) in one round trip."""
        key = held_key(node_id)
        with self._r.pipeline() as p:
            p.delete(key)
            if held:
                p.hset(key, mapping=held)
            p.execute()

    def update_held(self, node_id: str, added: dict[str, str], removed: list[str]) -> None:
        """Change the node's held set: ``added`` (``task_id`` -> ``turn_id``) set, ``removed`` task ids
        deleted; one round trip (none when both are empty)."""
        if not added and not removed:
            return
        key = held_key(node_id)
        with self._r.pipeline(transaction=False) as p:
            if removed:
                p.hdel(key, *removed)
            if added:
                p.hset(key, mapping=added)
            p.execute()

    def release(self, node_id: str, *task_ids: str) -> None:
        """The tasks ended (ran or were dropped): the node no longer holds them. One round trip."""
        if task_ids:
            self._r.hdel(held_key(node_id), *task_ids)

    def is_alive(self, node_id: str) -> bool:
        """True while ``node_id``'s heartbeat key exists."""
        return bool(self._r.exists(_alive_key(node_id)))

    def owner_is_dead(self, claim_owner: str) -> bool:
        """True when a claim's owner (``host:node_pid:pid:thread``, or a bare ``host:pid``) is gone:
        its process is dead on this host, or its node's heartbeat expired."""
        parts = claim_owner.split(":")
        if len(parts) == 4 and all(p.isdigit() for p in parts[1:]):
            host, node_pid, pid, _thread = parts
            node_id = f"{host}:{node_pid}"
        else:
            host, _, pid = claim_owner.rpartition(":")
            node_id = None
        if not pid.isdigit():
            return False
        if int(pid) == os.getpid() and host == HOST:
            return False
        if host == HOST and _pid_gone(int(pid)):
            return True
        if node_id is None or self.is_alive(node_id):
            return False
        # A node is judged only once it was known: registered, or declared dead by the watchdog.
        return bool(self._r.sismember(NODES_KEY, node_id) or self._r.exists(f"agent:dead:{node_id}"))

    def dead_nodes(self) -> list[str]:
        """Nodes whose heartbeat has been missing for at least ``ttl`` (seen by two sweeps).

        The first sweep that finds a heartbeat missing only marks the node suspect; a live node
        whose beats paused (Redis restarting) beats again within ``ttl / 3`` and clears the mark.
        """
        now = time.time()
        dead = []
        for raw in self._r.smembers(NODES_KEY):
            node_id = raw.decode() if isinstance(raw, bytes) else raw
            if self.is_alive(node_id):
                continue
            key = f"agent:suspect:{node_id}"
            self._r.set(key, now, nx=True, ex=int(self.ttl * 10) + 60)
            since = float(self._r.get(key) or now)
            if now - since >= self.ttl:
                dead.append(node_id)
        return dead

    def bury(self, node_id: str) -> dict[str, str]:
        """A node known dead (its supervisor saw its process exit): drop its heartbeat and take what
        it held (``task_id`` -> ``turn_id``), without waiting for the heartbeat to expire."""
        key = held_key(node_id)
        with self._r.pipeline() as p:
            p.hgetall(key)
            p.delete(key, _alive_key(node_id), f"agent:suspect:{node_id}")
            p.srem(NODES_KEY, node_id)
            p.set(f"agent:dead:{node_id}", time.time(), ex=86400)
            held, *_ = p.execute()
        return {_text(k): _text(v) for k, v in held.items()}

    def held_by_live_nodes(self) -> dict[str, str]:
        """``task_id`` -> ``turn_id`` of what nodes with a live heartbeat hold (received, reserved or running)."""
        return self._held(live_only=True)

    def held_by_known_nodes(self) -> dict[str, str]:
        """``held_by_live_nodes`` and what the nodes whose heartbeat is gone but who are not yet
        recovered (``take_held_turns``, ``bury``) held: turns that the dead-node path re-drives."""
        return self._held(live_only=False)

    def _held(self, *, live_only: bool) -> dict[str, str]:
        nodes = [_text(n) for n in self._r.smembers(NODES_KEY)]
        with self._r.pipeline(transaction=False) as p:
            for n in nodes:
                p.exists(_alive_key(n))
                p.hgetall(held_key(n))
            replies = p.execute()
        held: dict[str, str] = {}
        for alive, tasks in zip(replies[::2], replies[1::2], strict=True):
            if alive or not live_only:
                held.update({_text(k): _text(v) for k, v in tasks.items()})
        return held

    def take_held_turns(self, node_id: str) -> set[str]:
        """The turns a dead node held; forgets the node. Each turn id once."""
        key = held_key(node_id)
        with self._r.pipeline() as p:
            p.hvals(key)
            p.delete(key)
            p.srem(NODES_KEY, node_id)
            p.delete(f"agent:suspect:{node_id}")
            p.set(f"agent:dead:{node_id}", time.time(), ex=86400)
            held, *_ = p.execute()
        return {v.decode() if isinstance(v, bytes) else v for v in held}
