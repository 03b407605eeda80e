"""A model step, from its stored reply on: the turn's end, or its planned tool calls.

``ReplyHandler.handle`` takes a step that ``worker.turn.model_step`` prepared and its stored reply
(paid for now or memoized earlier) and:

- counts the reply's token usage once per step (the record is written with the reply when this
  step paid for it; a memoized reply is recorded here, first write wins);
- ends the turn cancelled when the cancel flag was set while the model answered;
- without function calls: completes the turn with the answer (``incomplete`` when it stopped at
  the output-token limit), or, for a turn that must end through a finish tool, adds one repair
  instruction and runs the next step (a second miss fails the turn);
- with function calls: validates each (``worker.turn.planning``), asks the approval gate which
  wait for a person, records the reply, the plan and a ``call_planned`` event per call in one
  guarded transition, and sends the first batch (or closes the step at once when nothing runs).
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping

from worker.model.interface import ModelReply
from worker.model.items import cut_replayed_arguments, normalize_reply_calls, user_message
from worker.model.text_calls import calls_from_text
from worker.tooling.schemas import source_schema
from worker.turn import metrics, telemetry
from worker.turn.approval_policy import approval_rule
from worker.turn.completion import BatchCompletion
from worker.turn.dispatch import Plan
from worker.turn.ending import CANCELLED, TurnEnd
from worker.turn.events import CallPlanned, TurnFinished
from worker.turn.gate import ApprovalGate
from worker.turn.interfaces import step_label
from worker.turn.outcome import Action, StepOutcome
from worker.turn.planning import plan_calls
from worker.turn.prepared import EndPlan, PreparedStep, StoredReply, ToolsPlan
from worker.turn.request import TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import StaleStep
from worker.turn.usage import UsageLedger, normalize_usage

Items = list[dict[str, Any]]


class ReplyHandler:
    """Handles stored replies of model steps (see the module docstring)."""

    def __init__(self, runtime: TurnRuntime, gate: ApprovalGate, completion: BatchCompletion, end: TurnEnd):
        self.rt = runtime
        self.gate = gate
        self.completion = completion
        self.end = end

    def handle(self, prepared: PreparedStep, stored: StoredReply) -> StepOutcome:
        """The step's outcome, from its stored reply (see the module docstring)."""
        reply = ModelReply.from_json(stored.reply)
        totals = self._usage(prepared, reply, stored.recorded)
        if stored.ended is not None:  # the turn's end was written with the reply
            return self._ended(prepared, stored.ended, stored.hooks)
        if stored.cancelled:  # cancelled while the model was answering
            return StepOutcome("cancelled", ended=self.end.fail(prepared.turn_id, TurnStatus.cancelled, CANCELLED))
        if stored.began is not None:  # its plan was recorded with the reply
            return self._dispatch(prepared, stored.began)
        items, calls = self._calls(prepared, reply)
        if calls:
            return self._plan(prepared, reply, items, calls)
        if prepared.request.finish_tool:
            return self._prose_without_finish(prepared, items)
        return self._answer(prepared, reply, items, totals)

    def _usage(
        self, prepared: PreparedStep, reply: ModelReply, recorded: tuple[bool, dict[str, int]] | None
    ) -> dict[str, int]:
        """Record the step's usage once (also when the reply came from the memo: a crash after the
        call) and count its tokens when this is the first record; returns the turn's totals."""
        usage = normalize_usage(reply.usage)
        if recorded is None:  # recorded with the reply when this step paid for it
            recorded = self.rt.usage.record_and_total(prepared.turn_id, prepared.step, usage, prepared.model)
        stored, totals = recorded
        if stored:
            metrics.tokens_used(prepared.model, usage)
        return totals

    def _answer(self, prepared: PreparedStep, reply: ModelReply, items: Items, totals: dict[str, int]) -> StepOutcome:
        """A reply without calls completes the turn; one cut at the output-token limit is not a
        completed turn: it ends ``incomplete`` and says so."""
        action, status, error = _answered(reply)
        finished = TurnFinished(status.value, error, reply.text, totals)
        try:
            hooks = self.rt.store.moves.end_at_model_step(
                prepared.turn_id,
                prepared.step,
                items,
                status,
                final_output=reply.text,
                error=error,
                finished_event=finished.fields(),
                model_calls=prepared.state.model_calls + 1,
                layout=prepared.state.layout,
            )
        except StaleStep:
            return StepOutcome("dropped", "already completed")
        ended = self.end.finished(
            prepared.turn_id,
            status,
            final_output=reply.text,
            error=error,
            hooks=hooks,
            usage=totals,
            created_at=prepared.state.created_at,
        )
        return StepOutcome(action, ended=ended)

    def _prose_without_finish(self, prepared: PreparedStep, items: Items) -> StepOutcome:
        """A turn that must end through its finish tool answered in prose: one bounded repair
        instruction, then a failed turn at the second miss (docs/architecture.md, "Workflow tasks")."""
        turn_id, step, store = prepared.turn_id, prepared.step, self.rt.store
        tool = prepared.request.finish_tool
        if prepared.state.finish_misses >= 1:
            error = f"the model replied without calling {tool} twice; the task must end through {tool}"
            try:
                store.moves.end_at_model_step(turn_id, step, items, TurnStatus.failed, error=error)
            except StaleStep:
                return StepOutcome("dropped", "already ended")
            return StepOutcome(
                "ended", "no submission", ended=self.end.finished(turn_id, TurnStatus.failed, error=error)
            )
        instruction = user_message(
            f"You replied without calling `{tool}`. This task can only end by calling `{tool}` with a value "
            f"that matches its schema. Call `{tool}` now; do not answer in prose."
        )
        try:
            store.moves.continue_after_reply(turn_id, step, items + [instruction], {"finish_misses": 1})
        except StaleStep:
            return StepOutcome("dropped", "already continued")
        store.event(turn_id, "repair_instruction", step=step, tool=tool)
        self._next_step(prepared)
        return StepOutcome("repair_instruction")

    def _next_step(self, prepared: PreparedStep) -> None:
        agent_id, turn_id, nxt = prepared.request.agent_id, prepared.turn_id, prepared.step + 1
        with telemetry.under_turn(prepared.state.traceparent):
            self.rt.dispatcher.enqueue_step(
                turn_id, nxt, queue=prepared.request.queue, label=step_label(agent_id, turn_id, nxt)
            )

    def _ended(self, prepared: PreparedStep, end: EndPlan, hooks: bool) -> StepOutcome:
        """After a final reply whose end of the turn was written with it (``plan_move``)."""
        ended = self.end.finished(
            prepared.turn_id,
            end.status,
            final_output=end.final_output,
            error=end.error,
            hooks=hooks,
            usage=end.totals,
            created_at=prepared.state.created_at,
        )
        return StepOutcome(end.action, ended=ended)

    def plan_move(
        self, prepared: PreparedStep, reply: ModelReply, usage: tuple[str, bytes]
    ) -> ToolsPlan | EndPlan | None:
        """The step's move, planned before the reply is stored, for ``ReplyMemo.save_and_check`` to
        write with the reply in one round trip: the plan of ``reply``'s function calls (the move to
        the tools phase; ``handle`` then only sends the first batch) or, for a final answer of a
        layout-2 turn that needs no finish tool, the turn's end (``usage``: the step's record,
        ``UsageLedger.row``; the totals add it to the earlier steps' records read with the step).
        None when the reply does neither (``handle`` decides after it is stored)."""
        items, calls = self._calls(prepared, reply)
        layout2 = prepared.state.layout >= 2
        if calls:
            return self._tools_plan(prepared, reply, items, calls, usage=usage if layout2 else None)
        if not layout2 or prepared.request.finish_tool:
            return None
        action, status, error = _answered(reply)
        _, totals = UsageLedger.totals_of(True, [*prepared.usage_rows, usage[1]])
        finished = TurnFinished(status.value, error, reply.text, totals)
        writes = self.rt.store.moves.end_writes(
            prepared.turn_id, items, status, final_output=reply.text, error=error,
            model_calls=prepared.state.model_calls + 1, usage=usage, finished_event=finished.fields(),
        )  # fmt: skip
        return EndPlan(writes, action, status, error, reply.text, totals)

    def _calls(self, prepared: PreparedStep, reply: ModelReply) -> tuple[Items, Items]:
        """The reply's items to record and its function calls (``normalize_reply_calls``); calls
        written in its text are read first (``worker.model.text_calls``, ``AGENT_MODEL_TEXT_CALLS``)."""
        history_ids = {str(i.get("call_id")) for i in prepared.history if i.get("type") == "function_call"}
        output = reply.output
        if self.rt.settings.model_text_calls:
            # Read first, the tools asked after: a reply with no call in its text (a final answer)
            # does not build again the tools its step shed while the model answered.
            found = calls_from_text(output, _OfferedSchemas(prepared), prepared.step)
            if found and prepared.tools:
                output = found
        items, calls = normalize_reply_calls(output, history_ids, prepared.step)
        return [_clean_item(i) for i in items], calls

    def _plan(self, prepared: PreparedStep, reply: ModelReply, items: Items, calls: Items) -> StepOutcome:
        """Validate and record the reply's calls, then send the first batch."""
        planned = self._tools_plan(prepared, reply, items, calls)
        try:
            self.rt.store.moves.apply_begin_tools(prepared.turn_id, prepared.step, planned.writes)
        except StaleStep:
            return StepOutcome("dropped", "plan already recorded")
        return self._dispatch(prepared, planned)

    def _tools_plan(
        self,
        prepared: PreparedStep,
        reply: ModelReply,
        items: Items,
        calls: Items,
        usage: tuple[str, bytes] | None = None,
    ) -> ToolsPlan:
        """Validate the reply's calls and plan them (``plan_calls``, the approval gate's batches);
        ``usage``: the step's record, written with the move (``Moves.begin_tools_writes``)."""
        turn_id, step, request, settings = prepared.turn_id, prepared.step, prepared.request, self.rt.settings
        planned, known_outputs, invalid_counts = plan_calls(
            turn_id,
            prepared.state.invalid_counts,
            prepared.tools,
            calls,
            reply.status,
            settings.max_raw_arguments_echo,
            approval=approval_rule(prepared.context, request, settings),
            max_arguments_bytes=settings.max_arguments_bytes,
        )
        batches, asks = self.gate.plan(turn_id, step, request, planned, prepared.tools)
        plan = Plan(planned, batches)
        items = cut_replayed_arguments(
            items, {c.call_id for c in planned if not c.runnable}, settings.max_replay_arguments
        )
        batch_of = plan.batch_indexes()
        events = [CallPlanned.of(step, call, batch_of.get(call.call_id)).event() for call in planned]
        writes = self.rt.store.moves.begin_tools_writes(
            turn_id,
            step,
            items,
            plan,
            known_outputs,
            invalid_counts,
            also=asks,
            events=events,
            model_calls=prepared.state.model_calls + 1,
            known_deadline=prepared.state.deadline,
            usage=usage,
            layout=prepared.state.layout,
        )
        # The first batch's messages go with the move when they can (then ``_dispatch`` sends
        # nothing): the script that moves the step to its tools phase also queues its calls.
        runs_calls = bool(plan.batches) and not self.completion.over_budget(invalid_counts)
        if runs_calls:
            message = self.gate.batch_message(turn_id, step, 0, plan, request.agent_id)
            if message is not None:
                writes.send_message(message)
        return ToolsPlan(plan, invalid_counts, writes, runs_calls)

    def _dispatch(self, prepared: PreparedStep, planned: ToolsPlan) -> StepOutcome:
        """After the move to the tools phase: send the first batch, or close the step at once when
        no call runs."""
        turn_id, step, request = prepared.turn_id, prepared.step, prepared.request
        plan = planned.plan
        metrics.calls_planned(plan.calls, {t.name for t in prepared.tools})
        telemetry.planned_calls(plan.calls, plan.batch_indexes())
        detail = f"{len(plan.calls)} calls in {len(plan.batches)} batches"
        if not planned.runs_calls:  # nothing to run: close the step now
            return StepOutcome("dispatched", detail, ended=self.completion.close(turn_id, step, request, -1))
        if planned.writes.sends_message:  # the move to the tools phase queued the first batch
            return StepOutcome("dispatched", detail)
        if not self.gate.dispatch(turn_id, step, 0, plan, agent_id=request.agent_id):
            return StepOutcome("parked", "calls await approval")
        return StepOutcome("dispatched", detail)


