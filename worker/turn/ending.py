"""How a turn ends: every terminal transition goes through ``TurnEnd``.

A turn ends at a model step (a final answer, a cap, a refused request: the step's guarded
transition), when a batch closes (``worker.turn.completion``), or at any step (``fail``: cancel,
gateway failure after retries, the watchdog giving up). Whichever it is, ``finished`` then writes
the ``turn_finished`` event with the turn's token usage (unless the transition wrote it), counts the
turn's metric, emits its root span and, for a turn with end hooks, asks the queue layer to run them.
Each method returns the ``Ended`` record that the step's ``StepOutcome`` carries back
(docs/architecture.md, "A step's outcome").
"""

from __future__ import annotations

from worker.turn import metrics, telemetry
from worker.turn.outcome import Ended
from worker.turn.request import TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import StaleStep

CANCELLED = "cancelled by the control plane"


class TurnEnd:
    """The terminal transitions of turns in ``runtime``'s store."""

    def __init__(self, runtime: TurnRuntime, *, count_here: bool = True):
        self.rt = runtime
        # A worker counts the ends it makes; a control plane serves no metrics, so it has a worker
        # count its ends (``Dispatcher.count_ended``): every end is counted once, where it is served.
        self.count_here = count_here

    def finished(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        error: str | None = None,
        final_output: str | None = None,
        hooks: bool | None = None,
        usage: dict[str, int] | None = None,
        created_at: float | None = None,
    ) -> Ended:
        """What follows every terminal transition (see the module docstring). ``hooks``: whether the
        turn has end hooks (read from the store when None). ``usage``: the turn's totals, when the
        transition already wrote the ``turn_finished`` event with them (``Moves.end_at_model_step``).
        ``created_at`` (epoch s): the turn's, when the caller read it (else read from the store for
        the duration metric)."""
        store = self.rt.store
        if usage is None:
            usage = self.rt.usage.totals(turn_id)
            store.event(
                turn_id, "turn_finished", status=status.value, error=error, final_output=final_output, usage=usage
            )
        if not self.count_here:
            self.rt.dispatcher.count_ended(turn_id)
        elif created_at:
            metrics.turn_ended(status.value, error, self.rt.clock() - created_at)
        elif (state := store.load(turn_id)) is not None:
            metrics.turn_ended(status.value, error, self.rt.clock() - state.created_at)
        else:
            metrics.turn_ended(status.value, error)
        if telemetry.tracing_active():
            self._root_span(turn_id, status, error, usage)
        if store.awaits_hooks(turn_id) if hooks is None else hooks:
            self.rt.dispatcher.turn_finished(turn_id)
        return Ended(status, error)

    def _root_span(self, turn_id: str, status: TurnStatus, error: str | None, usage: dict[str, int]) -> None:
        state = self.rt.store.load(turn_id)
        if state is None:
            return
        telemetry.emit_turn_span(
            state.traceparent,
            turn_id=turn_id,
            agent_id=state.agent_id,
            status=status.value,
            error=error,
            created_at=state.created_at,
            queue=str(state.request.get("queue", "turns")),
            model_calls=state.model_calls,
            usage=usage,
        )

    def fail(self, turn_id: str, status: TurnStatus, error: str) -> Ended | None:
        """End a non-terminal turn whatever its step (``Moves.fail``). None if it had already ended."""
        if not self.rt.store.moves.fail(turn_id, status, error):
            return None
        return self.finished(turn_id, status, error=error)

    def at_model_step(self, turn_id: str, step: int, status: TurnStatus, error: str) -> Ended | None:
        """End the turn at model step ``step`` without a reply to record (a cap, a refused request);
        None when the step was fenced out (another delivery moved the turn on)."""
        try:
            self.rt.store.moves.end_at_model_step(turn_id, step, [], status, error=error, count_model_call=False)
        except StaleStep:
            return None
        return self.finished(turn_id, status, error=error)

    def cancel(self, turn_id: str) -> bool:
        """Ask a turn to stop: sets the cancel flag (running tools see their abort signal; the next
        step boundary ends the turn), and ends at once a turn that runs nothing that would see it:
        one still queued (its queued step will be fenced out) or one awaiting approval.

        Returns False when the turn is unknown or already ended.
        """
        store = self.rt.store
        state = store.load(turn_id)
        if state is None or state.status.terminal:
            return False
        store.request_cancel(turn_id)
        if state.status == TurnStatus.queued:
            self.fail(turn_id, TurnStatus.cancelled, CANCELLED)
        elif state.status == TurnStatus.awaiting_approval:
            self.fail(turn_id, TurnStatus.cancelled, CANCELLED + " while awaiting approval")
            store.approvals.forget(turn_id)
        return True
