"""The agent loop, as steps over state kept in Redis.

``TurnEngine.run_step(turn_id, n)`` calls the model once (memoized per step),
validates every function call, records the plan, and hands the first batch to
the dispatcher. ``TurnEngine.run_call(turn_id, n, call_id)`` runs one tool
call, stores its result keyed by ``call_id``, and whoever completes a batch
(the Redis barrier) dispatches the next batch or, after the last, records the
outputs in emitted order and enqueues step ``n + 1``. Nothing ever waits on
another task, so one solo worker serving every queue finishes a turn.

Size: one concept, the loop (a step, a call, the advance after a barrier, the end);
its parts that stand alone live beside it (``calls``: the tool-call half; ``planning``,
``interfaces``, ``liveness``, ``outage``).

This module has no Celery import: the ``Dispatcher`` given to the engine
turns "dispatch this batch" into a Celery group or chain.
"""

from __future__ import annotations

import logging
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import orjson

from worker.model.client import GatewayError, ModelReply, ResponsesClient
from worker.model.items import cut_replayed_arguments, function_call_output, normalize_reply_calls, user_message
from worker.model.streaming import stream_reply
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, WorkerTool
from worker.tooling.schemas import collect_tool_definitions
from worker.tooling.tool_search import with_tool_search
from worker.turn import metrics, parking, telemetry
from worker.turn.calls import ToolCalls
from worker.turn.context import TurnContext
from worker.turn.dispatch import Batch, plan_batches
from worker.turn.interfaces import Dispatcher, StepOutcome, Toolset, call_labels, no_toolsets, step_label
from worker.turn.liveness import Liveness, held_key, node, owner
from worker.turn.outage import OUTAGE_ERRORS, Unsaved, until_redis_answers
from worker.turn.planning import plan_calls
from worker.turn.request import Skill, TurnRefused, TurnRequest, TurnStatus, check_turn_id
from worker.turn.state import AdvanceView, StaleStep, StepClaim
from worker.turn.store import TurnState, TurnStore
from worker.turn.usage import UsageLedger, budget_exceeded, normalize_usage

log = logging.getLogger("agent.loop")

# Model replies and tool results this process paid for but could not store yet (a Redis outage).
_UNSAVED_REPLIES = Unsaved()


_HOMES: dict[tuple[str, str], Path] = {}  # (homes root, agent) -> resolved home, made once per process


def _agent_home(settings: Settings, agent_id: str) -> Path:
    key = (str(settings.homes_root), agent_id)
    home = _HOMES.get(key)
    if home is None or not home.is_dir():  # one stat per step instead of realpath + mkdir
        home = (Path(settings.homes_root) / agent_id).resolve()
        home.mkdir(parents=True, exist_ok=True)
        _HOMES[key] = home
    return home


