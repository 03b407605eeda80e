"""The watchdog, run by celery beat every ``Settings.watchdog_interval`` seconds:

- re-drives every turn held by a worker node whose heartbeat stopped (``tasks.liveness``): a
  killed worker's turns recover within about ``2 * liveness_ttl``, not after the broker's
  ``visibility_timeout``;
- re-drives turns whose progress deadline passed (a lost message, a crash between barrier and
  enqueue), failing a turn after ``Settings.max_redrives`` re-drives without progress;
- re-sends the end hooks of ended turns whose hooks never reported done.

A turn whose owner is alive is never re-driven for taking long: its deadline covers the longest
single wait (``Settings.progress_timeout``).
"""

from __future__ import annotations

from tasks.app import app
from tasks.runtime import get_engine


@app.task(name="tasks.watchdog.sweep", acks_late=True)
def sweep() -> dict:
    """One pass; returns ``{turn_id: action}`` for the log."""
    engine = get_engine()
    limit = engine.settings.max_redrives
    done = {}
    for node in engine.liveness.dead_nodes():
        for turn_id in sorted(engine.liveness.take_held_turns(node)):
            done[turn_id] = engine.redrive(turn_id, limit, reason=f"worker {node} stopped").action
    for turn_id in engine.store.overdue():
        if turn_id not in done:
            done[turn_id] = engine.redrive(turn_id, limit).action
    for turn_id in engine.store.hooks_overdue():  # a lost turn_finished message
        engine.dispatcher.turn_finished(turn_id)
        done[turn_id] = "hooks re-sent"
    return done
