"""Turn-scoped services handed to tool category creators (``TurnContext.services``).

Each is a plain callable so that ``worker/`` never imports Celery:
``enqueue_turn(request_dict) -> turn_id`` starts a new turn (used by schedules,
background agent jobs and workflow tasks);
``save_schedule_entry(record)`` / ``delete_schedule_entry(schedule_id)``
manage a schedule's celery-redbeat entry (``tasks.scheduler``).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

from worker.turn import TurnRequest


def enqueue_turn(request: dict[str, Any] | TurnRequest, turn_id: str | None = None) -> str:
    """Validate and enqueue a turn; returns its id (an existing one for a reused idempotency key)."""
    from tasks.runtime import get_engine

    req = request if isinstance(request, TurnRequest) else TurnRequest.model_validate(request)
    tid, _ = get_engine().create_turn(req, turn_id or uuid.uuid4().hex)
    return tid


def cancel_turn(turn_id: str) -> bool:
    """Ask a turn to stop (``TurnEngine.cancel``); False when it is unknown or already ended.
    Used by ``workflow_cancel`` and ``job_cancel``."""
    from tasks.runtime import get_engine

    return get_engine().cancel(turn_id)


def save_schedule_entry(record: dict[str, Any]) -> None:
    """Create the firing entry (celery-redbeat) of an active schedule record (``worker.schedules``)."""
    from tasks.scheduler import save_schedule_entry as save

    save(record)


def delete_schedule_entry(schedule_id: str) -> None:
    """Remove a schedule's firing entry; no error if it has none."""
    from tasks.scheduler import delete_schedule_entry as delete

    delete(schedule_id)


def turn_services(request: TurnRequest) -> dict[str, Callable[..., Any]]:
    """The callables handed to tool creators for a turn (``TurnContext.services``)."""
    return {"enqueue_turn": enqueue_turn, "cancel_turn": cancel_turn,
            "save_schedule_entry": save_schedule_entry, "delete_schedule_entry": delete_schedule_entry}
