"""The Celery side of asynchronous model calls (``worker.turn.async_calls``): ``CeleryCallEdge``
and the per-process ``AsyncSetup``.

- ``begin``: the call's turn is recorded as held by this node (``tasks.held``, written to Redis by
  the heartbeat thread), so a node that dies mid-call has the turn re-driven at once; the retries
  so far come from the ``turn_step`` task that started the call (its ``request.retries``);
- ``retry``: ``turn_step`` is published again with its countdown and retry count, as
  ``Task.retry`` would, so Flower and ``max_retries`` see the same attempts;
- ``end``: the held record is dropped.

Asynchronous calls run only in a node whose pool runs tasks in its own process (threads, solo):
there the held set is the node's own memory. A prefork child calls inline (``tasks.runtime``).
"""

from __future__ import annotations

from typing import Any

from celery import current_task

from tasks import held
from tasks.app import app
from tasks.dispatcher import SEND_OPTIONS, TURN_STEP, publish
from worker.model.call_loop import CallLoop
from worker.model.clients import async_model_client
from worker.settings import Settings
from worker.turn.async_calls import AsyncSetup


def _key(turn_id: str, step: int) -> str:
    # Per step: the next step of the turn may start on this node before this one is finished with.
    return f"step:{turn_id}:{step}"


class CeleryCallEdge:
    """``CallEdge`` (``worker.turn.async_calls``) on Celery and the node's held set."""

    def begin(self, turn_id: str, step: int) -> int:
        """Hold the turn for this node; the ``turn_step`` task's retries so far (0 outside a task)."""
        held.hold(_key(turn_id, step), turn_id)
        task: Any = current_task
        request = getattr(task, "request", None) if task is not None else None
        return int(getattr(request, "retries", 0) or 0)

    def end(self, turn_id: str, step: int) -> None:
        """Drop the step's held record."""
        held.release(_key(turn_id, step))

    def retry(self, turn_id: str, step: int, *, queue: str, countdown: float, retries: int) -> None:
        """Publish ``turn_step(turn_id, step)`` on ``queue`` in ``countdown`` s as retry ``retries``."""
        sig = app.signature(TURN_STEP, (turn_id, step))
        options: dict[str, Any] = {
            **SEND_OPTIONS,
            "queue": queue,
            "countdown": countdown,
            "retries": retries,
            "argsrepr": f"turn={turn_id} step={step} retry={retries}",
        }
        publish(lambda extra: sig.apply_async(**options, **extra), f"retry of step {step} of {turn_id}", wait=True)


def async_setup(settings: Settings) -> AsyncSetup:
    """The process's asynchronous-call parts: client of ``OPENAI_API_STYLE``, event loop, edge."""
    return AsyncSetup(async_model_client(settings), CallLoop(), CeleryCallEdge(), settings.model_finishers)
