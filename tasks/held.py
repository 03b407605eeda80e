"""The turn work an in-process pool's node holds, in memory: task ids of turn tasks it received,
and ``step:<turn_id>:<step>`` for each asynchronous model call in flight (``tasks.model_calls``).

``tasks.liveness`` writes this set to Redis from its heartbeat thread, one round trip per flush;
a node found dead has every turn in it re-driven at once. A flush writes what changed since the
last one (``take_changes``), not the whole set: a node with ten thousand model calls in flight
rewrote ten thousand fields twice a second (bench/README.md, "Ten thousand turns in flight").
The whole set is written first, and again after a flush that failed (``resync``). Prefork children
cannot reach their parent's memory: they record their tasks in Redis themselves, and make model
calls inline.
"""

from __future__ import annotations

import threading

_held: dict[str, str] = {}  # key -> turn id
_added: dict[str, str] = {}  # held since the last ``take_changes``
_removed: set[str] = set()  # released since the last ``take_changes``
_whole = True  # the next ``take_changes`` gives the whole set (the first flush, or one after a failure)
_lock = threading.Lock()
dirty = threading.Event()
_in_process = False


def set_in_process(value: bool) -> None:
    """Declare whether this node's pool runs tasks in its own process (threads, solo)."""
    global _in_process
    _in_process = value


def in_process() -> bool:
    """True in a worker node whose pool runs tasks in its own process (threads, solo)."""
    return _in_process


def hold(key: str, turn_id: str) -> None:
    """Record ``key`` (a task id, or ``step:<turn_id>:<step>``) as held for ``turn_id``."""
    with _lock:
        _held[key] = turn_id
        _added[key] = turn_id
        _removed.discard(key)
    dirty.set()


def release(key: str) -> None:
    """Forget ``key``."""
    with _lock:
        _held.pop(key, None)
        _added.pop(key, None)
        _removed.add(key)
    dirty.set()


def take_changes() -> tuple[dict[str, str] | None, dict[str, str], list[str]]:
    """What to write since the last call: ``(whole, added, removed)``. ``whole`` is the held set
    (``key`` -> ``turn_id``) to write in place of the stored one, on the first call and after
    ``resync`` (``added`` and ``removed`` are then empty); otherwise None, and ``added`` the keys
    held since (to set), ``removed`` those released since (to delete)."""
    global _whole
    with _lock:
        whole = dict(_held) if _whole else None
        added, removed = ({}, []) if _whole else (dict(_added), sorted(_removed))
        _whole = False
        _added.clear()
        _removed.clear()
    return whole, added, removed


def resync() -> None:
    """The last changes taken were not written: the next ``take_changes`` gives the whole set."""
    global _whole
    with _lock:
        _whole = True
    dirty.set()


def snapshot() -> dict[str, str]:
    """A copy of the held set (``key`` -> ``turn_id``)."""
    with _lock:
        return dict(_held)
