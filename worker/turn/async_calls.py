"""Model calls that hold no worker thread: the step hands its call to the process's event loop and
returns; the reply, once stored, is handled on a finisher thread (docs/architecture.md, "Model
calls off the worker's threads").

``AsyncModelCalls.start(prepared, finish)`` (from ``ModelStep.run``, on a worker thread):

1. ``CallEdge.begin`` records the turn as held by this node, so a node that dies mid-call has its
   turn re-driven (``worker.turn.liveness``), and says how many retries the step already had;
2. the call is submitted to the ``CallLoop`` (``AsyncModelClient.create`` or, streamed, ``stream``
   with its deltas batched on the loop and appended to the turn's events by one publisher thread,
   in order);
3. ``start`` returns ``StepOutcome("waiting")``: the worker thread is free.

When the call ends, a finisher thread runs ``finish`` (``ModelStep.finish_call``: the reply stored
once with its usage, then ``ReplyHandler.handle``). A retryable ``GatewayError`` frees the step's
claim and publishes the step again after the backoff (``CallEdge.retry``, ``worker.turn.retries``);
after ``MAX_MODEL_RETRIES``, or for an unexpected error, the turn ends ``failed`` with the reason.
A Redis outage longer than ``redis_outage_timeout`` leaves the turn to the watchdog.

A call whose turn is cancelled is aborted (its connection closed: a provider stops generating,
and billing, when a stream's client goes): every ``Settings.model_cancel_poll`` seconds a watch
thread reads the cancel flags of the calls in flight in one round trip, and the finisher ends an
aborted call's turn ``cancelled`` (``TurnEnd.fail``, as a step that finds the flag). Without the
watch, a cancelled turn's call ran to its end, up to ``model_timeout``, and was paid in full.

Crash semantics are an inline call's: the step's claim and the node's held record stay until the
reply is handled; a re-driven step of a dead node takes the claim over, and a stored reply is never
paid again (the memo answers). ``drain(timeout)`` (a worker's warm shutdown) waits for the calls in
flight, then frees the claims of the rest and publishes their steps again.
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace

from worker.model.async_client import AsyncModelClient
from worker.model.background import Background
from worker.model.call_loop import CallLoop
from worker.model.interface import GatewayError, ModelReply
from worker.model.streaming import Publish, stream_reply_async
from worker.turn import metrics, telemetry
from worker.turn.ending import CANCELLED, TurnEnd
from worker.turn.interfaces import step_label
from worker.turn.outage import OUTAGE_ERRORS, until_redis_answers
from worker.turn.outcome import StepOutcome
from worker.turn.prepared import PreparedStep
from worker.turn.request import TurnStatus
from worker.turn.retries import MAX_MODEL_RETRIES, note_retry, retry_delay
from worker.turn.runtime import TurnRuntime

log = logging.getLogger("agent.model")

# ``finish(prepared, reply or exception, elapsed s, span, deltas to append before the reply)``
Finish = Callable[
    [PreparedStep, "ModelReply | BaseException", float, trace.Span, list[tuple[str, dict[str, Any]]]], StepOutcome
]


class CallEdge(Protocol):
    """What the queue layer does around an asynchronous model call (``tasks.model_calls``)."""

    def begin(self, turn_id: str, step: int) -> int:
        """Record the turn as held by this node while its call is in flight; the retries the step
        has had (0 for its first attempt)."""
        ...

    def end(self, turn_id: str, step: int) -> None:
        """The call of step ``step`` is finished with (handled, retried or given up): forget its held record."""
        ...

    def retry(self, turn_id: str, step: int, *, queue: str, countdown: float, retries: int) -> None:
        """Publish model step ``step`` again on ``queue`` in ``countdown`` seconds as retry ``retries``."""
        ...


@dataclass(frozen=True)
class AsyncSetup:
    """The parts of asynchronous model calls, one per process: the ``client`` (pooled, on the
    ``loop``), the queue layer's ``edge``, and ``finishers`` threads that store and handle replies."""

    client: AsyncModelClient
    loop: CallLoop
    edge: CallEdge
    finishers: int = 4


@dataclass(eq=False)
class _InFlight:
    prepared: PreparedStep
    finish: Finish
    span: trace.Span
    retries: int
    context: otel_context.Context = field(default_factory=telemetry.current_context)  # the step task's span
    started: float = field(default_factory=time.perf_counter)
    future: concurrent.futures.Future[ModelReply] | None = None
    published: concurrent.futures.Future[None] | None = None  # the last delta batch handed on
    rest: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # deltas stored with the reply
    aborted: bool = False  # cancelled by the watch because its turn was (``_abort``), not by ``drain``
    response_id: str | None = None  # its background response (``worker.model.background``), once known


