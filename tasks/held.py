"""The turn work an in-process pool's node holds, in memory: task ids of turn tasks it received,
and ``step:<turn_id>:<step>`` for each asynchronous model call in flight (``tasks.model_calls``).

``tasks.liveness`` writes this set to Redis from its heartbeat thread (one round trip for
hundreds of entries); a node found dead has every turn in it re-driven at once. Prefork children
cannot reach their parent's memory: they record their tasks in Redis themselves, and make model
calls inline.
"""

from __future__ import annotations

import threading

_held: dict[str, str] = {}  # key -> turn id
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
    dirty.set()


def release(key: str) -> None:
    """Forget ``key``."""
    with _lock:
        _held.pop(key, None)
    dirty.set()


def snapshot() -> dict[str, str]:
    """A copy of the held set (``key`` -> ``turn_id``)."""
    with _lock:
        return dict(_held)
