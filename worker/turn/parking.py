"""How the engine parks a turn on approvals and resumes it (the records live in ``worker.turn.approvals``).

Hooks called by ``TurnEngine``: ``approval_rule`` and ``plan_approvals`` (which calls of a
step wait, recorded with its plan), ``dispatch_batch`` (every batch goes through it: a gated batch
is sent only through its set-once gate), ``gate_call`` (a tool-call message for a call that
needs approval runs only once approved; a rejection becomes its output), ``decide`` (record a
decision, then open the next gate: that dispatch is the turn's resumption, no task ever waited),
``expire`` (the watchdog rejects what nobody decided before the deadline) and ``redrive_parked``
(the watchdog never re-drives work that waits for a person).
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable

import orjson

from worker.settings import Settings
from worker.tooling.contract import WorkerTool
from worker.tooling.schemas import source_schema
from worker.turn import approvals, telemetry
from worker.turn.dispatch import Batch, PlannedCall
from worker.turn.interfaces import StepOutcome, call_labels, computer_calls
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.state import TurnState

if TYPE_CHECKING:
    from worker.turn.engine import TurnEngine

log = logging.getLogger("agent.approvals")


def approval_rule(ctx: Any, request: TurnRequest, settings: Settings) -> Callable[[WorkerTool, Any], bool] | None:
    """The ``approval`` argument of ``plan_calls`` for this turn (None when approvals are off)."""
    mode = approvals.approval_mode(request, settings)
    if mode == "off":
        return None
    return lambda tool, params: approvals.call_needs_approval(tool, params, ctx, mode)


def plan_approvals(
    engine: "TurnEngine",
    turn_id: str,
    step: int,
    request: TurnRequest,
    planned: list[PlannedCall],
    tools: list[WorkerTool],
    batches: list[Batch],
) -> tuple[list[Batch], Callable[[Any], None] | None]:
    """The step's batches cut for approvals (``approvals.split_for_approval``), and the writes that
    record its approval requests in ``begin_tools``'s transaction (None when no call needs one)."""
    asked = {c.name for c in planned if c.needs_approval}
    if not asked:
        return batches, None
    records = approvals.new_records(
        turn_id,
        request.agent_id,
        step,
        planned,
        {t.name: source_schema(t) for t in tools if t.name in asked},
        approvals.approval_timeout(request, engine.settings),
    )
    return approvals.split_for_approval(batches, planned), lambda pipe: approvals.write_requests(pipe, turn_id, records)


def dispatch_batch(
    engine: "TurnEngine",
    turn_id: str,
    step: int,
    index: int,
    batches: list[Batch],
    calls: list[PlannedCall],
    agent_id: str | None = None,
) -> bool:
    """Send batch ``index`` unless it waits for a decision. Returns True when it was sent.

    A gated batch is sent by whoever opens its gate (``approvals.try_open``: exactly once).
    ``agent_id`` names the agent in the calls' monitor labels; without it (an approval decision,
    a re-drive) the turn is read, and the batch is sent inside the turn's trace.
    """
    batch = batches[index]
    if approvals.gated(batch, calls) and not approvals.try_open(engine.store.r, turn_id, step, index, batches, calls):
        return False  # parked: the decision (or the barrier before it) that completes the gate sends it
    within: Any = nullcontext()
    if agent_id is None:
        state = engine.store.load(turn_id)
        agent_id = state.agent_id if state else ""
        within = telemetry.under_turn(state.traceparent if state else None)
    with within:
        engine.dispatcher.dispatch_batch(
            turn_id,
            step,
            index,
            batch,
            queue="tools",
            labels=call_labels(agent_id, turn_id, step, calls),
            computer=computer_calls(agent_id, calls),
        )
    return True


def gate_call(
    engine: "TurnEngine", turn_id: str, step: int, call: PlannedCall
) -> tuple[PlannedCall | None, dict[str, Any] | None]:
    """Before running a call that needs approval: ``(call_to_run, None)`` when approved (with the
    approver's edited params, if any), ``(None, rejection_result)`` when rejected, ``(None, None)``
    when still undecided (a forged or early message: nothing runs)."""
    rec = approvals.record(engine.store.r, turn_id, step, call.call_id)
    if rec is None or rec.status == "pending":
        return None, None
    if rec.status == "rejected":
        return None, approvals.rejection_result(rec)
    if rec.params is not None:
        return replace(call, data=rec.params), None
    return call, None


