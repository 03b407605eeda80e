"""What the control plane does when a turn ends, by the kind of turn.

The turn's ``metadata`` says what it belongs to: ``workflow_task_id`` (a
workflow task attempt: validate and commit its result) or
``background_job_id`` (a background agent job: record its outcome). A plain
turn has nothing to do, and no ``turn_finished`` task is sent for it
(``worker.turn.request.END_HOOK_METADATA`` names the keys).
"""

from __future__ import annotations

from typing import Any

from worker.turn.engine import TurnEngine
from worker.turn.state import TurnState


def on_turn_finished(engine: TurnEngine, state: TurnState) -> dict[str, Any]:
    """Run the hook matching the turn's metadata; returns a small report for logs."""
    meta = state.request.get("metadata") or {}
    if meta.get("workflow_task_id"):
        return _workflow_attempt_finished(engine, state, meta)
    if meta.get("background_job_id"):
        return _background_job_finished(engine, state, meta)
    return {"action": "none", "status": state.status.value, "keys": sorted(meta)}


def _workflow_attempt_finished(engine: TurnEngine, state: TurnState, meta: dict[str, Any]) -> dict[str, Any]:
    """Commit or fail a workflow task attempt (docs/architecture.md, "Workflow tasks"; ``worker.records.workflow``).

    A turn that terminated through ``submit_result`` commits only if the
    submitted value validates again against the schema persisted on the task
    (not the one in the turn's metadata); any other ending fails the attempt
    with the turn's status and error. Idempotent under redelivery.
    """
    from worker.records.workflow import WorkflowService, find_submission

    submission = find_submission(engine.store, state.turn_id, state.step - 1)
    return WorkflowService(engine.redis).commit_turn(state.turn_id, state.status.value, state.error, meta, submission)


def _background_job_finished(engine: TurnEngine, state: TurnState, meta: dict[str, Any]) -> dict[str, Any]:
    """Record a background agent job's outcome (``worker.records.jobs``): the turn's terminal status,
    final output and error. The first report wins, so a redelivered hook changes nothing."""
    from worker.records.jobs import JobStore

    rec = JobStore(engine.redis).record_finished(
        meta["background_job_id"], state.status.value, state.final_output, state.error
    )
    return {
        "action": "job_recorded" if rec else "job_already_recorded",
        "job_id": meta["background_job_id"],
        "status": state.status.value,
    }
