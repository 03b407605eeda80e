"""The watchdog: re-drives turns whose progress deadline passed (lost message, crash
between barrier and enqueue), fails a turn after ``MAX_REDRIVES`` re-drives without
progress, re-sends the end hooks of ended turns whose hooks never reported done, and rejects
tool calls nobody approved before their approval deadline (``worker.turn.parking.expire``).
Run by celery beat every 15 s (``beat_schedule`` in ``tasks.app``).

A sweep that failed turns reports FAILURE (``TurnFailed`` naming them), after all its work,
so that Flower shows those turns as failures like the ones a step ends (``tasks.turns``)."""

from __future__ import annotations

from tasks.app import app
from tasks.runtime import get_engine
from tasks.turns import TurnFailed
from worker.turn.parking import expire

MAX_REDRIVES = 3


@app.task(name="tasks.watchdog.sweep", acks_late=True, throws=(TurnFailed,))
def sweep() -> dict:
    """Re-drive every overdue turn once; returns ``{turn_id: action}``. Raises ``TurnFailed``
    (after everything is done) when it failed turns that made no progress."""
    engine = get_engine()
    done = {}
    for turn_id, n in expire(engine).items():  # before the re-drives: an expiry resumes the turn
        done[turn_id] = f"{n} approvals expired"
    for turn_id in engine.store.overdue():
        done[turn_id] = engine.redrive(turn_id, MAX_REDRIVES).action
    for turn_id in engine.store.hooks_overdue():  # a lost turn_finished message
        engine.dispatcher.turn_finished(turn_id)
        done[turn_id] = "hooks re-sent"
    failed = sorted(t for t, action in done.items() if action == "failed")
    if failed:
        raise TurnFailed(f"the watchdog failed {len(failed)} turn(s) that made no progress: {', '.join(failed)}")
    return done