class AsyncModelCalls:
    """Starts and finishes model calls on the process's event loop (see the module docstring)."""

    def __init__(self, runtime: TurnRuntime, end: TurnEnd, setup: AsyncSetup):
        self.rt = runtime
        self.end = end
        self.client, self.loop, self.edge = setup.client, setup.loop, setup.edge
        self._finishers = ThreadPoolExecutor(setup.finishers, thread_name_prefix="agent-model-finish")
        # One thread: a turn's delta batches reach its event stream in the order they were cut.
        self._publisher = ThreadPoolExecutor(1, thread_name_prefix="agent-model-deltas")
        self._in_flight: set[_InFlight] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._closed = threading.Event()
        self._watch: threading.Thread | None = None  # started with the first call

    @property
    def in_flight(self) -> int:
        """Calls started and not finished with yet (their reply not handled)."""
        with self._lock:
            return len(self._in_flight)

    def start(self, prepared: PreparedStep, finish: Finish) -> StepOutcome:
        """Hand the step's call to the loop; ``finish`` (``ModelStep.finish_call``) takes its result. Returns ``waiting`` at once."""
        assert prepared.model_request is not None
        retries = self.edge.begin(prepared.turn_id, prepared.step)
        span = telemetry.start_model_call_span(
            prepared.model, prepared.turn_id, prepared.request.agent_id, prepared.step
        )
        call = _InFlight(prepared, finish, span, retries, response_id=prepared.response_id)
        with self._lock:
            self._in_flight.add(call)
            if self._watch is None:
                self._watch = threading.Thread(target=self._watch_cancels, name="agent-model-cancels", daemon=True)
                self._watch.start()
        call.future = self.loop.submit(self._request(call))
        call.future.add_done_callback(lambda future: self._finishers.submit(self._finish, call, future))
        return StepOutcome("waiting", "model call in flight")

    async def _request(self, call: _InFlight) -> ModelReply:
        prepared = call.prepared
        assert prepared.model_request is not None
        settings = self.rt.settings
        if not settings.model_stream:
            return await self.client.create(prepared.model_request)
        loop = self.loop.loop
        stream = self.client.stream
        if settings.model_background:
            background = Background(prepared.response_id, lambda response_id: self._created(call, response_id))
            stream = functools.partial(self.client.stream, background=background)
        return await stream_reply_async(
            stream,
            prepared.model_request,
            self._publish_to(call),
            step=prepared.step,
            interval=settings.stream_flush_ms / 1000,
            schedule=lambda delay, fn: loop.call_later(delay, fn).cancel,
            rest=call.rest,
            on_first=metrics.FIRST_TOKEN_SECONDS.labels(prepared.model).observe,
        )

    def _created(self, call: _InFlight, response_id: str) -> None:
        """On the loop: the call's background response was created; record its id from a finisher
        thread (a Redis write, with its ``WAIT``, must not block the loop)."""
        call.response_id = response_id
        self._finishers.submit(self._record_response, call.prepared.turn_id, call.prepared.step, response_id)

    def _record_response(self, turn_id: str, step: int, response_id: str) -> None:
        try:
            self._waiting_out(lambda: self.rt.store.memo.note_response(turn_id, step, response_id), turn_id)
        except Exception:  # unrecorded, a re-driven step pays again: the window docs/failover.md describes
            log.exception("turn %s step %s: could not record background response %s", turn_id, step, response_id)

    def _publish_to(self, call: _InFlight) -> Publish:
        turn_id = call.prepared.turn_id

        def publish(events: list[tuple[str, dict[str, Any]]]) -> None:
            call.published = self._publisher.submit(self._append, turn_id, events)

        return publish

    def _append(self, turn_id: str, events: list[tuple[str, dict[str, Any]]]) -> None:
        try:
            self.rt.store.add_events(turn_id, events)
        except Exception:  # deltas are a view; the memoized reply is the record
            log.warning("could not publish %d model deltas of turn %s", len(events), turn_id, exc_info=True)

    def _watch_cancels(self) -> None:
        """On its own thread until ``close``: every ``model_cancel_poll`` s, while calls are in
        flight, abort those whose turn was cancelled (``_abort``; one round trip for all)."""
        while not self._closed.wait(self.rt.settings.model_cancel_poll):
            with self._lock:
                calls = [c for c in self._in_flight if not c.aborted]
            if not calls:
                continue
            try:
                cancelled = self.rt.store.cancelled_of(sorted({c.prepared.turn_id for c in calls}))
            except OUTAGE_ERRORS:
                continue  # Redis away: the reply's own read of the flag ends the turn once it is back
            except Exception:  # the watch must outlive any one failure
                log.exception("could not read the cancel flags of %d model calls", len(calls))
                continue
            for call in calls:
                if call.prepared.turn_id in cancelled:
                    self._abort(call)

    def _abort(self, call: _InFlight) -> None:
        """Cancel ``call``'s request (the loop's task: its connection is closed) for its finisher to
        end the turn ``cancelled``; nothing when the call already ended or ``drain`` took it (the
        lock orders this against ``drain``'s own cancel)."""
        with self._lock:
            future = call.future
            if call not in self._in_flight or future is None or future.done():
                return
            call.aborted = True  # before cancel(): its done callback hands the call to a finisher
            if not future.cancel():  # it ended meanwhile: the reply is handled as any other
                call.aborted = False
                return
        if call.response_id:  # a background response goes on without its client: stop it by id
            self.loop.submit(self.client.cancel(call.response_id))

    def _finish(self, call: _InFlight, future: concurrent.futures.Future[ModelReply]) -> None:
        """On a finisher thread: store and handle the reply, or retry or end the turn; inside the
        step's trace (``telemetry.reply_span``)."""
        if future.cancelled() and not call.aborted:  # drained: ``drain`` published the step again
            return
        prepared = call.prepared
        try:
            with telemetry.reply_span(call.context, prepared.turn_id, prepared.request.agent_id, prepared.step):
                if future.cancelled():
                    self._end_aborted(call)
                else:
                    self._settle(call, future)
        finally:
            self._done(call)

    def _end_aborted(self, call: _InFlight) -> None:
        """The turn of an aborted call ends ``cancelled``, as a step that finds the flag ends it."""
        turn_id, step = call.prepared.turn_id, call.prepared.step
        telemetry.end_model_call_span(call.span, RuntimeError("the turn was cancelled during the call"))
        log.info("turn %s step %s: model call aborted, the turn was cancelled", turn_id, step)
        self._give_up(turn_id, CANCELLED + " during its model call", TurnStatus.cancelled)

    def _settle(self, call: _InFlight, future: concurrent.futures.Future[ModelReply]) -> None:
        prepared = call.prepared
        turn_id, step = prepared.turn_id, prepared.step
        if call.published is not None:  # the deltas reach the events before the reply does
            concurrent.futures.wait([call.published])
        error = future.exception()
        result: ModelReply | BaseException = error if error is not None else future.result()
        try:
            call.finish(prepared, result, time.perf_counter() - call.started, call.span, call.rest)
        except GatewayError as exc:  # retryable; the claim is free
            self._retry(call, exc)
        except OUTAGE_ERRORS as exc:
            log.error("turn %s step %s: Redis did not come back (%s); the watchdog re-drives it", turn_id, step, exc)
        except Exception as exc:  # never leave a turn hanging on a bug: end it with the reason
            log.exception("turn %s step %s crashed after its model call", turn_id, step)
            self._give_up(turn_id, f"internal error in step {step}: {exc.__class__.__name__}: {exc}")

    def _retry(self, call: _InFlight, exc: GatewayError) -> None:
        prepared = call.prepared
        turn_id, step, error = prepared.turn_id, prepared.step, str(exc)
        if call.retries >= MAX_MODEL_RETRIES:
            self._give_up(turn_id, f"model gateway failed after retries: {error}")
            return
        delay = retry_delay(call.retries)
        self._waiting_out(lambda: note_retry(self.rt.store, self.rt.settings, turn_id, step, error, delay), turn_id)
        self._waiting_out(
            lambda: self.edge.retry(
                turn_id, step, queue=prepared.request.queue, countdown=delay, retries=call.retries + 1
            ),
            turn_id,
        )

    def _give_up(self, turn_id: str, error: str, status: TurnStatus = TurnStatus.failed) -> None:
        self._waiting_out(lambda: self.end.fail(turn_id, status, error), turn_id)

    def _waiting_out(self, run: Callable[[], object], turn_id: str) -> None:
        try:
            until_redis_answers(run, what=f"turn {turn_id}", timeout=self.rt.settings.redis_outage_timeout)
        except OUTAGE_ERRORS as exc:
            log.error("turn %s: Redis did not come back (%s); the watchdog re-drives it", turn_id, exc)

    def _done(self, call: _InFlight) -> None:
        try:
            self.edge.end(call.prepared.turn_id, call.prepared.step)
        finally:
            with self._lock:
                self._in_flight.discard(call)
                # Breaks the cycle call -> future -> its done callback -> call: the call, its
                # prepared step and its reply are freed now, not at the next full collection (a
                # few per run with the worker's thresholds, ``tasks.app.GC_THRESHOLDS``), which
                # left a first wave of calls alive while the second allocated.
                call.future = call.published = None
                if not self._in_flight:
                    self._idle.notify_all()

    def drain(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the calls in flight; free the claims of those still
        running and publish their steps again (another node makes the call). Their number."""
        with self._lock:
            self._idle.wait_for(lambda: not self._in_flight, timeout=max(0.0, timeout))
            left = [c for c in self._in_flight if c.future is not None and c.future.cancel()]
        for call in left:
            prepared = call.prepared
            turn_id, step = prepared.turn_id, prepared.step
            telemetry.end_model_call_span(call.span, RuntimeError("worker shut down during the call"))
            self.rt.store.claims.release_step(turn_id, step, prepared.owner)
            label = step_label(prepared.request.agent_id, turn_id, step)
            with telemetry.under_turn(prepared.state.traceparent):
                self._waiting_out(
                    lambda: self.rt.dispatcher.enqueue_step(turn_id, step, queue=prepared.request.queue, label=label),  # noqa: B023
                    turn_id,
                )
            self._done(call)
        return len(left)

    def close(self) -> None:
        """Stop the cancel watch, and the finisher and publisher threads once their work is done."""
        self._closed.set()
        self._finishers.shutdown(wait=True)
        self._publisher.shutdown(wait=True)
