"""Per-process runtime objects for the Celery layer: Redis client, turn store, engine.

Built lazily once per worker process (after fork), so prefork children never
share sockets with the parent. In a node whose pool runs tasks in its own process (threads,
solo), model calls are made on the process's event loop (``AGENT_MODEL_CALLS=async``, the
default: ``tasks.model_calls``); a warm shutdown waits for them (``drain_model_calls``, called by
``tasks.liveness`` while the node's heartbeat still runs).
"""

from __future__ import annotations

import logging
import os
import threading

import redis

from tasks import held
from tasks.dispatcher import CeleryDispatcher
from tasks.model_calls import async_setup
from tasks.placement import node_homes
from worker.model.clients import model_client
from worker.placement.records import Placement
from worker.redis_connection import redis_endpoint
from worker.settings import get_settings
from worker.tools.skills import skills_instructions
from worker.tools.toolsets import toolset_resolver
from worker.turn.durability import ReplicaAck
from worker.turn.engine import TurnEngine
from worker.turn.store import TurnStore

log = logging.getLogger("agent.tasks")
_lock = threading.Lock()
_engine: TurnEngine | None = None
_pid: int | None = None


def redis_client() -> redis.Redis:
    """A Redis client for ``REDIS_URL`` (``worker.redis_connection``: through Sentinel and TLS as
    the settings say) with connect/read timeouts (seconds) and health checks."""
    settings = get_settings()
    # A blocking pool: under a threads pool of hundreds, a burst waits for a connection
    # instead of failing with "Too many connections".
    return redis_endpoint(settings).client(max_connections=settings.redis_max_connections, wait_for_connection=30)


def get_engine() -> TurnEngine:
    """The process's ``TurnEngine`` (created on first use, re-created after a fork)."""
    global _engine, _pid
    with _lock:
        if _engine is None or _pid != os.getpid():
            settings = get_settings()
            r = redis_client()
            durability = ReplicaAck(settings.replica_acks, settings.redis_replica_ack_timeout)
            _engine = TurnEngine(
                TurnStore(
                    r,
                    progress_timeout=settings.progress_timeout,
                    durability=durability,
                    deadline_reuse=settings.progress_slack / 2,
                ),
                settings,
                CeleryDispatcher(placement=Placement(r, settings.liveness_ttl)),
                toolset_resolver(settings),
                model_client(settings),
                project_skills=skills_instructions,
                computers=node_homes(r, settings),
                async_calls=async_setup(settings) if settings.model_calls == "async" and held.in_process() else None,
                redis=r,
            )
            _pid = os.getpid()
        return _engine


def drain_model_calls() -> None:
    """A warm shutdown (``tasks.liveness``, before the node's heartbeat stops): wait for the
    asynchronous model calls in flight to end and be handled (``Settings.drain_timeout``: up to
    the longest a call can take), then publish the steps of any still running again."""
    engine = _engine
    if engine is None or engine.model_calls is None or _pid != os.getpid():
        return
    waiting = engine.model_calls.in_flight
    if waiting:
        log.warning(
            "shutdown: waiting for %d model calls in flight (up to %.0f s)", waiting, engine.settings.drain_timeout
        )
    left = engine.model_calls.drain(engine.settings.drain_timeout)
    if left:
        log.warning("shutdown: %d model calls still in flight; their steps were published again", left)
