"""A turn's tool calls: ``run_call`` claims one planned call, runs its tool with the validated
params, stores the result keyed by ``call_id`` (first write wins) and passes the batch's
barrier; every ending (ran, failed, interrupted, outcome unknown) is a ``call_completed`` event.

A mixin of ``TurnEngine`` (``worker.turn.engine``), which gives it the store, the settings, the
liveness records, the placement of homes (``computers``), the turn's context and tools, and
``_advance`` (what follows the barrier). A call that needs the agent's computer runs only on the
node holding its home: elsewhere it is ``forwarded`` there (``docs/placement.md``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from worker.model.items import cap_output, output_text, storable
from worker.tooling.arguments import validate_params
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, TurnAborted
from worker.turn import metrics, parking, telemetry
from worker.turn.dispatch import PlannedCall
from worker.turn.interfaces import HomeAdmission, StepOutcome
from worker.turn.liveness import owner
from worker.turn.outage import Unsaved, until_redis_answers
from worker.turn.request import TurnRequest
from worker.turn.store import TurnState

log = logging.getLogger("agent.loop")

# Tool results this process paid for but could not store yet (a Redis outage).
_UNSAVED_RESULTS = Unsaved()


class ToolCalls:
    """``TurnEngine``'s tool-call half (see the module docstring)."""

    def run_call(self, turn_id: str, step: int, call_id: str) -> StepOutcome:
        """Run one planned call, store its result, and pass the barrier if it is the batch's last.

        Three Redis round trips besides the tool's own: read (state, plan, result, cancel flag),
        claim (+ ``call_started``), record (+ ``call_completed`` + barrier, whose winner also gets
        what closing the batch reads).
        """
        view = self.store.call_view(turn_id, step, call_id)
        state = view.state
        if state is None or state.status.terminal or state.step != step or state.phase != "tools":
            return StepOutcome("dropped", "stale call")
        if view.plan is None:
            return StepOutcome("dropped", "no plan")
        calls, batches = view.plan
        call = next((c for c in calls if c.call_id == call_id), None)
        if call is None:
            return StepOutcome("dropped", "unknown call")
        batch_index = next(i for i, b in enumerate(batches) if call_id in b.call_ids)
        batch_ids = batches[batch_index].call_ids
        request = TurnRequest.model_validate(state.request)
        rejected, edited = None, False
        if call.needs_approval and not view.has_result:
            approved, rejected = parking.gate_call(self, turn_id, step, call)
            if approved is None and rejected is None:
                return StepOutcome("dropped", "call awaits approval")
            edited = approved is not None and approved.data != call.data
            call = approved or call
        if view.has_result:
            closing = self.store.batch_done(turn_id, step, batch_index, batch_ids)
        elif rejected is not None:
            event = {"step": step, "call_id": call_id, "name": call.name, "activity": rejected["activity"]}
            event.update(is_error=True, ms=0.0, terminate=False, preview=rejected["output"][:300])
            _, closing = self.store.record_and_check(turn_id, step, call_id, rejected, batch_index, batch_ids, event)
        else:
            key = (turn_id, step, call_id)
            kept = _UNSAVED_RESULTS.get(key)
            if kept is not None:
                result, event = kept
            else:
                admission = self._admit(call, request.agent_id)
                if admission.forward_to is not None:  # another node holds the agent's home
                    return StepOutcome("forwarded", admission.forward_to)
                try:
                    if admission.error is not None:
                        result = {"output": admission.error, "is_error": True, "details": {"error": "no_computer"}}
                        event = self._completed_event(step, call, result)
                    else:
                        result, event = self._execute_once(
                            turn_id, step, call, state, request, batch_index, view.cancelled
                        )
                finally:
                    admission.release()
                if result is None:
                    return StepOutcome("dropped", "call is running elsewhere")
                result = admission.noted(result)
                if edited:
                    result = parking.note_edit(result, call)
                _UNSAVED_RESULTS.put(key, (result, event))
            _, closing = until_redis_answers(
                lambda: self.store.record_and_check(turn_id, step, call_id, result, batch_index, batch_ids, event),
                what=f"saving the result of call {call_id} of turn {turn_id}",
                timeout=self.settings.redis_outage_timeout,
            )
            _UNSAVED_RESULTS.drop(key)
        if closing is not None:  # this call completed the batch: the barrier returned what closing it reads
            self._advance(turn_id, step, request, batches, batch_index, view=closing)
            return StepOutcome("advanced", f"batch {batch_index} done")
        return StepOutcome("ran")

    def _admit(self, call: PlannedCall, agent_id: str) -> HomeAdmission:
        """The placement check of a call that needs the agent's computer (``Computers.admit``);
        any other call, or an engine without placement, is admitted as is."""
        if not call.computer or self.computers is None:
            return HomeAdmission()
        return self.computers.admit(agent_id, call.destructive)

    def _execute_once(
        self,
        turn_id: str,
        step: int,
        call: PlannedCall,
        state: TurnState,
        request: TurnRequest,
        batch_index: int,
        cancelled: bool,
    ) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Claim and run the call. Returns ``(result, completed_event)``; ``(None, None)`` if another worker holds it."""
        lease = self.settings.tool_time_limit + 30
        started = {"step": step, "call_id": call.call_id, "name": call.name, "activity": call.activity}
        won, claim = self.store.claim(turn_id, step, call.call_id, owner(), lease, started_event=started)
        if not won:
            holder = (claim or {}).get("owner", "")
            mine = holder == owner()  # our own earlier attempt (a Redis outage): it never ran the tool
            if (
                not mine
                and (claim or {}).get("lease_until", 0) > time.time()
                and not self.liveness.owner_is_dead(holder)
            ):
                return None, None
            if call.destructive and not mine:
                # Never run a destructive tool twice for one call: report it instead.
                result = {
                    "output": (
                        f"Error: the outcome of this {call.name} call is unknown: the worker running it "
                        "stopped before reporting. Check the current state before retrying."
                    ),
                    "is_error": True,
                    "details": {"error": "outcome_unknown"},
                }
                return result, self._completed_event(step, call, result)
            self.store.take_over_claim(turn_id, step, call.call_id, owner(), lease)
        # A terminating result earlier in this step stops later batches (DESIGN-NOTES section 2).
        if cancelled or (state.terminate and batch_index > 0):
            reason = "the turn was cancelled" if cancelled else "the turn was terminated"
            result = {
                "output": f"Interrupted: the call did not run because {reason}.",
                "is_error": True,
                "details": {"error": "interrupted"},
            }
            return result, self._completed_event(step, call, result)
        record = self.settings.otel_record_content
        started_at = time.perf_counter()
        with telemetry.tool_call_span(call, turn_id, request.agent_id, step, batch_index, record) as span:
            try:
                result = storable(self.execute_call(turn_id, call, state, request))
            except Exception as exc:  # whatever breaks around the tool, the call still gets an output
                log.exception("call %s of turn %s failed outside the tool", call.call_id, turn_id)
                result = {
                    "output": f"Error: {call.name} failed: {exc.__class__.__name__}: {exc}",
                    "is_error": True,
                    "details": {"error": "exception", "type": exc.__class__.__name__},
                }
            telemetry.tool_outcome(span, result, record)
        metrics.TOOL_CALL_SECONDS.labels(call.name).observe(time.perf_counter() - started_at)
        return result, self._completed_event(step, call, result)

    @staticmethod
    def _completed_event(step: int, call: PlannedCall, result: dict[str, Any]) -> dict[str, Any]:
        """The ``call_completed`` event of every ending: ran, failed, interrupted or outcome unknown."""
        return {
            "step": step,
            "call_id": call.call_id,
            "name": call.name,
            "activity": result.get("activity", call.activity),
            "is_error": result.get("is_error", False),
            "error": result.get("details", {}).get("error"),
            "ms": result.get("ms"),
            "terminate": result.get("terminate", False),
            "preview": result["output"][:300],
        }

    def execute_call(self, turn_id: str, call: PlannedCall, state: TurnState, request: TurnRequest) -> dict[str, Any]:
        """Run the tool's ``execute``; any exception becomes an error output. Returns the result record."""
        abort = AbortSignal(probe=lambda: self._cancel_requested(turn_id))
        ctx = self.context(state, request, abort)
        tools = {t.name: t for t in self.tools_for(ctx, request)}
        tool = tools.get(call.name)
        started = time.perf_counter()
        if tool is None:
            return {
                "output": f"Error: tool {call.name!r} is not available in this turn anymore.",
                "is_error": True,
                "details": {"error": "unknown_tool"},
            }
        params, errors = validate_params(tool, call.data or {})
        if errors:  # cannot happen for data that validated at plan time unless the tool changed
            return {
                "output": "Error: " + "; ".join(f"{e.loc}: {e.msg}" for e in errors),
                "is_error": True,
                "details": {"error": "invalid_arguments"},
            }
        tctx = ToolContext(
            turn_id=turn_id,
            call_id=call.call_id,
            home=ctx.home,
            abort=abort,
            agent_id=request.agent_id,
            services={**ctx.services, "redis": self.store.r, "settings": self.settings, "turn_context": ctx},
        )
        try:
            if tool.is_async:
                result = asyncio.run(tool.execute(params, tctx))
            else:
                result = tool.execute(params, tctx)
            if not isinstance(result, ToolResult):
                result = ToolResult(content=result)
        except TurnAborted:
            result = ToolResult(
                content="Interrupted: the turn was cancelled while this call ran.",
                is_error=True,
                details={"error": "interrupted"},
            )
        except Exception as exc:  # a tool's failure is an output the model can read, never a crashed turn
            log.exception("tool %s failed in turn %s", call.name, turn_id)
            result = ToolResult(
                content=f"Error: {call.name} failed: {exc.__class__.__name__}: {exc}",
                is_error=True,
                details={"error": "exception", "type": exc.__class__.__name__},
            )
        text, cut = cap_output(output_text(result.content), self.settings.max_output_chars)
        details = dict(result.details)
        if cut:
            details["output_cut_chars"] = cut
        if call.repairs:
            details["repairs"] = call.repairs
        return {
            "output": text,
            "details": details,
            "is_error": result.is_error,
            "terminate": result.terminate,
            "presentation_events": [{"kind": e.kind, "data": e.data} for e in result.presentation_events],
            "activity": tool.completed_activity(params, result),
            "ms": round((time.perf_counter() - started) * 1000, 1),
        }
