"""Worker liveness in Redis (``worker.turn.liveness``): a heartbeat per worker node and the turn
tasks it holds, so the watchdog can re-drive a dead node's turns within seconds.

Wired through Celery signals: ``worker_init`` names the node (before the pool forks, so prefork
children inherit it) and starts the heartbeat thread; a turn task the node now holds, prefetched
or running, is recorded when it is fetched, and forgotten by the process that ran it
(``task_postrun``). Under an in-process pool (threads, solo) the held tasks are kept in memory
(``task_received``) and written by the heartbeat thread every ``HELD_FLUSH_SECONDS`` (one round
trip for hundreds of tasks, instead of two per task on the consumer's thread; what changed since
the last flush, not the whole set, which is written every ``HELD_WHOLE_SECONDS``: ``flush_held``). A prefork node
records a fetched task in the pipeline that records the fetch itself (``tasks.broker.QoS``: no
round trip of its own), and its children, which cannot reach their parent's memory, forget their
tasks in Redis in batches, from a thread of their own, every ``HELD_FLUSH_SECONDS`` (a record
left a moment longer only re-drives a turn that has moved on, which fencing drops; a record
written late could lose a turn). A Redis outage only pauses the heartbeat:
the watchdog waits a full ``liveness_ttl`` after first missing a heartbeat before it declares a
node dead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import redis
from celery.signals import task_postrun, task_received, worker_init, worker_process_shutdown, worker_shutdown

from tasks import broker, held
from tasks.runtime import drain_model_calls, redis_client
from worker.settings import get_settings
from worker.turn import liveness

log = logging.getLogger("agent.liveness")

# Tasks whose first argument is a turn id: the ones a dead node's turn needs re-driven.
TURN_TASKS = frozenset({"tasks.turns.turn_step", "tasks.turns.tool_call"})

# How often the heartbeat thread writes the held tasks of an in-process pool (seconds): a turn
# received this recently when its node dies is recovered by its progress deadline instead.
HELD_FLUSH_SECONDS = 0.5
# How often the whole held set is written instead of its changes (seconds): a write the Redis primary
# acknowledged and lost in a failover (replication is asynchronous) is made good within this time.
# It must stay well under the watchdog's SETTLE_AFTER_RESTART (3 s): the reconciliation after a
# failover re-drives every turn no node holds, and a held record still missing then re-drives a
# step whose model call is in flight, which pays that call again (seen at 5 s: 4 re-paid calls in
# one primary kill of `make deploy-check --scale`).
HELD_WHOLE_SECONDS = 1.0

_stop = threading.Event()
_records: tuple[int, liveness.Liveness] | None = None


def _records_for_this_process() -> liveness.Liveness:
    # One client per process: a prefork child must not share its parent's sockets.
    global _records
    if _records is None or _records[0] != os.getpid():
        _records = (os.getpid(), liveness.Liveness(redis_client(), get_settings().liveness_ttl))
    return _records[1]


def _heartbeat(node: str, records: liveness.Liveness) -> None:
    interval = records.ttl / 3
    next_beat = next_whole = 0.0
    while not _stop.wait(HELD_FLUSH_SECONDS if held.in_process() else interval):
        try:
            if held.in_process() and time.monotonic() >= next_whole:
                held.resync()  # the whole set this time (``HELD_WHOLE_SECONDS``)
                next_whole = time.monotonic() + HELD_WHOLE_SECONDS
            if held.in_process() and held.dirty.is_set():
                flush_held(node, records)
            if time.monotonic() >= next_beat:
                records.beat(node)
                next_beat = time.monotonic() + interval
        except redis.RedisError as exc:  # Redis restarting or failing over: beat again next time,
            log.warning("heartbeat of %s not written: %s", node, exc)
            next_whole = 0.0  # and write the whole held set first: the new primary may lack some


def flush_held(node: str, records: liveness.Liveness) -> None:
    """Write what changed in the node's held set since the last flush (``held.take_changes``: the
    whole set the first time, and after a flush that failed). Raises redis errors (the next flush
    then writes the whole set)."""
    held.dirty.clear()
    whole, added, removed = held.take_changes()
    try:
        if whole is not None:
            records.replace_held(node, whole)
        else:
            records.update_held(node, added, removed)
    except redis.RedisError:
        held.resync()
        raise


@worker_init.connect
def _start_heartbeat(sender: Any = None, **_: object) -> None:
    from celery.concurrency.prefork import TaskPool as PreforkPool

    pool_cls = getattr(sender, "pool_cls", None)
    held.set_in_process(isinstance(pool_cls, type) and not issubclass(pool_cls, PreforkPool))
    node = f"{liveness.HOST}:{os.getpid()}"
    liveness.set_node(node)
    # A prefork node records a fetched turn task with kombu's record of the fetch (tasks.broker).
    broker.record_fetched_turns(None if held.in_process() else liveness.held_key(node), TURN_TASKS)
    records = _records_for_this_process()  # shared with the consumer thread (redis-py is thread-safe)
    try:
        records.beat(node)
    except redis.RedisError as exc:
        log.warning("first heartbeat of %s not written: %s", node, exc)
    threading.Thread(target=_heartbeat, args=(node, records), name="agent-heartbeat", daemon=True).start()


@worker_shutdown.connect
def _retire(**_: object) -> None:
    # The model calls in flight end first, the heartbeat still beating: a node that stops on
    # purpose hands no call on (made and paid again elsewhere), and its turns stay its own.
    try:
        drain_model_calls()
    finally:
        _stop.set()
    try:
        _records_for_this_process().retire(liveness.node())
    except redis.RedisError:
        pass


@task_received.connect
def _hold(request: Any = None, **_: object) -> None:
    if request is None or request.name not in TURN_TASKS or not request.args:
        return
    if held.in_process():
        held.hold(request.id, str(request.args[0]))
    # else: recorded with the fetch (tasks.broker.QoS.append)


@task_postrun.connect
def _release(task_id: Any = None, task: Any = None, **_: object) -> None:
    if task is None or task.name not in TURN_TASKS:
        return
    if held.in_process():
        held.release(task_id)
        return
    _ended.add(task_id)


class _EndedTasks:
    """The tasks a prefork child ran since its last flush, forgotten in Redis in one round trip
    every ``HELD_FLUSH_SECONDS`` by a thread of the child's own (started with its first task)."""

    def __init__(self) -> None:
        self._ids: list[str] = []
        self._lock = threading.Lock()
        self._pid = 0

    def add(self, task_id: str) -> None:
        with self._lock:
            self._ids.append(task_id)
            if self._pid != os.getpid():  # the first task of this process (a fork copies no thread)
                self._pid = os.getpid()
                threading.Thread(target=self._run, name="agent-held-release", daemon=True).start()

    def _run(self) -> None:
        while not _stop.wait(HELD_FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        """Forget the tasks ended so far; kept for the next flush while Redis does not answer."""
        with self._lock:
            ids, self._ids = self._ids, []
        try:
            _records_for_this_process().release(liveness.node(), *ids)
        except redis.RedisError as exc:
            log.warning("could not forget %d held tasks: %s", len(ids), exc)
            with self._lock:
                self._ids[:0] = ids


_ended = _EndedTasks()


@worker_process_shutdown.connect
def _flush_ended(**_: object) -> None:
    _ended.flush()
