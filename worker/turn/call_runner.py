"""The call runner: one tool call of a turn, from its message to its stored result.

``CallRunner.run`` reads the call (state, plan, whether it has a result, cancel flag) and, when it
can run at once (no approval, no computer), claims it with its ``call_started`` event in the same
round trip (``Claims.begin_call``); drops a stale or duplicate message; admits a call that needs
approval only once decided (``worker.turn.gate``) and a call that needs the agent's computer only
on the node holding it, claiming those then (one round trip); runs its tool with the validated
params; and stores the result with ``call_completed`` and the batch's barrier (one round trip).
The caller that completes the batch closes it (``worker.turn.completion``): a step of one call is
closed by that same round trip (``BatchCompletion.closing_writes``), which also queues the next
step's message, so such a step costs the tools worker two round trips in all.

At most once for destructive tools: a call whose claim is held by a dead worker is run again only
when its tool is not destructive; a destructive one gets an "outcome unknown" result instead
(docs/architecture.md, "Claims and fencing"). Every ending of a call (ran, failed, interrupted,
rejected, outcome unknown) is a ``call_completed`` event.

Placement (``docs/placement.md``): a call that needs the agent's computer is first admitted by the
node (``Computers.admit``): ``forwarded`` to the node holding the home, refused with an error
output when no node can hold it, or run holding the home, the model told first when the home was
just moved here or reset.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from worker.model.items import cap_output, output_text, storable
from worker.tooling.arguments import validate_params
from worker.tooling.contract import ToolContext, ToolResult, TurnAborted, WorkerTool
from worker.tooling.oversized import kept_json
from worker.turn import metrics, telemetry
from worker.turn.barrier import Closed
from worker.turn.completion import BatchCompletion
from worker.turn.dispatch import Plan, PlannedCall
from worker.turn.durability import NotDurable
from worker.turn.events import CallCompleted, CallStarted
from worker.turn.gate import ApprovalGate
from worker.turn.interfaces import Computers, HomeAdmission
from worker.turn.liveness import owner
from worker.turn.outage import Unsaved, until_redis_answers
from worker.turn.outcome import StepOutcome
from worker.turn.request import TurnRequest
from worker.turn.runtime import TurnRuntime
from worker.turn.state import AdvanceView, CallResult, CallView, TurnState
from worker.turn.toolbox import Toolbox

log = logging.getLogger("agent.loop")

# Tool results this process paid for but could not store yet (a Redis outage).
_UNSAVED_RESULTS = Unsaved()
# Calls whose tool this process started: a claim of ours on one of them is not "an earlier attempt
# that never ran" (a result lost with a failed-over primary leaves our claim behind).
_STARTED = Unsaved(limit=100_000)
# How often a destructive call whose claim reached no replica in time is sent again (its task
# retried with these countdowns, seconds) before it is reported not run (docs/failover.md).
DEFERRALS = (1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0)


class CallRunner:
    """Runs tool calls (see the module docstring)."""

    def __init__(
        self,
        runtime: TurnRuntime,
        toolbox: Toolbox,
        gate: ApprovalGate,
        completion: BatchCompletion,
        computers: Computers | None = None,
    ):
        self.rt = runtime
        self.toolbox = toolbox
        self.gate = gate
        self.completion = completion
        self.computers = computers

    def run(self, turn_id: str, step: int, call_id: str, deferrals: int = 0, started: str | None = None) -> StepOutcome:
        """Run one planned call, store its result, and close the batch if it is the batch's last.
        ``deferrals``: how often this call was deferred already (its destructive claim reached no
        replica in time): ``deferred`` asks the caller to send it again in ``DEFERRALS[deferrals]``
        seconds; after the last, the call is reported not run. ``started``: what the call's message
        carries about claiming it with its first read (``TurnStore.call_view``)."""
        view = self.rt.store.call_view(turn_id, step, call_id, owner(), self._lease(), started)
        state, plan = view.state, view.plan
        if state is None or state.status.terminal or state.step != step or state.phase != "tools":
            return StepOutcome("dropped", "stale call")
        if plan is None:
            return StepOutcome("dropped", "no plan")
        call, batch_index = plan.call(call_id), plan.batch_of(call_id)
        if call is None or batch_index is None:
            return StepOutcome("dropped", "unknown call")
        request = state.turn_request()
        closing = self._closing(view, plan, call, batch_index, request, deferrals)
        if isinstance(closing, StepOutcome):
            return closing
        if closing is None:
            return StepOutcome("ran")
        ended = None
        if isinstance(closing, Closed):  # the result's round trip closed the step
            self.completion.next_step(state, step, request)
        else:
            ended = self.completion.close(turn_id, step, request, batch_index, view=closing)
        return StepOutcome("advanced", f"batch {batch_index} done", ended=ended)

    def _closing(
        self, view: CallView, plan: Plan, call: PlannedCall, batch_index: int, request: TurnRequest, deferrals: int
    ) -> AdvanceView | Closed | StepOutcome | None:
        """Record the call's result (running it if it must run) and pass the barrier: what closing
        the batch reads when this call completed it (``Closed`` when its round trip also closed a
        one-call step), None when it did not, or the outcome of a call that must not run here."""
        assert view.state is not None
        state, barrier = view.state, self.rt.store.barrier
        turn_id, step = state.turn_id, state.step
        batch_ids = plan.batches[batch_index].call_ids
        if view.has_result:  # a redelivery after the result was stored: only the barrier
            return barrier.batch_done(turn_id, step, batch_index, batch_ids)
        edited = False
        if call.needs_approval:
            approved, rejected = self.gate.admit(turn_id, step, call)
            if rejected is not None:
                metrics.tool_call_finished(call.name, True, rejected.details)  # rejected or expired
                event = CallCompleted.of(step, call, rejected).fields()
                return barrier.record_and_check(turn_id, step, call.call_id, rejected, batch_index, batch_ids, event)[1]
            if approved is None:
                return StepOutcome("dropped", "call awaits approval")
            edited, call = approved.data != call.data, approved
        key = (turn_id, step, call.call_id)
        kept: tuple[CallResult, dict[str, Any]] | None = _UNSAVED_RESULTS.get(key)
        if kept is None:
            admission = self._admit(call, request.agent_id)
            if admission.forward_to is not None:  # another node holds the agent's home
                return StepOutcome("forwarded", admission.forward_to)
            try:
                if admission.error is not None:
                    result: CallResult | None = CallResult.error(admission.error, "no_computer")
                else:
                    result = self._execute_once(call, state, request, batch_index, view)
            except NotDurable as exc:  # the tool did not run: free the call for a later attempt
                self.rt.store.claims.release_claim(turn_id, step, call.call_id, owner())
                if deferrals < len(DEFERRALS):
                    log.warning("call %s of turn %s deferred: %s", call.call_id, turn_id, exc)
                    return StepOutcome("deferred", str(exc))
                result = _unfenced(call)
            finally:
                admission.release()
            if result is None:
                return StepOutcome("dropped", "call is running elsewhere")
            if admission.notice:
                result = _noted(result, admission.notice)
            if edited:
                result = self.gate.note_edit(result, call)
            kept = (result, CallCompleted.of(step, call, result).fields())
            _UNSAVED_RESULTS.put(key, kept)
        result, event = kept
        writes = self.completion.closing_writes(state, plan, result, view.cancelled)
        _, closing = until_redis_answers(
            lambda: barrier.record_and_check(
                turn_id, step, call.call_id, result, batch_index, batch_ids, event, closing=writes
            ),
            what=f"saving the result of call {call.call_id} of turn {turn_id}",
            timeout=self.rt.settings.redis_outage_timeout,
        )
        _UNSAVED_RESULTS.drop(key)
        if isinstance(closing, Closed) and writes is not None and writes.sends_message:
            return StepOutcome("advanced", f"batch {batch_index} done")  # the script sent step n + 1 too
        return closing

    def _admit(self, call: PlannedCall, agent_id: str) -> HomeAdmission:
        """The placement check of a call that needs the agent's computer (``Computers.admit``);
        any other call, or a turn loop without placement, is admitted as is."""
        if not call.computer or self.computers is None:
            return HomeAdmission()
        return self.computers.admit(agent_id, call.destructive)

    def _lease(self) -> float:
        return self.rt.settings.tool_time_limit + 30

    def _execute_once(
        self, call: PlannedCall, state: TurnState, request: TurnRequest, batch_index: int, view: CallView
    ) -> CallResult | None:
        """Claim the call (unless its view did) and run it; its result, or None when another live
        worker holds it."""
        turn_id, step, cancelled = state.turn_id, state.step, view.cancelled
        lease = self._lease()
        claims = self.rt.store.claims
        fenced = call.destructive  # its claim must reach a replica before it runs (worker.turn.durability)
        if view.claim.tried:
            won, claim = view.claim.won, view.claim.existing
            if won and fenced and claims.durability.enabled:  # claimed at once by a plan made unfenced
                claims.take_over_claim(turn_id, step, call.call_id, owner(), lease, durable=True)
        else:
            started = CallStarted(step, call.call_id, call.name, call.activity).fields()
            won, claim = claims.claim(
                turn_id, step, call.call_id, owner(), lease, started_event=started, durable=fenced
            )
        if not won:
            run_here, held = self._held_elsewhere(call, claim or {}, (turn_id, step, call.call_id))
            if not run_here:
                return held
            claims.take_over_claim(turn_id, step, call.call_id, owner(), lease, durable=fenced)
        # A terminating result earlier in this step stops later batches (docs/architecture.md, "Batches").
        if cancelled or (state.terminate and batch_index > 0):
            reason = "the turn was cancelled" if cancelled else "the turn was terminated"
            return CallResult.error(f"Interrupted: the call did not run because {reason}.", "interrupted")
        record = self.rt.settings.otel_record_content
        _STARTED.put((turn_id, step, call.call_id), True)
        started_at = time.perf_counter()
        with telemetry.tool_call_span(call, turn_id, request.agent_id, step, batch_index, record) as span:
            try:
                result = CallResult.from_json(storable(self.execute(call, state, request).to_json()))
            except Exception as exc:  # whatever breaks around the tool, the call still gets an output
                log.exception("call %s of turn %s failed outside the tool", call.call_id, turn_id)
                result = _failure(call, exc)
            telemetry.tool_outcome(span, result, record)
        metrics.TOOL_CALL_SECONDS.labels(call.name).observe(time.perf_counter() - started_at)
        metrics.tool_call_finished(call.name, result.is_error, result.details)
        return result

    def _held_elsewhere(
        self, call: PlannedCall, claim: dict[str, Any], key: tuple[str, int, str]
    ) -> tuple[bool, CallResult | None]:
        """A call claimed by someone else: ``(True, None)`` to take the claim over and run it;
        ``(False, None)`` while its holder is alive and its lease runs (do not run it); ``(False,
        "outcome unknown" result)`` for a destructive call whose holder is gone, or that this very
        thread ran already (its result lost with a failed-over primary): never run a destructive
        tool twice for one call."""
        holder = claim.get("owner", "")
        ours = holder == owner()
        if ours and _STARTED.get(key) is None:  # our own earlier attempt (a Redis outage): it never ran the tool
            return True, None
        if not ours and claim.get("lease_until", 0) > time.time() and not self.rt.liveness.owner_is_dead(holder):
            return False, None
        if call.destructive:
            return False, CallResult.error(
                f"Error: the outcome of this {call.name} call is unknown: the worker running it "
                "stopped before reporting. Check the current state before retrying.",
                "outcome_unknown",
            )
        return True, None

    def execute(self, call: PlannedCall, state: TurnState, request: TurnRequest) -> CallResult:
        """Run the tool's ``execute`` with the call's validated params; a tool's failure (an
        exception, an abort) is a result the model reads, never a crashed turn."""
        turn_id = state.turn_id
        abort = self.toolbox.abort_signal(turn_id, probed=True)  # the call's view read the flag unset
        ctx = self.toolbox.context(state, request, abort)
        tool = next((t for t in self.toolbox.tools(ctx, request) if t.name == call.name), None)
        started = time.perf_counter()
        if tool is None:
            return CallResult.error(f"Error: tool {call.name!r} is not available in this turn anymore.", "unknown_tool")
        params, errors = validate_params(tool, call.data or {})
        if errors:  # cannot happen for data that validated at plan time unless the tool changed
            return CallResult.error("Error: " + "; ".join(f"{e.loc}: {e.msg}" for e in errors), "invalid_arguments")
        tctx = ToolContext(
            turn_id=turn_id,
            call_id=call.call_id,
            home=ctx.home,
            abort=abort,
            agent_id=request.agent_id,
            services=ctx.services,
            metadata=ctx.metadata,
        )
        result = _run_tool(tool, params, tctx, call)
        text, cut = cap_output(output_text(result.content), self.rt.settings.max_output_chars)
        details = dict(kept_json(result.details))  # never stored whole over its cap
        if cut:
            details["output_cut_chars"] = cut
        if call.repairs:
            details["repairs"] = call.repairs
        return CallResult(
            output=text,
            details=details,
            is_error=result.is_error,
            terminate=result.terminate,
            presentation_events=_kept_events(result),
            activity=tool.completed_activity(params, result),
            ms=round((time.perf_counter() - started) * 1000, 1),
        )


def _kept_events(result: ToolResult) -> list[dict[str, Any]]:
    """The result's presentation events as stored: one placeholder event when they are over
    ``MAX_RESULT_JSON_BYTES`` as JSON (``worker.tooling.oversized``)."""
    events = [{"kind": e.kind, "data": e.data} for e in result.presentation_events]
    kept = kept_json(events)
    return events if kept is events else [{"kind": "not_kept", "data": kept["not_kept"]}]


def _run_tool(tool: WorkerTool[Any], params: Any, tctx: ToolContext, call: PlannedCall) -> ToolResult:
    """The tool's own ``execute`` (a coroutine function runs in its own event loop); an abort or an
    exception becomes an error ``ToolResult``."""
    try:
        result: Any
        if tool.is_async:
            result = asyncio.run(tool.execute(params, tctx))  # type: ignore[arg-type]
        else:
            result = tool.execute(params, tctx)
        return result if isinstance(result, ToolResult) else ToolResult(content=result)
    except TurnAborted:
        return ToolResult(
            content="Interrupted: the turn was cancelled while this call ran.",
            is_error=True,
            details={"error": "interrupted"},
        )
    except Exception as exc:  # a tool's failure is an output the model can read, never a crashed turn
        log.exception("tool %s failed in turn %s", call.name, tctx.turn_id)
        return ToolResult(
            content=f"Error: {call.name} failed: {exc.__class__.__name__}: {exc}",
            is_error=True,
            details={"error": "exception", "type": exc.__class__.__name__},
        )


def _unfenced(call: PlannedCall) -> CallResult:
    """The result of a destructive call never run: its claim reached no Redis replica in time,
    after every deferral (docs/failover.md)."""
    return CallResult.error(
        f"Error: {call.name} did not run: its claim could not be made safe against a Redis failover (no "
        "replica acknowledged it, also after retries for about a minute). Nothing was done; try again later.",
        "unfenced",
    )


def _noted(result: CallResult, notice: str) -> CallResult:
    """``result`` with what the model must know about its computer (moved, reset) before its output."""
    details = {**result.details, "placement": notice}
    return replace(result, output=f"{notice}\n\n{result.output}", details=details)


def _failure(call: PlannedCall, exc: Exception) -> CallResult:
    return CallResult.error(
        f"Error: {call.name} failed: {exc.__class__.__name__}: {exc}", "exception", type=exc.__class__.__name__
    )
