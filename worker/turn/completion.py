"""Batch completion: what follows a batch's barrier.

Whoever stores a batch's last result wins its barrier (``Barrier.record_and_check``: exactly once)
and closes the batch here: the next batch is sent (through the approval gate), or, after the last
batch or when the turn must stop (a terminating result, the cancel flag, a tool's retry budget for
invalid calls spent), the step's outputs are recorded in the order the model emitted the calls and
step ``n + 1`` is enqueued, or the turn ends (docs/architecture.md, "Batches").
"""

from __future__ import annotations

from typing import Any

from worker.model.items import function_call_output
from worker.turn import telemetry
from worker.turn.dispatch import Plan
from worker.turn.ending import CANCELLED, TurnEnd
from worker.turn.gate import ApprovalGate
from worker.turn.guard import Writes
from worker.turn.interfaces import step_label
from worker.turn.outcome import Ended
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import AdvanceView, CallResult, StaleStep, TurnState

NOT_RUN = "Interrupted: the call did not run (the turn ended before it)."


class BatchCompletion:
    """Closes batches of turns in ``runtime``'s store (see the module docstring)."""

    def __init__(self, runtime: TurnRuntime, gate: ApprovalGate, end: TurnEnd):
        self.rt = runtime
        self.gate = gate
        self.end = end

    def close(
        self, turn_id: str, step: int, request: TurnRequest, done_index: int, view: AdvanceView | None = None
    ) -> Ended | None:
        """Close batch ``done_index`` of ``step`` (-1: no batch ran, every call failed validation).
        ``view``: what the barrier returned to its winner; read here otherwise. Returns how the turn
        ended, when closing the batch ended it."""
        store = self.rt.store
        view = view or store.advance_view(turn_id, step)
        state = view.state
        if state is None or state.status.terminal:
            return None
        plan = store.plan(turn_id, step)
        assert plan is not None, f"turn {turn_id} step {step} has results but no plan"
        over = self.over_budget(state.invalid_counts)
        nxt = done_index + 1
        if nxt < len(plan.batches) and not (state.terminate or over or view.cancelled):
            self.gate.dispatch(turn_id, step, nxt, plan, agent_id=request.agent_id)  # a gated batch may park here
            return None
        terminal, error = self._ending(state, view.cancelled, over)
        try:
            store.moves.finish_tools(
                turn_id,
                step,
                self._outputs(plan, view.results),
                terminal=terminal,
                error=error,
                loaded_tools=_loaded_tools(state, view.results),
            )
        except StaleStep:
            return None
        if terminal is not None:
            return self.end.finished(turn_id, terminal, error=error)
        self.next_step(state, step, request)
        return None

    def closing_writes(self, state: TurnState, plan: Plan, result: CallResult, cancelled: bool) -> Writes | None:
        """The closing writes of a step whose plan is one call, given that call's ``result``
        before it is stored: ``Barrier.record_and_check`` applies them with the result when the
        turn is still at the step's tools phase and not cancelled, so the step is closed in the
        same round trip, with the next step's message when ``Writes.sends_message`` (else
        ``next_step`` sends it). None when closing needs more than the writes (the
        step has other calls, or it ends the turn: a terminating result, a cancel flag, a retry
        budget spent)."""
        terminal, _ = self._ending(state, cancelled, self.over_budget(state.invalid_counts))
        if len(plan.calls) != 1 or result.terminate or terminal is not None:
            return None
        results = {plan.calls[0].call_id: result}
        writes = self.rt.store.moves.next_step_writes(
            state.turn_id,
            state.step,
            self._outputs(plan, results),
            loaded_tools=_loaded_tools(state, results),
            known_deadline=state.deadline,
        )
        # The next step's message goes with the writes when it can (then no ``next_step``): the
        # script that moves the turn to step n + 1 also queues it, and no crash can fall between.
        turn_id, nxt, request = state.turn_id, state.step + 1, state.turn_request()
        with telemetry.under_turn(state.traceparent):
            message = self.rt.dispatcher.step_message(
                turn_id, nxt, queue=request.queue, label=step_label(request.agent_id, turn_id, nxt)
            )
        if message is not None:
            writes.send_message(message)
        return writes

    def _outputs(self, plan: Plan, results: dict[str, CallResult]) -> list[dict[str, Any]]:
        """The step's ``function_call_output`` items, in the order the model emitted its calls (a
        call without a result: ``NOT_RUN``)."""
        outputs = []
        for call in sorted(plan.calls, key=lambda c: c.index):
            res = results.get(call.call_id) or CallResult(NOT_RUN, is_error=True)
            item, _ = function_call_output(call.call_id, res.output, max_chars=self.rt.settings.max_output_chars)
            outputs.append(item)
        return outputs

    def next_step(self, state: TurnState, step: int, request: TurnRequest) -> None:
        """Enqueue step ``step + 1`` of the turn (a ``turn_step`` message on the request's queue,
        in the turn's trace), once step ``step`` is closed."""
        turn_id = state.turn_id
        with telemetry.under_turn(state.traceparent):
            self.rt.dispatcher.enqueue_step(
                turn_id, step + 1, queue=request.queue, label=step_label(request.agent_id, turn_id, step + 1)
            )

    def over_budget(self, invalid_counts: dict[str, int]) -> list[str]:
        """The tools (names, sorted) whose retry budget for invalid calls is spent: more invalid
        calls in the turn (``invalid_counts``: tool name -> count) than
        ``Settings.max_invalid_calls_per_tool``. A step with one closes at once and ends the turn."""
        limit = self.rt.settings.max_invalid_calls_per_tool
        return sorted(name for name, count in invalid_counts.items() if count > limit)

    def _ending(self, state: TurnState, cancelled: bool, over: list[str]) -> tuple[TurnStatus | None, str | None]:
        """How the step ends the turn: ``(status, error)``, or ``(None, None)`` to go on."""
        if cancelled:
            return TurnStatus.cancelled, CANCELLED
        if state.terminate:
            return TurnStatus.terminated, None
        if over:
            limit = self.rt.settings.max_invalid_calls_per_tool
            return TurnStatus.invalid_arguments, (
                f"the model sent invalid arguments to {', '.join(over)} more than {limit} times"
            )
        return None, None


def _loaded_tools(state: TurnState, results: dict[str, CallResult]) -> list[str] | None:
    """The turn's loaded tools after this step (its own, plus those ``tool_search`` loaded), or
    None when the step loaded none."""
    loaded = list(state.loaded_tools)
    for res in results.values():
        for name in res.details.get("loaded", []) or []:
            if name not in loaded:
                loaded.append(name)
    return loaded if loaded != state.loaded_tools else None
