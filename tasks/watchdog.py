"""The watchdog, run by celery beat every ``Settings.watchdog_interval`` seconds:

- rejects tool calls nobody approved before their approval deadline
  (``worker.turn.gate.ApprovalGate.expire``), which resumes their turns;
- re-drives every turn held by a worker node whose heartbeat stopped (``tasks.liveness``): a
  killed worker's turns recover within about ``2 * liveness_ttl``, not after the broker's
  ``visibility_timeout``;
- re-drives the turns whose tool calls wait in the queue of a node that died holding homes
  (``tasks.placement.rescue_dead_queues``): their calls are re-sent through placement;
- re-drives turns whose progress deadline passed (a lost message, a crash between barrier and
  enqueue), failing a turn after ``Settings.max_redrives`` re-drives without progress;
- re-sends the end hooks of ended turns whose hooks never reported done.

A turn whose owner is alive is never re-driven for taking long: its deadline covers the longest
single wait (``Settings.progress_timeout``); a turn parked on approvals holds nothing to re-drive.

The sweep runs every second, so it sends no task events (``send_events=False``): it never
fills Flower's task list. When it failed turns, it sends ``tasks.watchdog.turns_failed``, a task
Flower does show, which reports FAILURE (``TurnFailed`` naming them), so that those turns show
as failures like the ones a step ends (``tasks.turns``).
"""

from __future__ import annotations

from tasks.app import app
from tasks.placement import rescue_dead_queues
from tasks.runtime import get_engine
from tasks.turns import TurnFailed
from worker.placement.records import Placement


@app.task(name="tasks.watchdog.sweep", acks_late=True, send_events=False)
def sweep() -> dict[str, str]:
    """Re-drive every overdue turn once; returns ``{turn_id: action}``. Sends ``turns_failed``
    (after everything is done) when it failed turns that made no progress."""
    engine = get_engine()
    limit = engine.settings.max_redrives
    done: dict[str, str] = {}
    for turn_id, n in engine.approvals.expire().items():  # before the re-drives: an expiry resumes the turn
        done[turn_id] = f"{n} approvals expired"
    for node in engine.liveness.dead_nodes():
        for turn_id in sorted(engine.liveness.take_held_turns(node)):
            done[turn_id] = engine.redrive(turn_id, limit, reason=f"worker {node} stopped").action
    for node, turns in rescue_dead_queues(Placement(engine.store.r, engine.settings.liveness_ttl)).items():
        for turn_id in sorted(turns - set(done)):
            done[turn_id] = engine.redrive(turn_id, limit, reason=f"home node {node} stopped").action
    for turn_id in engine.store.overdue():
        if turn_id not in done:
            done[turn_id] = engine.redrive(turn_id, limit).action
    for turn_id in engine.store.hooks_overdue():  # a lost turn_finished message
        engine.dispatcher.turn_finished(turn_id)
        done[turn_id] = "hooks re-sent"
    failed = sorted(t for t, action in done.items() if action == "failed")
    if failed:
        queue = (sweep.request.delivery_info or {}).get("routing_key") or "turns"
        # apply_async passes argsrepr on to the message; celery-types does not declare it.
        turns_failed.apply_async((failed,), queue=queue, argsrepr=f"watchdog failed {', '.join(failed)}")  # type: ignore[call-arg]
    return done


@app.task(name="tasks.watchdog.turns_failed", throws=(TurnFailed,), ignore_result=True)
def turns_failed(turn_ids: list[str]) -> None:
    """Raises ``TurnFailed`` naming the turns the watchdog failed: a FAILURE row in Flower."""
    raise TurnFailed(f"the watchdog failed {len(turn_ids)} turn(s) that made no progress: {', '.join(turn_ids)}")
