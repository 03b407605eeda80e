"""Per-process runtime objects for the Celery layer: Redis client, turn store, engine.

Built lazily once per worker process (after fork), so prefork children never
share sockets with the parent.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import redis
from celery import chain, group

from worker.dispatch import Batch
from worker.gateway import ResponsesClient
from worker.loop import TurnEngine
from worker.settings import get_settings
from worker.toolsets import toolset_resolver
from worker.turn import TurnRequest
from worker.turn_store import TurnStore

_lock = threading.Lock()
_engine: TurnEngine | None = None
_pid: int | None = None


class CeleryDispatcher:
    """Turns engine decisions into Celery messages.

    - a model step: ``turn_step`` on the turn's queue (``turns``, ``background`` or ``workflow``);
    - a parallel batch: a ``group`` of ``tool_call`` tasks on ``tools``;
    - a sequential batch: a ``chain`` of ``tool_call`` tasks on ``tools`` (one after another).
    No chord: the barrier is the turn store's (DESIGN-NOTES section 1).
    """

    def __init__(self, broker_url: str | None = None):
        # A control plane may name its own Redis; workers use the app's broker.
        self._broker_url = broker_url
        self._conn: Any = None

    def _options(self) -> dict[str, Any]:
        from tasks.app import app

        if not self._broker_url or self._broker_url == app.conf.broker_url:
            return {}
        if self._conn is None:
            self._conn = app.connection_for_write(self._broker_url)
        return {"connection": self._conn}

    def enqueue_step(self, turn_id: str, step: int, *, queue: str) -> None:
        """Send ``turn_step(turn_id, step)`` to ``queue``."""
        from tasks.turns import turn_step

        turn_step.apply_async((turn_id, step), queue=queue, **self._options())

    def dispatch_batch(self, turn_id: str, step: int, batch_index: int, batch: Batch, *, queue: str) -> None:
        """Send the batch's ``tool_call`` tasks: one task, a group (parallel) or a chain (sequential)."""
        from tasks.turns import tool_call

        sigs = [tool_call.si(turn_id, step, cid).set(queue=queue) for cid in batch.call_ids]
        if len(sigs) == 1:
            sigs[0].apply_async()
        elif batch.mode == "parallel":
            group(sigs).apply_async()
        else:
            chain(*sigs).apply_async()

    def turn_finished(self, turn_id: str) -> None:
        """Send ``turn_finished(turn_id)`` (the control-plane hooks) to ``turns``."""
        from tasks.turns import turn_finished

        turn_finished.apply_async((turn_id,), queue="turns", **self._options())

    def services(self, request: TurnRequest) -> dict[str, Callable[..., Any]]:
        """Turn-scoped callables for tool creators (``tasks.services.turn_services``)."""
        from tasks.services import turn_services

        return turn_services(request)


def redis_client() -> redis.Redis:
    """A Redis client for ``REDIS_URL`` with connect/read timeouts (seconds) and health checks."""
    settings = get_settings()
    return redis.Redis.from_url(settings.redis_url, socket_timeout=30, socket_connect_timeout=5,
                                health_check_interval=30)


def get_engine() -> TurnEngine:
    """The process's ``TurnEngine`` (created on first use, re-created after a fork)."""
    global _engine, _pid
    with _lock:
        if _engine is None or _pid != os.getpid():
            settings = get_settings()
            store = TurnStore(redis_client(),
                              progress_timeout=settings.progress_timeout)
            client = ResponsesClient(settings.openai_base_url, settings.openai_api_key.get_secret_value(),
                                     timeout=settings.model_timeout, connect_timeout=settings.model_connect_timeout)
            _engine = TurnEngine(store, settings, CeleryDispatcher(), toolset_resolver(settings), client)
            _pid = os.getpid()
        return _engine
