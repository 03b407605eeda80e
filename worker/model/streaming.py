"""The model's output as it is written: Responses API streaming (server-sent events) and delta batching.

``stream_reply(client, body, publish, step=...)`` posts the request with ``stream: true``
(``httpx-sse``), hands every ``response.output_text.delta`` and
``response.function_call_arguments.delta`` to a ``DeltaBatcher``, and returns the same
``ModelReply`` as ``ResponsesClient.create`` once ``response.completed`` (or
``response.incomplete``) arrives, so the reply is memoized exactly as before. An endpoint
that answers a plain JSON body (no streaming support) works unchanged.

Event names and shapes: OpenAI Responses API, "Streaming events" (``response.created``,
``response.output_item.added``/``done``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ``response.completed``, ``response.incomplete``,
``response.failed``, ``error``); every event carries ``type`` and ``sequence_number``, and
there is no ``[DONE]`` sentinel.

Failures (``GatewayError``): a stream cut before its terminal event, a transport error, or an
``error`` event are retryable (the queue layer retries the step with backoff; the deltas of
the broken attempt stay in the event stream, tagged with their ``attempt``);
``response.failed`` is not (same rule as ``status: failed`` in a JSON body).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any, Callable

import httpx
import orjson
from httpx_sse import connect_sse

from worker.model.client import GatewayError, ModelReply, ResponsesClient, parse_response

log = logging.getLogger("agent.model")

Publish = Callable[[list[tuple[str, dict[str, Any]]]], None]
OnDelta = Callable[[str, int, str, dict[str, Any]], None]

# ``error`` event codes that a retry cannot fix.
_FATAL_CODES = {"invalid_request_error", "invalid_prompt", "context_length_exceeded", "invalid_api_key"}


class DeltaBatcher:
    """Collects deltas and publishes them as ``model_delta`` events at most every ``interval`` seconds.

    The first delta is published at once (time to first token), later ones are joined while
    they belong to the same output item and kind, and a timer publishes what is pending when
    the model pauses. ``publish([(kind, fields)])`` appends events (one Redis round trip);
    its failures are logged, never raised: deltas are a view, the memoized reply is the record.

    Event fields: ``step``, ``attempt`` (one id per model call, so a reader can tell a retried
    call's deltas apart), ``seq`` (0, 1, ... per attempt), ``type`` (``text`` | ``arguments``),
    ``output_index``, ``delta``, and for arguments ``call_id`` and ``name``.
    """

    def __init__(self, publish: Publish, *, step: int, interval: float = 0.04):
        self.publish = publish
        self.step = step
        self.interval = interval
        self.attempt = uuid.uuid4().hex[:8]
        self.seq = 0
        self.published = 0  # events published
        self._pending: list[dict[str, Any]] = []
        self._last = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def add(self, kind: str, output_index: int, delta: str, extra: dict[str, Any]) -> None:
        """Queue one delta (``kind`` ``text`` or ``arguments``); publishes when the interval has passed."""
        if not delta:
            return
        with self._lock:
            last = self._pending[-1] if self._pending else None
            if last and last["type"] == kind and last["output_index"] == output_index:
                last["delta"] += delta
            else:
                self._pending.append({"type": kind, "output_index": output_index, "delta": delta, **extra})
            due = time.monotonic() - self._last >= self.interval
            if due:
                self._flush_locked()
            elif self._timer is None:
                self._timer = threading.Timer(self.interval, self.flush)
                self._timer.daemon = True
                self._timer.start()

    def flush(self) -> None:
        """Publish what is pending now."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        events = []
        for d in self._pending:
            events.append(("model_delta", {"step": self.step, "attempt": self.attempt, "seq": self.seq, **d}))
            self.seq += 1
        self._pending = []
        self._last = time.monotonic()
        try:
            self.publish(events)
            self.published += len(events)
        except Exception:  # a lost delta is cosmetic; the reply is memoized whole
            log.warning("could not publish %d model deltas", len(events), exc_info=True)

    def close(self) -> None:
        """Publish the rest and stop the timer."""
        self.flush()


def _status_error(resp: httpx.Response) -> GatewayError:
    retryable = resp.status_code in (408, 409, 429) or resp.status_code >= 500
    return GatewayError(
        f"model gateway answered HTTP {resp.status_code}: {resp.text[:500]}",
        retryable=retryable,
        status_code=resp.status_code,
    )


def create_streaming(client: ResponsesClient, body: dict[str, Any], on_delta: OnDelta) -> ModelReply:
    """POST ``body`` with ``stream: true``; call ``on_delta(kind, output_index, delta, extra)`` per delta.

    Returns the ``ModelReply`` of the terminal event (or of a plain JSON body). Raises ``GatewayError``.
    """
    calls: dict[int, dict[str, Any]] = {}
    try:
        with connect_sse(client.http, "POST", "/responses", content=orjson.dumps({**body, "stream": True})) as source:
            resp = source.response
            if resp.status_code >= 400:
                resp.read()
                raise _status_error(resp)
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                resp.read()  # an endpoint without streaming answered the whole response
                try:
                    return parse_response(orjson.loads(resp.content))
                except orjson.JSONDecodeError as exc:
                    raise GatewayError("model gateway sent a non-JSON body", retryable=True) from exc
            events = source.iter_sse()
            for sse in events:
                if not sse.data or sse.data == "[DONE]":
                    continue
                try:
                    event = orjson.loads(sse.data)
                except orjson.JSONDecodeError as exc:
                    raise GatewayError("model stream sent a non-JSON event", retryable=True) from exc
                kind = event.get("type") or sse.event
                if kind == "response.output_item.added":
                    item = event.get("item") or {}
                    if item.get("type") == "function_call":
                        calls[event.get("output_index", 0)] = {"call_id": item.get("call_id"), "name": item.get("name")}
                elif kind == "response.output_text.delta":
                    on_delta("text", event.get("output_index", 0), str(event.get("delta") or ""), {})
                elif kind == "response.function_call_arguments.delta":
                    idx = event.get("output_index", 0)
                    on_delta("arguments", idx, str(event.get("delta") or ""), calls.get(idx, {}))
                elif kind in ("response.completed", "response.incomplete", "response.failed"):
                    reply = parse_response(event.get("response"))  # response.failed raises, not retryable
                    for _ in events:  # read to the stream's end: a keep-alive connection goes back to the pool
                        pass
                    return reply
                elif kind == "error":
                    code = event.get("code") or ""
                    raise GatewayError(
                        f"model stream error {code}: {event.get('message', '')}"[:500],
                        retryable=code not in _FATAL_CODES,
                    )
    except httpx.TimeoutException as exc:
        raise GatewayError(f"model stream timed out: {exc.__class__.__name__}", retryable=True) from exc
    except httpx.TransportError as exc:
        raise GatewayError(f"model stream broke: {exc.__class__.__name__}: {exc}", retryable=True) from exc
    raise GatewayError("model stream ended before response.completed", retryable=True)


def stream_reply(
    client: ResponsesClient, body: dict[str, Any], publish: Publish, *, step: int, interval: float = 0.04
) -> ModelReply:
    """``create_streaming`` with its deltas batched into ``publish`` (the turn's event stream).

    A broken stream publishes ``model_stream_broken`` (``step``, ``attempt``, ``error``) before
    the ``GatewayError`` propagates, so a reader can discard that attempt's partial text.
    """
    batcher = DeltaBatcher(publish, step=step, interval=interval)
    try:
        return create_streaming(client, body, batcher.add)
    except GatewayError as exc:
        batcher.close()
        if batcher.published:
            try:
                publish([("model_stream_broken", {"step": step, "attempt": batcher.attempt, "error": str(exc)[:300]})])
            except Exception:
                log.warning("could not publish model_stream_broken", exc_info=True)
        raise
    finally:
        batcher.close()