def note_edit(result: dict[str, Any], call: PlannedCall) -> dict[str, Any]:
    """Tell the model the approver changed its arguments (its ``function_call`` keeps the originals)."""
    result = dict(result)
    result["output"] = (
        f"Note: the approver edited the arguments; the call ran with {orjson.dumps(call.data).decode()}.\n"
        + result["output"]
    )
    result["details"] = {**(result.get("details") or {}), "edited_params": call.data}
    return result


def resume(engine: "TurnEngine", turn_id: str, step: int) -> bool:
    """Open the step's next gated batch if it is ready; True when a batch was sent."""
    plan = engine.store.plan(turn_id, step)
    if plan is None:
        return False
    calls, batches = plan
    index = approvals.next_gated(engine.store.r, turn_id, step, batches, calls)
    if index is None:
        return False
    return dispatch_batch(engine, turn_id, step, index, batches, calls)


def decide(
    engine: "TurnEngine",
    turn_id: str,
    call_id: str,
    decision: approvals.Decision,
    *,
    by: str,
    reason: str | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[approvals.ApprovalRecord, bool]:
    """Record a decision (``approvals.decide``) and resume the turn when its gate is complete.

    Idempotent: a repeated decision changes nothing, and the gate sends a batch once.
    Raises ``approvals.ApprovalError`` / ``ApprovalConflict``.
    """
    rec, changed = approvals.decide(
        engine.store.r,
        turn_id,
        call_id,
        decision,
        by=by,
        reason=reason,
        params=params,
        progress_timeout=engine.store.progress_timeout,
    )
    resume(engine, turn_id, rec.step)  # also after a repeat: a crash may have come between decide and send
    return rec, changed


def expire(engine: "TurnEngine", now: float | None = None) -> dict[str, int]:
    """Reject every undecided call past its deadline (``by="deadline"``) and resume those turns.

    Returns ``{turn_id: calls_rejected}``.
    """
    now = time.time() if now is None else now
    done: dict[str, int] = {}
    for turn_id in approvals.overdue_turns(engine.store.r, now):
        n = 0
        for rec in approvals.pending(engine.store.r, turn_id=turn_id):
            if rec.deadline > now:
                continue
            timeout = round(rec.deadline - rec.requested_at)
            try:
                decide(
                    engine, turn_id, rec.call_id, "rejected", by="deadline", reason=f"nobody decided within {timeout} s"
                )
                n += 1
            except approvals.ApprovalError as exc:  # decided or ended meanwhile
                log.info("approval deadline of %s/%s: %s", turn_id, rec.call_id, exc)
        done[turn_id] = n
    return done


def redrive_parked(engine: "TurnEngine", state: TurnState) -> StepOutcome | None:
    """The watchdog's view of a turn awaiting approval: re-send a gate that is ready but was never
    sent, leave a batch that waits for a person alone (no re-drive counted), or None to re-drive
    as usual (work that was dispatched and lost)."""
    plan = engine.store.plan(state.turn_id, state.step)
    if plan is None:
        return None
    calls, batches = plan
    results = engine.store.results(state.turn_id, state.step)
    for i, batch in enumerate(batches):
        if all(c in results for c in batch.call_ids):
            continue
        if not approvals.gated(batch, calls) or engine.store.r.exists(approvals.gate_key(state.turn_id, state.step, i)):
            return None  # dispatched work: re-drive it as usual
        if dispatch_batch(engine, state.turn_id, state.step, i, batches, calls):
            return StepOutcome("redriven", f"gate {i}")
        recs = approvals.pending(engine.store.r, turn_id=state.turn_id)
        deadline = min((r.deadline for r in recs), default=0.0)
        engine.store.push_deadline(state.turn_id, max(0.0, deadline - time.time()) + 5)
        return StepOutcome("parked", f"batch {i} awaits approval")
    return None


def cancel_parked(engine: "TurnEngine", state: TurnState) -> None:
    """Cancel a turn awaiting approval at once: no task runs that would see the cancel flag."""
    if state.status == TurnStatus.awaiting_approval:
        engine.fail_turn(state.turn_id, TurnStatus.cancelled, "cancelled by the control plane while awaiting approval")
        engine.store.r.zrem(approvals.PENDING_KEY, state.turn_id)