def _answered(reply: ModelReply) -> tuple[Action, TurnStatus, str | None]:
    """The step's action, the turn's status and error for a final ``reply``: ``completed``, or
    ``incomplete`` (with its error) when it stopped at the output-token limit."""
    if reply.status == "incomplete":
        reason = reply.incomplete_reason or "incomplete"
        return "incomplete", TurnStatus.incomplete, f"the model's answer stopped at the output-token limit ({reason})"
    return "completed", TurnStatus.completed, None


class _OfferedSchemas(Mapping[str, Mapping[str, Any]]):
    """``_offered_schemas(prepared)``, made on first read (only a fenced block in a reply's text
    reads them)."""

    def __init__(self, prepared: PreparedStep):
        self._prepared = prepared
        self._schemas: dict[str, dict[str, Any]] | None = None

    def _made(self) -> dict[str, dict[str, Any]]:
        if self._schemas is None:
            self._schemas = _offered_schemas(self._prepared)
        return self._schemas

    def __getitem__(self, name: str) -> Mapping[str, Any]:
        return self._made()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._made())

    def __len__(self) -> int:
        return len(self._made())


def _offered_schemas(prepared: PreparedStep) -> dict[str, dict[str, Any]]:
    """The own parameter schemas of the tools the step's request offered (deferred ones once loaded)."""
    loaded = set(prepared.state.loaded_tools)
    return {t.name: source_schema(t) for t in prepared.tools if not t.defer_loading or t.name in loaded}


def _clean_item(item: dict[str, Any]) -> dict[str, Any]:
    """Keep only what the Responses API accepts back as input for our item types."""
    if item.get("type") == "function_call":
        # ``namespace`` must go back unchanged or the API answers 400 "Missing namespace for function_call".
        return {k: item[k] for k in ("type", "id", "call_id", "name", "namespace", "arguments", "status") if k in item}
    return item
