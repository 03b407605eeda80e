"""The model's output as it is written: deltas batched into the turn's event stream.

``stream_reply(client, request, publish, step=...)`` makes the call through ``ModelClient.stream``
(``worker.model.interface``), hands every ``Delta`` to a ``DeltaBatcher`` and returns the same
``ModelReply`` as ``create`` would, so the reply is memoized exactly as a plain call's. Nothing here
depends on the wire API: the client parses its own stream.

A stream that breaks raises the client's ``GatewayError`` (retryable: the queue layer retries the
step with backoff); the deltas of the broken attempt stay in the event stream, tagged with their
``attempt``, and a ``model_stream_broken`` event tells a reader to discard them.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Awaitable, Callable

from worker.model.interface import Delta, GatewayError, ModelClient, ModelReply, ModelRequest, OnDelta
from worker.tooling.oversized import cut_call_id, cut_name

log = logging.getLogger("agent.model")

STREAMED_ARGUMENTS_CHARS = 2_000
"""Characters of one call's arguments streamed as ``model_delta`` events (the same preview an
``approval_requested`` event gives); the rest is in the call's ``function_call`` item."""

Publish = Callable[[list[tuple[str, dict[str, Any]]]], None]
# ``schedule(delay_s, fn)`` runs ``fn()`` after ``delay_s`` seconds; it returns the cancel.
Schedule = Callable[[float, Callable[[], None]], Callable[[], Any]]


def thread_timer(delay: float, fn: Callable[[], None]) -> Callable[[], Any]:
    """``Schedule`` on a ``threading.Timer`` (a synchronous call; its deltas arrive on a worker thread)."""
    timer = threading.Timer(delay, fn)
    timer.daemon = True
    timer.start()
    return timer.cancel


class DeltaBatcher:
    """Collects deltas and publishes them as ``model_delta`` events at most every ``interval`` seconds.

    The first delta is published at once (time to first token), later ones are joined while
    they belong to the same output item and kind, and a timer publishes what is pending when
    the model pauses.

    With ``defer`` (an event loop's ``schedule``; the call begins when the batcher is made):
    - the interval also runs from the call's start, so the first delta waits only when it comes
      sooner than ``interval`` after the request (a hosted model's first token comes later than
      40 ms); a reply that completes within the interval costs no round trip of its own: its
      deltas are still pending (``take``) and go with the reply;
    - what is due is published when the caller next yields to the loop (``schedule(0, ...)``),
      not inside ``add``: the deltas of one network read are parsed first.

    ``publish([(kind, fields)])`` appends events (one Redis round trip); its failures are
    logged, never raised: deltas are a view, the memoized reply is the record.

    Event fields: ``step``, ``attempt`` (one id per model call, so a reader can tell a retried
    call's deltas apart), ``seq`` (0, 1, ... per attempt), ``type`` (``text`` | ``arguments``),
    ``output_index``, ``delta``, and for arguments ``call_id`` and ``name``, as the reply keeps
    them (``worker.tooling.oversized``: an oversized one is its short placeholder).

    A call's arguments are streamed up to ``STREAMED_ARGUMENTS_CHARS`` characters; the delta where
    they stop is marked ``cut: true`` and the rest is not streamed: the events are a view of the reply,
    and arguments can be megabytes (the call's arguments are in its ``function_call`` item).
    """

    def __init__(
        self,
        publish: Publish,
        *,
        step: int,
        interval: float = 0.04,
        schedule: Schedule = thread_timer,
        defer: bool = False,
        on_first: Callable[[float], Any] | None = None,
    ):
        self.publish = publish
        self.on_first = on_first  # called once with the seconds from the call's start to its first delta
        self._began = time.monotonic()
        self.schedule = schedule
        self.defer = defer
        self.step = step
        self.interval = interval
        self.attempt = uuid.uuid4().hex[:8]
        self.seq = 0
        self.published = 0  # events published
        self._pending: list[dict[str, Any]] = []
        self._last = time.monotonic() if defer else 0.0  # when deltas were last published
        self._cancel: Callable[[], Any] | None = None
        self._due = False  # a publish at 0 s is scheduled (``defer``)
        self._lock = threading.Lock()
        self._streamed: dict[int, int] = {}  # output index -> argument characters streamed
        self._names: dict[int, tuple[str | None, str | None]] = {}  # output index -> (call_id, name) as kept

    def add(self, delta: Delta) -> None:
        """Queue one delta; publishes when the interval has passed."""
        if not delta.text:
            return
        if self.on_first is not None:
            first, self.on_first = self.on_first, None
            first(time.monotonic() - self._began)
        with self._lock:
            text, cut = (delta.text, False) if delta.kind == "text" else self._argument_text(delta)
            if text is None:
                return
            last = self._pending[-1] if self._pending else None
            if last and last["type"] == delta.kind and last["output_index"] == delta.output_index:
                last["delta"] += text
            else:
                event: dict[str, Any] = {"type": delta.kind, "output_index": delta.output_index, "delta": text}
                if delta.kind == "arguments":
                    call_id, name = self._kept_names(delta)
                    event.update(call_id=call_id, name=name)
                self._pending.append(event)
            if cut:
                self._pending[-1]["cut"] = True
            wait = self._last + self.interval - time.monotonic()
            if wait <= 0 and not self.defer:
                self._flush_locked()
            elif wait <= 0 and not self._due:  # publish once the caller yields to the loop
                if self._cancel is not None:
                    self._cancel()
                self._due = True
                self._cancel = self.schedule(0.0, self.flush)
            elif self._cancel is None:
                self._cancel = self.schedule(max(wait, 0.0), self.flush)

    def _argument_text(self, delta: Delta) -> tuple[str | None, bool]:
        """What is streamed of an arguments delta, and whether the call's arguments are cut there:
        all of it up to the call's ``STREAMED_ARGUMENTS_CHARS``; past them, the first piece left
        out is an empty delta marked ``cut`` (or the piece's beginning that fits, marked), then
        nothing (``(None, False)``)."""
        done = self._streamed.get(delta.output_index, 0)
        if done > STREAMED_ARGUMENTS_CHARS:  # marked cut already
            return None, False
        left = STREAMED_ARGUMENTS_CHARS - done
        if len(delta.text) <= left:
            self._streamed[delta.output_index] = done + len(delta.text)
            return delta.text, False
        self._streamed[delta.output_index] = STREAMED_ARGUMENTS_CHARS + 1
        return delta.text[:left], True

    def _kept_names(self, delta: Delta) -> tuple[str | None, str | None]:
        """The delta's ``call_id`` and ``name`` as the reply keeps them (computed once per call)."""
        kept = self._names.get(delta.output_index)
        if kept is None or (kept[0] is None and delta.call_id is not None):
            call_id = cut_call_id(delta.call_id) if delta.call_id is not None else None
            kept = self._names[delta.output_index] = (call_id, cut_name(delta.name) if delta.name is not None else None)
        return kept

    def flush(self) -> None:
        """Publish what is pending now."""
        with self._lock:
            self._flush_locked()

    def take(self) -> list[tuple[str, dict[str, Any]]]:
        """Stop the timer and return the pending deltas as events, unpublished: the caller
        appends them (they count as published)."""
        with self._lock:
            events = self._cut()
        self.published += len(events)
        return events

    def _cut(self) -> list[tuple[str, dict[str, Any]]]:
        if self._cancel is not None:
            self._cancel()
            self._cancel = None
        self._due = False
        events: list[tuple[str, dict[str, Any]]] = []
        for d in self._pending:
            events.append(("model_delta", {"step": self.step, "attempt": self.attempt, "seq": self.seq, **d}))
            self.seq += 1
        self._pending = []
        return events

    def _flush_locked(self) -> None:
        events = self._cut()
        if not events:
            return
        self._last = time.monotonic()
        try:
            self.publish(events)
            self.published += len(events)
        except Exception:  # a lost delta is cosmetic; the reply is memoized whole
            log.warning("could not publish %d model deltas", len(events), exc_info=True)

    def close(self) -> None:
        """Publish the rest and stop the timer."""
        self.flush()


