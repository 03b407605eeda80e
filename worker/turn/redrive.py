"""The re-drive: the watchdog's way to restart a turn that stopped making progress.

A turn is re-driven when its progress deadline passed (a lost message, a crash between a barrier
and the next message) or when the node holding it died (``worker.turn.liveness``). The re-drive
re-sends the turn's model step, or the missing calls of its first unfinished batch, or closes a
batch whose barrier never fired. Every re-sent message is fenced and claimed like the original, so
a re-drive never runs a step or a call twice. A turn parked on approvals is left alone (nothing of
it was lost: it waits for a person), and a turn re-driven ``max_redrives`` times without progress
fails (docs/architecture.md, "Re-drive").
"""

from __future__ import annotations

from worker.turn import metrics, telemetry
from worker.turn.completion import BatchCompletion
from worker.turn.dispatch import Batch
from worker.turn.ending import TurnEnd
from worker.turn.gate import ApprovalGate
from worker.turn.interfaces import call_labels, computer_calls, step_label
from worker.turn.outcome import StepOutcome
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import TurnState


class Redrive:
    """Re-drives turns of ``runtime``'s store (see the module docstring)."""

    def __init__(self, runtime: TurnRuntime, gate: ApprovalGate, completion: BatchCompletion, end: TurnEnd):
        self.rt = runtime
        self.gate = gate
        self.completion = completion
        self.end = end

    def run(self, turn_id: str, max_redrives: int, reason: str = "no progress") -> StepOutcome:
        """Re-drive the turn (``reason``: its progress deadline passed, or the node holding it died);
        fails it after ``max_redrives`` re-drives without progress."""
        store = self.rt.store
        state = store.load(turn_id)
        if state is None or state.status.terminal:
            store.unwatch(turn_id)
            return StepOutcome("dropped", "not active")
        if state.redrives >= max_redrives:
            ended = self.end.fail(turn_id, TurnStatus.failed, f"{reason} after {state.redrives} re-drives")
            return StepOutcome("failed", "watchdog gave up", ended=ended)
        if state.status == TurnStatus.awaiting_approval and state.phase == "tools":
            parked = self.gate.redrive_parked(state)
            if parked is not None:
                return parked
        store.note_redrive(turn_id)
        store.event(turn_id, "turn_redriven", step=state.step, phase=state.phase, reason=reason)
        metrics.REDRIVES.inc()
        with telemetry.under_turn(state.traceparent):  # re-sent tasks stay in the turn's trace
            return self._resend(state, state.turn_request())

    def _resend(self, state: TurnState, request: TurnRequest) -> StepOutcome:
        turn_id, step = state.turn_id, state.step
        if state.phase == "model":
            label = step_label(request.agent_id, turn_id, step)
            self.rt.dispatcher.enqueue_step(turn_id, step, queue=request.queue, label=label)
            return StepOutcome("redriven", f"step {step}")
        plan = self.rt.store.plan(turn_id, step)
        if plan is None:
            return StepOutcome("dropped", "no plan")
        results = self.rt.store.results(turn_id, step)
        for i, batch in enumerate(plan.batches):
            missing = [c for c in batch.call_ids if c not in results]
            if missing:
                labels = call_labels(request.agent_id, turn_id, step, plan.calls)
                computer = computer_calls(request.agent_id, plan.calls)
                self.rt.dispatcher.dispatch_batch(
                    turn_id,
                    step,
                    i,
                    Batch(batch.mode, missing),
                    queue="tools",
                    labels=labels,
                    computer=computer,
                    started=plan.started_at_once(),
                )
                return StepOutcome("redriven", f"batch {i}")
        # All results present but the barrier never closed the last batch: close it now.
        ended = self.completion.close(turn_id, step, request, len(plan.batches) - 1)
        return StepOutcome("redriven", "advanced", ended=ended)
