"""The Celery edge's tool services (``ToolServices``), handed to a turn's tools and category creators.

Each is a plain callable so that ``worker/`` never imports Celery: ``save_schedule_entry(record)`` /
``delete_schedule_entry(schedule_id)`` manage a schedule's celery-redbeat entry
(``tasks.schedule_entries``). The turn loop adds its own services (Redis, settings,
``enqueue_turn``, ``cancel_turn``: ``worker.turn.toolbox``).
"""

from __future__ import annotations

from tasks.schedule_entries import delete_schedule_entry, save_schedule_entry
from worker.tooling.contract import ToolServices

EDGE_SERVICES = ToolServices(save_schedule_entry=save_schedule_entry, delete_schedule_entry=delete_schedule_entry)


def turn_services() -> ToolServices:
    """The Celery edge's services for a turn's tools: schedule entries (the same for every turn)."""
    return EDGE_SERVICES