class TurnEngine(ToolCalls):
    """Runs turn steps and tool calls against a ``TurnStore``.

    ``resolve_toolset(name)`` returns the category assembly for a turn's
    ``toolset``; ``client`` is the Responses client (shared per process).
    """

    def __init__(
        self,
        store: TurnStore,
        settings: Settings,
        dispatcher: Dispatcher,
        resolve_toolset: Callable[[str], Toolset] | None = None,
        client: ResponsesClient | None = None,
        project_skills: Callable[[tuple[Skill, ...]], str] | None = None,
    ):
        # A control plane passes neither toolsets nor a client: it only enqueues and ends turns.
        self.store = store
        self.settings = settings
        self.dispatcher = dispatcher
        self.resolve_toolset = resolve_toolset or no_toolsets
        self.client = client
        self.project_skills = project_skills
        self.liveness = Liveness(store.r, settings.liveness_ttl)
        self.usage = UsageLedger(store.r)

    # ----- enqueueing ------------------------------------------------------
    def create_turn(self, request: TurnRequest, turn_id: str) -> tuple[str, bool]:
        """Store a new turn and enqueue its first step. Returns ``(turn_id, created)``; ``created``
        is False for a reused idempotency key or a turn id the agent already used (nothing is
        enqueued again).

        Raises ``TurnRefused`` (nothing stored) for a turn id not matching ``ID_PATTERN``, a turn
        id of another agent, or a request whose JSON is over ``settings.max_input_bytes``.
        """
        check_turn_id(turn_id)
        dumped = request.model_dump(mode="json")
        size = len(orjson.dumps(dumped))
        if size > self.settings.max_input_bytes:
            raise TurnRefused(
                f"the turn request is {size:,} bytes as JSON (input, instructions, skills, metadata); "
                f"the limit is {self.settings.max_input_bytes:,} (AGENT_MAX_INPUT_BYTES)"
            )
        items = [user_message(request.input)] if isinstance(request.input, str) else list(request.input)
        traceparent = telemetry.new_traceparent()
        tid, created = self.store.create(
            turn_id, dumped, items, idempotency_key=request.idempotency_key, fields={"traceparent": traceparent}
        )
        if created:
            with telemetry.under_turn(traceparent):
                self.dispatcher.enqueue_step(tid, 0, queue=request.queue, label=step_label(request.agent_id, tid, 0))
        return tid, created

    def enqueue_turn(self, request: dict[str, Any] | TurnRequest, turn_id: str | None = None) -> str:
        """The ``enqueue_turn`` turn service: validate ``request`` and start a turn; returns its id
        (an existing one for a reused idempotency key or turn id of the same agent). Raises
        ``pydantic.ValidationError`` or ``TurnRefused`` (see ``create_turn``)."""
        req = request if isinstance(request, TurnRequest) else TurnRequest.model_validate(request)
        return self.create_turn(req, turn_id or uuid.uuid4().hex)[0]

    # ----- context and tools ----------------------------------------------
    def context(self, state: TurnState, request: TurnRequest, abort: AbortSignal | None = None) -> TurnContext:
        """The ``TurnContext`` given to category creators (home created on first use)."""
        return TurnContext(
            turn_id=state.turn_id,
            agent_id=request.agent_id,
            home=_agent_home(self.settings, request.agent_id),
            settings=self.settings,
            abort=abort or AbortSignal(probe=lambda: self._cancel_requested(state.turn_id)),
            supports=request.supports,
            redis=self.store.r,
            skills=tuple(request.skills),
            services={
                "enqueue_turn": self.enqueue_turn,
                "cancel_turn": self.cancel,
                **self.dispatcher.services(request),
            },
            metadata=dict(request.metadata),
            workflow_task=request.toolset == "workflow_task",
            network=request.network,
            egress_allow_hosts=tuple(request.egress_allow_hosts) if request.egress_allow_hosts is not None else None,
        )

    def _cancel_requested(self, turn_id: str) -> bool:
        """The abort signal's probe: the turn's cancel flag. While Redis does not answer, a running
        tool goes on (the flag is read again at its next check) rather than failing."""
        try:
            return self.store.is_cancelled(turn_id)
        except OUTAGE_ERRORS:
            return False

    def tools_for(self, ctx: TurnContext, request: TurnRequest) -> list[WorkerTool]:
        """The turn's tool set: its toolset's assembly, plus ``tool_search`` when a tool is deferred."""
        return with_tool_search(self.resolve_toolset(request.toolset)(ctx))

    def instructions_for(self, ctx: TurnContext, request: TurnRequest) -> str | None:
        """The request's instructions with the enabled skills projected into them."""
        parts = [request.instructions or ""]
        if ctx.skills and self.project_skills is not None:
            parts.append(self.project_skills(ctx.skills))
        text = "\n\n".join(p for p in parts if p)
        return text or None

    # ----- a model step ----------------------------------------------------
    def run_step(self, turn_id: str, step: int) -> StepOutcome:
        """Run model step ``step`` of the turn. Stale or duplicate deliveries are dropped.

        Raises ``GatewayError`` (retryable) for the queue layer to retry with backoff.
        """
        # State, history, memo, cancel flag and, for a runnable step, its model-call claim: one round
        # trip. The claim covers the model call (up to model_timeout), as does the progress deadline.
        lease = self.settings.model_timeout + 60
        view = self.store.begin_step(turn_id, step, owner(), lease, held_key(node()))
        state = view.state
        if state is None:
            return StepOutcome("dropped", "unknown turn")
        if state.status.terminal:
            return StepOutcome("dropped", f"turn already {state.status.value}")
        if state.step != step or state.phase != "model":
            return StepOutcome("dropped", f"stale step {step}; turn at {state.step}/{state.phase}")
        request = TurnRequest.model_validate(state.request)
        if view.cancelled:
            self.fail_turn(turn_id, TurnStatus.cancelled, "cancelled by the control plane")
            return StepOutcome("cancelled")
        max_calls = request.max_model_calls or self.settings.max_model_calls
        if state.model_calls >= max_calls:
            self._end(
                turn_id,
                step,
                TurnStatus.max_model_calls,
                error=f"stopped after {state.model_calls} model calls (max_model_calls={max_calls})",
            )
            return StepOutcome("ended", "max_model_calls")
        over_budget = request.token_budget and budget_exceeded(self.usage.totals(turn_id), request.token_budget)
        if over_budget:
            self._end(turn_id, step, TurnStatus.budget_exceeded, error=over_budget)
            return StepOutcome("ended", "budget_exceeded")

        ctx = self.context(state, request)
        tools = self.tools_for(ctx, request)
        if log.isEnabledFor(logging.INFO):  # the join is not free, and workers usually log at WARNING
            log.info("turn %s step %s toolset %s: %s", turn_id, step, request.toolset, ", ".join(t.name for t in tools))
        history = view.items
        reply_data = _UNSAVED_REPLIES.get((turn_id, step)) or view.reply
        cancelled = False
        recorded: tuple[bool, dict[str, int]] | None = None
        if reply_data is not None and state.status == TurnStatus.queued:  # a memo but never marked running
            self.store.mark_running(turn_id, step, event={"agent_id": request.agent_id})
        if reply_data is None:
            if self.client is None:
                raise RuntimeError("this engine has no Responses client: it cannot run model steps")
            if not self._claim_step(turn_id, step, request, view.claim, lease):
                return StepOutcome("dropped", f"step {step} is running elsewhere")
            try:
                called = self._call_model(turn_id, step, request, ctx, tools, history, state)
            except BaseException:
                # Free the step for the retry (it may run in another process); after a stored
                # reply nobody claims again (the memo answers), so the claim just expires.
                self.store.release_step(turn_id, step, owner())
                raise
            if isinstance(called, StepOutcome):
                return called
            reply_data, cancelled, recorded = called
        reply = ModelReply.from_json(reply_data)
        # Once per step, also when the reply came from the memo (a crash after the call).
        step_usage = normalize_usage(reply.usage)
        model = request.model or self.settings.model
        if recorded is None:  # recorded with the reply when this step paid for it
            recorded = self.usage.record_and_total(turn_id, step, step_usage, model)
        usage_stored, usage_totals = recorded
        if usage_stored:
            metrics.tokens_used(model, step_usage)
        if cancelled:  # cancelled while the model was answering
            self.fail_turn(turn_id, TurnStatus.cancelled, "cancelled by the control plane")
            return StepOutcome("cancelled")
        history_ids = {i.get("call_id") for i in history if i.get("type") == "function_call"}
        reply_items, calls = normalize_reply_calls([self._clean_item(i) for i in reply.output], history_ids, step)
        if not calls and request.finish_tool:
            return self._prose_without_finish(turn_id, step, state, request, reply_items)
        if not calls:
            # An answer cut at the output-token limit is not a completed turn: say so.
            status = TurnStatus.incomplete if reply.status == "incomplete" else TurnStatus.completed
            error = (
                f"the model's answer stopped at the output-token limit ({reply.incomplete_reason or 'incomplete'})"
                if status == TurnStatus.incomplete
                else None
            )
            finished = {"status": status.value, "error": error, "final_output": reply.text, "usage": usage_totals}
            try:
                hooks = self.store.complete(
                    turn_id, step, reply_items, status, final_output=reply.text, error=error, finished_event=finished
                )
            except StaleStep:
                return StepOutcome("dropped", "already completed")
            self._finished(turn_id, status, final_output=reply.text, error=error, hooks=hooks, usage=usage_totals)
            return StepOutcome(status.value)

        planned, pre_results, invalid_counts = plan_calls(
            turn_id,
            state.invalid_counts,
            tools,
            calls,
            reply.status,
            self.settings.max_raw_arguments_echo,
            approval=parking.approval_rule(ctx, request, self.settings),
            max_arguments_bytes=self.settings.max_arguments_bytes,
        )
        batches, asks = parking.plan_approvals(self, turn_id, step, request, planned, tools, plan_batches(planned))
        reply_items = cut_replayed_arguments(
            reply_items, {c.call_id for c in planned if not c.runnable}, self.settings.max_replay_arguments
        )
        batch_of = {cid: i for i, b in enumerate(batches) for cid in b.call_ids}
        planned_events = [
            (
                "call_planned",
                {
                    "step": step,
                    "call_id": call.call_id,
                    "name": call.name,
                    "activity": call.activity,
                    "mode": call.mode,
                    "repairs": call.repairs,
                    "error": call.error_kind,
                    "batch": batch_of.get(call.call_id),
                    "arguments": call.data if call.runnable else None,
                    "needs_approval": call.needs_approval,
                },
            )
            for call in planned
        ]
        try:
            self.store.begin_tools(
                turn_id,
                step,
                reply_items,
                planned,
                batches,
                pre_results,
                invalid_counts,
                also=asks,
                events=planned_events,
            )
        except StaleStep:
            return StepOutcome("dropped", "plan already recorded")
        metrics.calls_planned(planned, {t.name for t in tools})
        telemetry.planned_calls(planned, batch_of)
        over = [n for n, c in invalid_counts.items() if c > self.settings.max_invalid_calls_per_tool]
        if over or not batches:
            # Nothing to run (all calls failed validation): close the step now.
            self._advance(turn_id, step, request, batches, -1)
        elif not parking.dispatch_batch(self, turn_id, step, 0, batches, planned, agent_id=request.agent_id):
            return StepOutcome("parked", "calls await approval")
        return StepOutcome("dispatched", f"{len(planned)} calls in {len(batches)} batches")

    def _claim_step(self, turn_id: str, step: int, request: TurnRequest, claim: StepClaim, lease: float) -> bool:
        """Whether this process may make the step's model call, from the claim ``begin_step`` took:
        False while a live process elsewhere is making it (a duplicate or re-driven delivery must
        not pay the model twice); a dead holder's claim is taken over."""
        if not claim.tried:  # nothing was claimable when read: the step moved on (checked above)
            return False
        if claim.started:
            metrics.TURNS_STARTED.labels(request.queue).inc()
        if claim.holder is None or claim.holder == owner():
            return True
        if self.liveness.owner_is_dead(claim.holder):
            self.store.take_over_step(turn_id, step, owner(), lease)
            try:  # the dead holder may have died before its turn was marked running
                self.store.mark_running(turn_id, step, event={"agent_id": request.agent_id})
            except StaleStep:
                return False
            return True
        return False

    def _call_model(
        self,
        turn_id: str,
        step: int,
        request: TurnRequest,
        ctx: TurnContext,
        tools: list[WorkerTool],
        history: list[dict[str, Any]],
        state: TurnState,
    ) -> tuple[dict[str, Any], bool, tuple[bool, dict[str, int]]] | StepOutcome:
        """Call the model once for the step and store its reply with its usage record; returns
        ``(stored reply (JSON), cancelled meanwhile, (usage stored, turn's usage totals))`` or, for a
        request the gateway refused, the outcome of the ended turn."""
        model = request.model or self.settings.model
        body = self.client.build_request(
            model=model,
            input=history,
            tools=collect_tool_definitions(tools, loaded=state.loaded_tools),
            instructions=self.instructions_for(ctx, request),
            max_output_tokens=self.settings.max_output_tokens,
        )
        started = time.perf_counter()
        with telemetry.model_call_span(model, turn_id, request.agent_id, step) as span:
            try:
                reply = self._create(turn_id, step, body)
            except GatewayError as exc:
                metrics.MODEL_CALL_SECONDS.labels(model).observe(time.perf_counter() - started)
                if exc.retryable:
                    raise
                self._end(turn_id, step, TurnStatus.failed, error=str(exc))
                return StepOutcome("ended", "model request rejected")
            elapsed = time.perf_counter() - started
            metrics.MODEL_CALL_SECONDS.labels(model).observe(elapsed)
            usage = normalize_usage(reply.usage)
            telemetry.model_reply(span, reply.id, reply.status, usage, len(reply.function_calls))
        # Paid for: keep it until stored, so neither an outage nor a redelivery pays again.
        _UNSAVED_REPLIES.put((turn_id, step), reply.to_json())
        event = {
            "step": step,
            "status": reply.status,
            "text": reply.text[:1000],
            "calls": len(reply.function_calls),
            "ms": round(elapsed * 1000, 1),
            "usage": usage,
        }
        stored, cancelled, extra = until_redis_answers(
            lambda: self.store.save_reply_and_check(
                turn_id,
                step,
                reply.to_json(),
                event,
                also=lambda pipe: self.usage.queue_record(pipe, turn_id, step, usage, model),
            ),
            what=f"saving the model reply of turn {turn_id} step {step}",
            timeout=self.settings.redis_outage_timeout,
        )
        _UNSAVED_REPLIES.drop((turn_id, step))
        return stored, cancelled, UsageLedger.recorded(extra)

    def _create(self, turn_id: str, step: int, body: dict[str, Any]) -> ModelReply:
        """The model call: streamed (deltas batched into the event stream) unless ``AGENT_MODEL_STREAM=0``."""
        assert self.client is not None
        if not self.settings.model_stream:
            return self.client.create(body)
        return stream_reply(
            self.client,
            body,
            lambda events: self.store.add_events(turn_id, events),
            step=step,
            interval=self.settings.stream_flush_ms / 1000,
        )

    def _prose_without_finish(
        self, turn_id: str, step: int, state: TurnState, request: TurnRequest, reply_items: list[dict[str, Any]]
    ) -> StepOutcome:
        # Spec, "Workflow task tools": prose without submitting gets one bounded repair
        # instruction; a second miss fails the task.
        tool = request.finish_tool
        if state.finish_misses >= 1:
            error = f"the model replied without calling {tool} twice; the task must end through {tool}"
            try:
                self.store.complete(turn_id, step, reply_items, TurnStatus.failed, error=error)
            except StaleStep:
                return StepOutcome("dropped", "already ended")
            self._finished(turn_id, TurnStatus.failed, error=error)
            return StepOutcome("ended", "no submission")
        instruction = user_message(
            f"You replied without calling `{tool}`. This task can only end by calling `{tool}` with a value "
            f"that matches its schema. Call `{tool}` now; do not answer in prose."
        )
        try:
            self.store.continue_after_reply(turn_id, step, reply_items + [instruction], {"finish_misses": 1})
        except StaleStep:
            return StepOutcome("dropped", "already continued")
        self.store.event(turn_id, "repair_instruction", step=step, tool=tool)
        with telemetry.under_turn(state.traceparent):
            self.dispatcher.enqueue_step(
                turn_id, step + 1, queue=request.queue, label=step_label(request.agent_id, turn_id, step + 1)
            )
        return StepOutcome("repair_instruction")

    def _finished(
        self,
        turn_id: str,
        status: TurnStatus,
        *,
        error: str | None = None,
        final_output: str | None = None,
        hooks: bool | None = None,
        usage: dict[str, int] | None = None,
    ) -> None:
        """Every terminal transition ends here: the event for tails (with the turn's token usage),
        the turn's metric and root span, then the queue layer: ``turn_finished`` notes where the turn
        ended and, for a turn with end hooks (``hooks``; read from the store when None), runs them.
        ``usage``: the turn's totals, when the transition that ended the turn already wrote the
        ``turn_finished`` event with them (``TurnStore.complete(finished_event=...)``)."""
        if usage is None:
            usage = self.usage.totals(turn_id)
            self.store.event(
                turn_id, "turn_finished", status=status.value, error=error, final_output=final_output, usage=usage
            )
        metrics.TURNS_ENDED.labels(status.value).inc()
        state = self.store.load(turn_id) if telemetry.tracing_active() else None
        if state is not None:
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
        self.dispatcher.turn_finished(
            turn_id, hooks=self.store.awaits_hooks(turn_id) if hooks is None else hooks, status=status, error=error
        )

    def cancel(self, turn_id: str) -> bool:
        """Ask a turn to stop: sets the cancel flag (running tools see their abort signal; the
        next step boundary ends the turn) and ends a still-queued turn at once.

        Returns False when the turn is unknown or already ended.
        """
        state = self.store.load(turn_id)
        if state is None or state.status.terminal:
            return False
        self.store.request_cancel(turn_id)
        if state.status == TurnStatus.queued:  # nothing runs yet; the queued step will be fenced out
            self.fail_turn(turn_id, TurnStatus.cancelled, "cancelled by the control plane")
        parking.cancel_parked(self, state)
        return True

    def fail_turn(self, turn_id: str, status: TurnStatus, error: str) -> bool:
        """End a non-terminal turn whatever its step (cancel, gateway failure, watchdog). False if already ended."""
        if not self.store.fail(turn_id, status, error):
            return False
        self._finished(turn_id, status, error=error)
        return True

    @staticmethod
    def _clean_item(item: dict[str, Any]) -> dict[str, Any]:
        # Keep only what the Responses API accepts back as input for our item types.
        if item.get("type") == "function_call":
            # ``namespace`` must go back unchanged or the API answers 400 "Missing namespace for function_call".
            return {
                k: item[k] for k in ("type", "id", "call_id", "name", "namespace", "arguments", "status") if k in item
            }
        return item

    # ----- barrier and step end -------------------------------------------
    def _advance(
        self,
        turn_id: str,
        step: int,
        request: TurnRequest,
        batches: list[Batch],
        done_index: int,
        view: AdvanceView | None = None,
    ) -> None:
        # ``view``: what the barrier returned to its winner; read here otherwise.
        view = view or self.store.advance_view(turn_id, step)
        state, cancelled, results = view.state, view.cancelled, view.results
        if state is None or state.status.terminal:
            return
        over = sorted(n for n, c in state.invalid_counts.items() if c > self.settings.max_invalid_calls_per_tool)
        nxt = done_index + 1
        plan = self.store.plan(turn_id, step)
        assert plan is not None
        calls, _ = plan
        if nxt < len(batches) and not (state.terminate or over or cancelled):
            # A gated batch may park here.
            parking.dispatch_batch(self, turn_id, step, nxt, batches, calls, agent_id=request.agent_id)
            return
        outputs = []
        for call in sorted(calls, key=lambda c: c.index):
            res = results.get(call.call_id) or {
                "output": "Interrupted: the call did not run (the turn ended before it).",
                "is_error": True,
            }
            item, _ = function_call_output(call.call_id, res["output"], max_chars=self.settings.max_output_chars)
            outputs.append(item)
        terminal: TurnStatus | None = None
        error = None
        if cancelled:
            terminal, error = TurnStatus.cancelled, "cancelled by the control plane"
        elif state.terminate:
            terminal = TurnStatus.terminated
        elif over:
            terminal = TurnStatus.invalid_arguments
            error = (
                f"the model sent invalid arguments to {', '.join(over)} more than "
                f"{self.settings.max_invalid_calls_per_tool} times"
            )
        loaded = self._loaded_tools(state, results)
        try:
            self.store.finish_tools(
                turn_id,
                step,
                outputs,
                terminal=terminal,
                error=error,
                loaded_tools=loaded if loaded != state.loaded_tools else None,
            )
        except StaleStep:
            return
        if terminal is not None:
            self._finished(turn_id, terminal, error=error)
            return
        with telemetry.under_turn(state.traceparent):
            self.dispatcher.enqueue_step(
                turn_id, step + 1, queue=request.queue, label=step_label(request.agent_id, turn_id, step + 1)
            )

    @staticmethod
    def _loaded_tools(state: TurnState, results: dict[str, dict[str, Any]]) -> list[str]:
        loaded = list(state.loaded_tools)
        for res in results.values():
            for name in (res.get("details") or {}).get("loaded", []) or []:
                if name not in loaded:
                    loaded.append(name)
        return loaded

    def _end(self, turn_id: str, step: int, status: TurnStatus, error: str) -> None:
        try:
            self.store.complete(turn_id, step, [], status, error=error, count_model_call=False)
        except StaleStep:
            return
        self._finished(turn_id, status, error=error)

    # ----- watchdog ---------------------------------------------------------
    def redrive(self, turn_id: str, max_redrives: int, reason: str = "no progress") -> StepOutcome:
        """Re-drive a turn that stopped (``reason``: its progress deadline passed, or the node holding
        it died): re-send its model step, or the missing calls of its first unfinished batch, or
        advance a batch whose barrier never fired. Every re-sent message is fenced and claimed, so a
        re-drive never runs a step or a call twice. Fails the turn after ``max_redrives`` re-drives
        without progress."""
        state = self.store.load(turn_id)
        if state is None or state.status.terminal:
            self.store.r.zrem("turns:watch", turn_id)
            return StepOutcome("dropped", "not active")
        if state.redrives >= max_redrives:
            self.fail_turn(turn_id, TurnStatus.failed, f"{reason} after {state.redrives} re-drives")
            return StepOutcome("failed", "watchdog gave up")
        if state.status == TurnStatus.awaiting_approval and state.phase == "tools":
            parked = parking.redrive_parked(self, state)
            if parked is not None:
                return parked
        self.store.note_redrive(turn_id)
        self.store.event(turn_id, "turn_redriven", step=state.step, phase=state.phase, reason=reason)
        metrics.REDRIVES.inc()
        with telemetry.under_turn(state.traceparent):  # re-sent tasks stay in the turn's trace
            return self._redrive(state, TurnRequest.model_validate(state.request))

    def _redrive(self, state: TurnState, request: TurnRequest) -> StepOutcome:
        turn_id = state.turn_id
        if state.phase == "model":
            self.dispatcher.enqueue_step(
                turn_id, state.step, queue=request.queue, label=step_label(request.agent_id, turn_id, state.step)
            )
            return StepOutcome("redriven", f"step {state.step}")
        plan = self.store.plan(turn_id, state.step)
        if plan is None:
            return StepOutcome("dropped", "no plan")
        calls, batches = plan
        results = self.store.results(turn_id, state.step)
        for i, batch in enumerate(batches):
            missing = [c for c in batch.call_ids if c not in results]
            if missing:
                self.dispatcher.dispatch_batch(
                    turn_id,
                    state.step,
                    i,
                    Batch(batch.mode, missing),
                    queue="tools",
                    labels=call_labels(request.agent_id, turn_id, state.step, calls),
                )
                return StepOutcome("redriven", f"batch {i}")
        # All results present but the barrier never advanced: advance now.
        self._advance(turn_id, state.step, request, batches, len(batches) - 1)
        return StepOutcome("redriven", "advanced")
