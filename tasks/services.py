"""Turn-scoped services of the Celery edge, handed to tool category creators (``TurnContext.services``).

Each is a plain callable so that ``worker/`` never imports Celery:
``save_schedule_entry(record)`` / ``delete_schedule_entry(schedule_id)`` manage a
schedule's celery-redbeat entry (``tasks.schedule_entries``). The engine adds its
own ``enqueue_turn`` and ``cancel_turn`` (``TurnEngine.context``).
"""

from __future__ import annotations

from typing import Any, Callable

from tasks.schedule_entries import delete_schedule_entry, save_schedule_entry
from worker.turn.request import TurnRequest


def turn_services(request: TurnRequest) -> dict[str, Callable[..., Any]]:
    """The Celery edge's callables for a turn's tool creators: schedule entries."""
    return {"save_schedule_entry": save_schedule_entry, "delete_schedule_entry": delete_schedule_entry}