def stream_reply(
    client: ModelClient,
    request: ModelRequest,
    publish: Publish,
    *,
    step: int,
    interval: float = 0.04,
    on_first: Callable[[float], Any] | None = None,
) -> ModelReply:
    """``client.stream(request)`` with its deltas batched into ``publish`` (the turn's event stream).
    ``on_first(seconds)``: called once, at the first delta, with the time since the request (time to
    first token).

    A broken stream publishes ``model_stream_broken`` (``step``, ``attempt``, ``error``) before
    the ``GatewayError`` propagates, so a reader can discard that attempt's partial text.
    """
    batcher = DeltaBatcher(publish, step=step, interval=interval, on_first=on_first)
    try:
        return client.stream(request, batcher.add)
    except GatewayError as exc:
        _broken(batcher, exc)
        raise
    finally:
        batcher.close()


async def stream_reply_async(
    stream: Callable[[ModelRequest, OnDelta], Awaitable[ModelReply]],
    request: ModelRequest,
    publish: Publish,
    *,
    step: int,
    interval: float,
    schedule: Schedule,
    rest: list[tuple[str, dict[str, Any]]] | None = None,
    on_first: Callable[[float], Any] | None = None,
) -> ModelReply:
    """``stream_reply`` for a coroutine call (``AsyncModelClient.stream``): the batcher's timer is
    ``schedule`` (the event loop's), and ``publish`` must not block the loop (hand it on).
    ``rest``: when the reply is complete, the deltas not yet published are put there instead, for
    the caller to append with the reply in the same round trip (after those published)."""
    batcher = DeltaBatcher(publish, step=step, interval=interval, schedule=schedule, defer=True, on_first=on_first)
    try:
        reply = await stream(request, batcher.add)
    except GatewayError as exc:
        _broken(batcher, exc)
        raise
    except BaseException:
        batcher.close()
        raise
    if rest is None:
        batcher.close()
    else:
        rest.extend(batcher.take())
    return reply


def _broken(batcher: DeltaBatcher, exc: GatewayError) -> None:
    batcher.close()
    if batcher.published:
        try:
            batcher.publish(
                [("model_stream_broken", {"step": batcher.step, "attempt": batcher.attempt, "error": str(exc)[:300]})]
            )
        except Exception:
            log.warning("could not publish model_stream_broken", exc_info=True)
