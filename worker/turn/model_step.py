"""A model step, up to its stored reply: ``prepare`` the request, ``call`` the model once, hand the
reply to ``worker.turn.replies``.

- ``prepare`` reads the step in one round trip (``Claims.begin_step``: state, history, memoized
  reply, cancel flag, and the step's model-call claim), drops a stale or duplicate delivery,
  applies the caps (cancel flag, ``max_model_calls``, token budget), builds the turn's tools and
  the ``ModelRequest``. A step whose reply is already stored (a redelivery after a crash, or a
  reply kept through a Redis outage) needs no call.
- ``call`` makes the one model call of the step through the ``ModelClient`` (streamed unless
  ``AGENT_MODEL_STREAM=0``), and stores the reply with its ``model_reply`` event and usage record
  (first write wins: a redelivered step never pays twice).

With ``calls`` (``worker.turn.async_calls.AsyncModelCalls``), a step does not hold its thread
while the model answers (docs/architecture.md, "Model calls off the worker's threads"): ``run``
hands the prepared step to the process's event loop and returns ``waiting``; when the call ends,
``finish_call`` stores the reply and hands it to ``ReplyHandler.handle``, on a thread of ``calls``.
Each such call claims the step under its own owner id (``call_owner``), so a redelivery that
lands on the thread that started the call does not take it for its own.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from opentelemetry import trace

from worker.model.interface import GatewayError, ModelClient, ModelReply, ModelRequest
from worker.model.streaming import stream_reply
from worker.tooling.oversized import MAX_ITEM_ID_CHARS, compact_output
from worker.tooling.schemas import collect_tool_definitions
from worker.turn import metrics, telemetry
from worker.turn.async_calls import AsyncModelCalls
from worker.turn.ending import CANCELLED, TurnEnd
from worker.turn.events import ModelReplied
from worker.turn.liveness import held_key, node, owner
from worker.turn.outage import Unsaved, until_redis_answers
from worker.turn.outcome import StepOutcome
from worker.turn.prepared import EndPlan, PreparedStep, StoredReply, Toolkit, ToolsPlan
from worker.turn.replies import ReplyHandler
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import StaleStep, StepClaim, StepView, TurnState
from worker.turn.toolbox import Toolbox
from worker.turn.unread_output import handle_unread_reply
from worker.turn.usage import UsageLedger, budget_exceeded, normalize_usage

log = logging.getLogger("agent.loop")

# Model replies this process paid for but could not store yet (a Redis outage).
_UNSAVED_REPLIES = Unsaved()
# Owner ids of asynchronous calls: ``host:node_pid:pid:N``, N counting from far above any thread
# id's range so that no thread of this process ever passes for a call's owner.
_CALLS = itertools.count(1 << 62)


def call_owner() -> str:
    """A fresh claim owner for one asynchronous model call (the shape ``owner()`` has, so
    ``Liveness.owner_is_dead`` judges it by its process and node)."""
    return f"{node()}:{os.getpid()}:{next(_CALLS)}"


class ModelStep:
    """Runs model steps (see the module docstring); ``client`` None: an engine that only enqueues;
    ``calls``: make model calls on the process's event loop instead of the caller's thread."""

    def __init__(
        self,
        runtime: TurnRuntime,
        toolbox: Toolbox,
        client: ModelClient | None,
        replies: ReplyHandler,
        end: TurnEnd,
        calls: AsyncModelCalls | None = None,
    ):
        self.rt = runtime
        self.toolbox = toolbox
        self.client = client
        self.replies = replies
        self.end = end
        self.calls = calls

    def run(self, turn_id: str, step: int) -> StepOutcome:
        """Run model step ``step`` of the turn. Stale or duplicate deliveries are dropped.

        Raises ``GatewayError`` (retryable) for the queue layer to retry with backoff.
        """
        prepared = self.prepare(turn_id, step)
        if isinstance(prepared, StepOutcome):
            return prepared
        if prepared.memo is None and self.calls is not None:
            # The request is built: while the model answers, the call holds no tools; the
            # reply's handling builds them again (about 40 us, against 11 KB held per call).
            prepared.shed_tools()
            return self.calls.start(prepared, self.finish_call)
        stored = StoredReply(prepared.memo) if prepared.memo is not None else self.call(prepared)
        if isinstance(stored, StepOutcome):
            return stored
        return self.replies.handle(prepared, stored)

    # ----- before the call ----------------------------------------------------
    def prepare(self, turn_id: str, step: int) -> PreparedStep | StepOutcome:
        """Read the step and check it; the ``PreparedStep``, or the outcome of a step that ends here."""
        # The claim covers the model call (up to model_timeout), as does the progress deadline.
        lease = self.rt.settings.model_call_lease
        claimant = owner() if self.calls is None else call_owner()
        settings = self.rt.settings  # the background response is only used by a streamed call in background mode
        background = settings.model_background and settings.model_stream
        view = self.rt.store.claims.begin_step(turn_id, step, claimant, lease, held_key(node()), background=background)
        state = view.state
        if state is None:
            return StepOutcome("dropped", "unknown turn")
        stale = _stale(state, step)
        if stale is not None:
            return stale
        request = state.turn_request()
        if view.cancelled:
            return StepOutcome("cancelled", ended=self.end.fail(turn_id, TurnStatus.cancelled, CANCELLED))
        capped = self._caps(turn_id, step, state, request)
        if capped is not None:
            return capped
        toolkit = self._toolkit(state, request)
        built = toolkit()
        if log.isEnabledFor(logging.INFO):  # the join is not free, and workers usually log at WARNING
            names = ", ".join(t.name for t in built[1])
            log.info("turn %s step %s toolset %s: %s", turn_id, step, request.toolset, names)
        model = request.model or self.rt.settings.model
        prepared = PreparedStep(turn_id, step, state, request, toolkit, view.items, lease, model, claimant, built=built)
        prepared.response_id = view.response_id
        prepared.usage_rows = view.usage_rows
        return self._memo(prepared, view) or self._claimed(prepared, view.claim)

    def _toolkit(self, state: TurnState, request: TurnRequest) -> Callable[[], Toolkit]:
        """What builds the step's context and tools (``PreparedStep.toolkit``)."""

        def build() -> Toolkit:
            ctx = self.toolbox.context(state, request, make_home=False)  # a model step runs no tool
            return ctx, self.toolbox.tools(ctx, request)

        return build

    def _caps(self, turn_id: str, step: int, state: TurnState, request: TurnRequest) -> StepOutcome | None:
        """The outcome of a step stopped by the model-call cap or the token budget, else None."""
        max_calls = request.max_model_calls or self.rt.settings.max_model_calls
        if state.model_calls >= max_calls:
            error = f"stopped after {state.model_calls} model calls (max_model_calls={max_calls})"
            ended = self.end.at_model_step(turn_id, step, TurnStatus.max_model_calls, error)
            return StepOutcome("ended", "max_model_calls", ended=ended)
        over_budget = request.token_budget and budget_exceeded(self.rt.usage.totals(turn_id), request.token_budget)
        if over_budget:
            ended = self.end.at_model_step(turn_id, step, TurnStatus.budget_exceeded, over_budget)
            return StepOutcome("ended", "budget_exceeded", ended=ended)
        return None

    def _memo(self, prepared: PreparedStep, view: StepView) -> PreparedStep | None:
        """``prepared`` with the step's stored (or kept) reply, or None when it has none."""
        memo = _UNSAVED_REPLIES.get((prepared.turn_id, prepared.step)) or view.reply
        if memo is None:
            return None
        if prepared.state.status == TurnStatus.queued:  # a memo but never marked running
            self.rt.store.moves.mark_running(
                prepared.turn_id, prepared.step, event={"agent_id": prepared.request.agent_id}
            )
        prepared.memo = memo
        return prepared

    def _claimed(self, prepared: PreparedStep, claim: StepClaim) -> PreparedStep | StepOutcome:
        """``prepared`` with its model request when this process may make the call, else dropped."""
        if self.client is None and self.calls is None:
            raise RuntimeError("this engine has no model client: it cannot run model steps")
        if not self._may_call(prepared, claim):
            return StepOutcome("dropped", f"step {prepared.step} is running elsewhere")
        ctx, request, settings = prepared.context, prepared.request, self.rt.settings
        prepared.model_request = ModelRequest(
            model=prepared.model,
            input=prepared.history,
            tools=collect_tool_definitions(prepared.tools, loaded=prepared.state.loaded_tools),
            instructions=self.toolbox.instructions(ctx, request),
            max_output_tokens=settings.max_output_tokens,
        )
        return prepared

    def _may_call(self, prepared: PreparedStep, claim: StepClaim) -> bool:
        """Whether this process may make the step's model call, from the claim ``begin_step`` took:
        False while a live process elsewhere is making it (a duplicate or re-driven delivery must
        not pay the model twice); a dead holder's claim is taken over."""
        if not claim.tried:  # nothing was claimable when read: the step moved on (checked above)
            return False
        if claim.started:
            metrics.TURNS_STARTED.labels(prepared.request.queue).inc()
        if claim.holder is None or claim.holder == prepared.owner:
            return True
        if not self.rt.liveness.owner_is_dead(claim.holder):
            return False
        store, turn_id, step = self.rt.store, prepared.turn_id, prepared.step
        if not store.claims.take_over_step(
            turn_id, step, prepared.owner, prepared.lease, claim.holder, held_key(node())
        ):
            return False  # another delivery took the dead holder's step over first
        try:  # the dead holder may have died before its turn was marked running
            store.moves.mark_running(turn_id, step, event={"agent_id": prepared.request.agent_id})
        except StaleStep:
            return False
        return True

    # ----- the call -------------------------------------------------------------
    def call(self, prepared: PreparedStep) -> StoredReply | StepOutcome:
        """Call the model once for the step and store its reply with its usage record; the stored
        reply or, for a request the gateway refused, the outcome of the ended turn. Raises
        ``GatewayError`` (retryable) after freeing the step's claim for the retry."""
        try:
            return self._call(prepared)
        except BaseException:
            # Free the step for the retry (it may run in another process); after a stored
            # reply nobody claims again (the memo answers), so the claim just expires.
            self.rt.store.claims.release_step(prepared.turn_id, prepared.step, prepared.owner)
            raise

    def _call(self, prepared: PreparedStep) -> StoredReply | StepOutcome:
        assert prepared.model_request is not None
        started = time.perf_counter()
        with telemetry.model_call_span(
            prepared.model, prepared.turn_id, prepared.request.agent_id, prepared.step
        ) as span:
            try:
                reply = self._create(prepared.turn_id, prepared.step, prepared.model_request, prepared.model)
            except GatewayError as exc:
                return self._refused(prepared, exc, time.perf_counter() - started)
            reply = within_caps(reply, self.rt.settings.max_arguments_bytes, prepared)
            event = self._noted(prepared, reply, time.perf_counter() - started, span)
        # Stored outside the call's span: the first batch's messages, which the store may queue
        # (``ReplyHandler.plan_move``), belong to the step's task, as when they are sent later.
        return self._store(prepared, reply, event)

    def finish_call(
        self,
        prepared: PreparedStep,
        result: ModelReply | BaseException,
        elapsed: float,
        span: trace.Span,
        deltas: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> StepOutcome:
        """Finish a step whose model call was made elsewhere (``AsyncModelCalls``): ``result`` is the
        reply, or the exception the call raised, after ``elapsed`` seconds; ``span`` its started span
        (ended here); ``deltas``: the stream's last ``model_delta`` events, appended just before
        ``model_reply`` in the same round trip. Stores the reply and handles it (a Redis outage is
        waited out). Raises the call's ``GatewayError`` (retryable) or any other exception after
        freeing the step's claim."""
        try:
            if isinstance(result, BaseException):
                telemetry.end_model_call_span(span, result)
                if isinstance(result, GatewayError):
                    return self._refused(prepared, result, elapsed)
                metrics.model_call_finished(prepared.model, None, failed=True)
                raise result
            try:
                result = within_caps(result, self.rt.settings.max_arguments_bytes, prepared)
                stored = self._paid(prepared, result, elapsed, span, deltas)
            finally:
                telemetry.end_model_call_span(span)
        except BaseException:
            self.rt.store.claims.release_step(prepared.turn_id, prepared.step, prepared.owner)
            raise
        return until_redis_answers(
            lambda: self.replies.handle(prepared, stored),
            what=f"turn {prepared.turn_id} step {prepared.step}",
            timeout=self.rt.settings.redis_outage_timeout,
        )

    def _refused(self, prepared: PreparedStep, exc: GatewayError, elapsed: float) -> StepOutcome:
        """A failed call: raises ``exc`` when it is retryable; a reply the server refused to return
        (``exc.model_output``) is the model's to correct (``worker.turn.unread_output``); any other
        ends the turn ``failed``."""
        metrics.MODEL_CALL_SECONDS.labels(prepared.model).observe(elapsed)
        metrics.model_call_finished(prepared.model, exc.status_code, failed=True, model_output=exc.model_output)
        if exc.model_output:
            return handle_unread_reply(self.rt, self.end, prepared, exc)
        if exc.retryable:
            raise exc
        ended = self.end.at_model_step(prepared.turn_id, prepared.step, TurnStatus.failed, str(exc))
        return StepOutcome("ended", "model request rejected", ended=ended)

    def _paid(
        self,
        prepared: PreparedStep,
        reply: ModelReply,
        elapsed: float,
        span: trace.Span,
        deltas: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> StoredReply:
        """Record a reply's metrics and span attributes, and store it."""
        return self._store(prepared, reply, self._noted(prepared, reply, elapsed, span), deltas)

    def _noted(self, prepared: PreparedStep, reply: ModelReply, elapsed: float, span: trace.Span) -> ModelReplied:
        """Record a reply's metrics and span attributes; its ``model_reply`` event."""
        metrics.MODEL_CALL_SECONDS.labels(prepared.model).observe(elapsed)
        metrics.model_call_finished(prepared.model)
        usage = normalize_usage(reply.usage)
        telemetry.model_reply(span, reply.id, reply.status, usage, len(reply.function_calls))
        calls = len(reply.function_calls)
        return ModelReplied(prepared.step, reply.status, reply.text[:1000], calls, round(elapsed * 1000, 1), usage)

    def _create(self, turn_id: str, step: int, request: ModelRequest, model: str) -> ModelReply:
        """The model call: streamed (deltas batched into the event stream) unless ``AGENT_MODEL_STREAM=0``."""
        assert self.client is not None
        settings = self.rt.settings
        if not settings.model_stream:
            return self.client.create(request)
        return stream_reply(
            self.client,
            request,
            lambda events: self.rt.store.add_events(turn_id, events),
            step=step,
            interval=settings.stream_flush_ms / 1000,
            on_first=metrics.FIRST_TOKEN_SECONDS.labels(model).observe,
        )

    def _store(
        self,
        prepared: PreparedStep,
        reply: ModelReply,
        event: ModelReplied,
        deltas: Sequence[tuple[str, dict[str, Any]]] = (),
    ) -> StoredReply:
        """Store the paid-for reply (memo, events, usage record, cancel flag read and, for a reply
        with function calls, the step's move to its tools phase: one round trip), keeping it in this
        process until Redis has it, so neither an outage nor a redelivery pays again."""
        turn_id, step = prepared.turn_id, prepared.step
        data = reply.to_json()
        _UNSAVED_REPLIES.put((turn_id, step), data)
        usage = UsageLedger.row(step, event.usage, prepared.model, layout=prepared.state.layout)
        try:
            planned = self.replies.plan_move(prepared, reply, usage)
        except Exception:  # the reply is stored first whatever planning does; handling plans it again
            log.exception("turn %s step %s: planning the reply's calls failed before storing it", turn_id, step)
            planned = None
        ending = planned if isinstance(planned, EndPlan) else None
        saved = until_redis_answers(
            lambda: self.rt.store.memo.save_and_check(
                turn_id,
                step,
                data,
                event.fields(),
                usage,
                deltas,
                then=planned.writes if planned else None,
                hooks_deadline=self.rt.store.moves.hooks_deadline() if ending is not None else None,
            ),  # fmt: skip
            what=f"saving the model reply of turn {turn_id} step {step}",
            timeout=self.rt.settings.redis_outage_timeout,
        )
        _UNSAVED_REPLIES.drop((turn_id, step))
        if saved.ended and ending is not None:
            return StoredReply(saved.reply, recorded=(True, ending.totals), ended=ending, hooks=saved.hooks)
        began = planned if saved.began and isinstance(planned, ToolsPlan) else None
        return StoredReply(saved.reply, saved.cancelled, UsageLedger.totals_of(*saved.usage), began=began)


def within_caps(reply: ModelReply, max_arguments_bytes: int, prepared: PreparedStep) -> ModelReply:
    """``reply`` with every model-chosen value over its cap replaced by its placeholder
    (``worker.tooling.oversized``), before anything of it is stored, planned or traced: what is
    memoized is what every later read of the step plans (docs/arguments.md, "Size")."""
    output = compact_output(reply.output, max_arguments_bytes)
    reply_id = reply.id if len(reply.id) <= MAX_ITEM_ID_CHARS else ""
    if output is None and reply_id == reply.id:
        return reply
    log.warning(
        "turn %s step %s: the reply held values over their caps; placeholders are kept", prepared.turn_id, prepared.step
    )
    return replace(reply, id=reply_id, output=reply.output if output is None else output)


def _stale(state: TurnState, step: int) -> StepOutcome | None:
    """The outcome of a delivery that must not run (an ended turn, another step), else None."""
    if state.status.terminal:
        return StepOutcome("dropped", f"turn already {state.status.value}")
    if state.step != step or state.phase != "model":
        return StepOutcome("dropped", f"stale step {step}; turn at {state.step}/{state.phase}")
    return None
