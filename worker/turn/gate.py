"""The approval gate: how the turn loop parks a turn on approvals and resumes it.

Who must approve is ``worker.turn.approval_policy``; the records, decisions and gate keys are
``worker.turn.approvals`` (held by the store as ``store.approvals``). ``ApprovalGate`` is where the loop meets them:

- ``plan``: which calls of a step wait, recorded with its plan (the batches cut so that free calls
  run first);
- ``dispatch``: every batch is sent through it; a gated batch only through its set-once gate;
- ``admit``: a tool-call message for a call that needs approval runs only once approved (with the
  approver's edited params, if any); a rejection becomes its result;
- ``decide``: record a decision, then open the next gate: that dispatch is the turn's
  resumption, no task ever waited;
- ``expire``: the watchdog rejects what nobody decided before its deadline;
- ``redrive_parked``: the watchdog never re-drives work that waits for a person.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, Callable, ContextManager

import orjson

from worker.tooling.contract import WorkerTool
from worker.tooling.schemas import source_schema
from worker.turn import approvals, metrics, telemetry
from worker.turn.approval_policy import approval_timeout
from worker.turn.dispatch import Batch, Plan, PlannedCall, plan_batches
from worker.turn.guard import MessageCommands
from worker.turn.interfaces import call_labels, computer_calls
from worker.turn.outcome import StepOutcome
from worker.turn.request import TurnRequest
from worker.turn.runtime import TurnRuntime
from worker.turn.state import CallResult, TurnState

log = logging.getLogger("agent.approvals")

ApprovalWrites = Callable[[Any], None]
"""The writes of a step's approval requests, in its move to the tools phase
(``Moves.begin_tools_writes(also=...)``)."""


class ApprovalGate:
    """Parks and resumes turns on approvals (see the module docstring)."""

    def __init__(self, runtime: TurnRuntime):
        self.rt = runtime

    def plan(
        self, turn_id: str, step: int, request: TurnRequest, planned: list[PlannedCall], tools: list[WorkerTool[Any]]
    ) -> tuple[list[Batch], ApprovalWrites | None]:
        """The step's batches (``plan_batches``) cut for approvals (``approvals.split_for_approval``),
        and the writes that record its approval requests in ``begin_tools``'s transaction (None when
        no call needs one)."""
        batches = plan_batches(planned)
        asked = {c.name for c in planned if c.needs_approval}
        if not asked:
            return batches, None
        records = approvals.new_records(
            turn_id,
            request.agent_id,
            step,
            planned,
            {t.name: source_schema(t) for t in tools if t.name in asked},
            approval_timeout(request, self.rt.settings),
        )
        return approvals.split_for_approval(batches, planned), self.rt.store.approvals.request_writes(turn_id, records)

    def dispatch(self, turn_id: str, step: int, index: int, plan: Plan, agent_id: str | None = None) -> bool:
        """Send batch ``index`` unless it waits for a decision. Returns True when it was sent.

        A gated batch is sent by whoever opens its gate (``ApprovalRecords.try_open``: exactly once).
        ``agent_id`` names the agent in the calls' monitor labels; without it (an approval decision,
        a re-drive) the turn is read, and the batch is sent inside the turn's trace.
        """
        calls, batches = plan
        records = self.rt.store.approvals
        if approvals.gated(batches[index], calls) and not records.try_open(turn_id, step, index, batches, calls):
            return False  # parked: the decision (or the barrier before it) that completes the gate sends it
        within: ContextManager[None] = nullcontext()
        if agent_id is None:
            state = self.rt.store.load(turn_id)
            agent_id = state.agent_id if state else ""
            within = telemetry.under_turn(state.traceparent if state else None)
        with within:
            self.rt.dispatcher.dispatch_batch(
                turn_id,
                step,
                index,
                batches[index],
                queue="tools",
                labels=call_labels(agent_id, turn_id, step, calls),
                computer=computer_calls(agent_id, calls),
                started=plan.started_at_once(),
            )
        return True

    def batch_message(self, turn_id: str, step: int, index: int, plan: Plan, agent_id: str) -> MessageCommands | None:
        """Batch ``index``'s messages, not sent (``Dispatcher.batch_message``), when ``dispatch``
        would send them at once without reading anything: the batch waits for no approval and has
        no call that needs the agent's computer (those are routed by where its home is). None
        otherwise: ``dispatch`` sends the batch."""
        calls, batches = plan
        batch = batches[index]
        ids = set(batch.call_ids)
        if approvals.gated(batch, calls) or any(c.computer for c in calls if c.call_id in ids):
            return None
        return self.rt.dispatcher.batch_message(
            turn_id,
            step,
            batch,
            queue="tools",
            labels=call_labels(agent_id, turn_id, step, calls),
            started=plan.started_at_once(),
        )

    def admit(self, turn_id: str, step: int, call: PlannedCall) -> tuple[PlannedCall | None, CallResult | None]:
        """Before running a call that needs approval: ``(call_to_run, None)`` when approved (with the
        approver's edited params, if any), ``(None, rejection_result)`` when rejected, ``(None, None)``
        when still undecided (a forged or early message: nothing runs). Edited params that fail
        ``approvals.check_params`` run nothing either: their result says so."""
        rec = self.rt.store.approvals.record(turn_id, step, call.call_id)
        if rec is None or rec.status == "pending":
            return None, None
        metrics.approval_decided(rec.status, rec.by, rec.requested_at, rec.decided_at)
        if rec.status == "rejected":
            return None, approvals.rejection_result(rec)
        if rec.params is not None:
            try:  # checked when decided; again here for a record written any other way
                approvals.check_params(rec, rec.params)
            except approvals.ApprovalError as exc:
                return None, approvals.refused_edit_result(rec, str(exc))
            return replace(call, data=rec.params), None
        return call, None

    @staticmethod
    def note_edit(result: CallResult, call: PlannedCall) -> CallResult:
        """Tell the model the approver changed its arguments (its ``function_call`` keeps the originals)."""
        note = f"Note: the approver edited the arguments; the call ran with {orjson.dumps(call.data).decode()}.\n"
        return replace(result, output=note + result.output, details={**result.details, "edited_params": call.data})

    def resume(self, turn_id: str, step: int) -> bool:
        """Open the step's next gated batch if it is ready; True when a batch was sent."""
        plan = self.rt.store.plan(turn_id, step)
        if plan is None:
            return False
        index = self.rt.store.approvals.next_gated(turn_id, step, plan.batches, plan.calls)
        if index is None:
            return False
        return self.dispatch(turn_id, step, index, plan)

    def decide(
        self,
        turn_id: str,
        call_id: str,
        decision: approvals.Decision,
        *,
        by: str,
        reason: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[approvals.ApprovalRecord, bool]:
        """Record a decision (``ApprovalRecords.decide``) and resume the turn when its gate is complete.

        Idempotent: a repeated decision changes nothing, and the gate sends a batch once.
        Raises ``approvals.ApprovalError`` / ``ApprovalConflict``.
        """
        rec, changed = self.rt.store.approvals.decide(turn_id, call_id, decision, by=by, reason=reason, params=params)
        self.resume(turn_id, rec.step)  # also after a repeat: a crash may have come between decide and send
        return rec, changed

    def expire(self, now: float | None = None) -> dict[str, int]:
        """Reject every undecided call past its deadline (``by="deadline"``) and resume those turns.

        Returns ``{turn_id: calls_rejected}``.
        """
        now = self.rt.clock() if now is None else now
        done: dict[str, int] = {}
        records = self.rt.store.approvals
        for turn_id in records.overdue_turns(now):
            done[turn_id] = sum(self._expire_call(rec, now) for rec in records.pending(turn_id=turn_id))
        return done

    def _expire_call(self, rec: approvals.ApprovalRecord, now: float) -> int:
        """Reject one call past its deadline: 1 when rejected here, else 0."""
        if rec.deadline > now:
            return 0
        timeout = round(rec.deadline - rec.requested_at)
        try:
            self.decide(
                rec.turn_id, rec.call_id, "rejected", by="deadline", reason=f"nobody decided within {timeout} s"
            )
        except approvals.ApprovalError as exc:  # decided or ended meanwhile
            log.info("approval deadline of %s/%s: %s", rec.turn_id, rec.call_id, exc)
            return 0
        return 1

    def redrive_parked(self, state: TurnState) -> StepOutcome | None:
        """The watchdog's view of a turn awaiting approval: re-send a gate that is ready but was never
        sent, leave a batch that waits for a person alone (no re-drive counted), or None to re-drive
        as usual (work that was dispatched and lost)."""
        store = self.rt.store
        plan = store.plan(state.turn_id, state.step)
        if plan is None:
            return None
        results = store.results(state.turn_id, state.step)
        for i, batch in enumerate(plan.batches):
            if all(c in results for c in batch.call_ids):
                continue
            if not approvals.gated(batch, plan.calls) or store.approvals.is_open(state.turn_id, state.step, i):
                return None  # dispatched work: re-drive it as usual
            if self.dispatch(state.turn_id, state.step, i, plan):
                return StepOutcome("redriven", f"gate {i}")
            recs = store.approvals.pending(turn_id=state.turn_id)
            deadline = min((r.deadline for r in recs), default=0.0)
            store.push_deadline(state.turn_id, max(0.0, deadline - self.rt.clock()) + 5)
            return StepOutcome("parked", f"batch {i} awaits approval")
        return None
