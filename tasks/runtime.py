"""Per-process runtime objects for the Celery layer: Redis client, turn store, engine.

Built lazily once per worker process (after fork), so prefork children never
share sockets with the parent.
"""

from __future__ import annotations

import os
import threading

import redis

from tasks.dispatcher import CeleryDispatcher
from tasks.placement import node_homes
from worker.model.clients import model_client
from worker.placement.records import Placement
from worker.settings import get_settings
from worker.tools.skills import skills_instructions
from worker.tools.toolsets import toolset_resolver
from worker.turn.engine import TurnEngine
from worker.turn.store import TurnStore

_lock = threading.Lock()
_engine: TurnEngine | None = None
_pid: int | None = None


def redis_client() -> redis.Redis:
    """A Redis client for ``REDIS_URL`` with connect/read timeouts (seconds) and health checks."""
    settings = get_settings()
    # A blocking pool: under a threads pool of hundreds, a burst waits for a connection
    # instead of failing with "Too many connections".
    pool = redis.BlockingConnectionPool.from_url(
        settings.redis_url,
        max_connections=settings.redis_max_connections,
        timeout=30,
        socket_timeout=30,
        socket_connect_timeout=5,
        health_check_interval=30,
    )
    return redis.Redis(connection_pool=pool)


def get_engine() -> TurnEngine:
    """The process's ``TurnEngine`` (created on first use, re-created after a fork)."""
    global _engine, _pid
    with _lock:
        if _engine is None or _pid != os.getpid():
            settings = get_settings()
            store = TurnStore(redis_client(), progress_timeout=settings.progress_timeout)
            client = model_client(settings)
            _engine = TurnEngine(
                store,
                settings,
                CeleryDispatcher(placement=Placement(store.r, settings.liveness_ttl)),
                toolset_resolver(settings),
                client,
                project_skills=skills_instructions,
                computers=node_homes(store.r, settings),
            )
            _pid = os.getpid()
        return _engine
