"""The OpenAI Responses API as a wire format: ``RESPONSES`` (``worker.model.wire_format.WireFormat``).

A call posts ``responses_body(request)`` to ``{base_url}/responses`` and parses a ``ModelReply``
(``parse_response``); a streamed call posts it with ``stream: true`` and reads the server-sent
events with ``ResponsesStream``. Either model client drives it (``worker.model.sync_client``,
``worker.model.async_client``). It works unchanged against api.openai.com, any OpenAI-compatible
Responses endpoint, and the project's scripted gateway (``devtools.scripted_gateway``).

Streaming event names and shapes: OpenAI Responses API, "Streaming events" (``response.created``,
``response.output_item.added``/``done``, ``response.output_text.delta``,
``response.function_call_arguments.delta``, ``response.completed``, ``response.incomplete``,
``response.failed``, ``error``); every event carries ``type`` and ``sequence_number``, and there is
no ``[DONE]`` sentinel. An endpoint that answers a streamed request with a plain JSON body (no
streaming support) is read as such. llama.cpp's server reports a failure mid-stream as a bare
``{"error": {"code", "message", "type"}}`` object (no ``type`` of the event's own): read as an
``error`` event whose code is the error's ``type``.

Failures (``GatewayError``): transport errors, timeouts, HTTP 408/409/429/5xx, a malformed body,
a stream cut before its terminal event and an ``error`` event are retryable; other 4xx,
``status: failed`` and ``response.failed`` are not.
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.model.interface import Delta, GatewayError, ModelReply, ModelRequest, OnDelta
from worker.model.wire_format import WireFormat

# ``error`` event codes that a retry cannot fix.
_FATAL_CODES = {"invalid_request_error", "invalid_prompt", "context_length_exceeded", "invalid_api_key"}


def responses_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /responses`` (a ``ResponseCreateParams``) for ``request``."""
    body: dict[str, Any] = {"model": request.model, "input": request.input, "store": False}
    if request.tools:
        body["tools"] = request.tools
        body["parallel_tool_calls"] = True
    if request.instructions:
        body["instructions"] = request.instructions
    if request.max_output_tokens:
        body["max_output_tokens"] = request.max_output_tokens
    if request.metadata:
        body["metadata"] = request.metadata
    return body


# Events named so by their ``event:`` line carry nothing the reply needs (the terminal event holds
# the whole response): their JSON is not parsed. ``response.created`` and ``response.in_progress``
# echo the request's tools and instructions, the largest events of a stream.
_UNREAD_EVENTS = frozenset(
    {
        "response.created",
        "response.in_progress",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.done",
        "response.function_call_arguments.done",
    }
)


class ResponsesStream:
    """A ``StreamReader`` (``worker.model.wire_format``) of a Responses event stream: reports text
    and arguments deltas to ``on_delta``; the terminal event (``response.completed``,
    ``response.incomplete``, ``response.failed``) gives the reply."""

    def __init__(self, on_delta: OnDelta):
        self.on_delta = on_delta
        self.calls: dict[int, tuple[str | None, str | None]] = {}  # output_index -> (call_id, name)

    def feed(self, event: str, data: str) -> ModelReply | None:
        """One event; the reply at the terminal event. Raises ``GatewayError``."""
        if not data or data == "[DONE]" or event in _UNREAD_EVENTS:
            return None
        try:
            parsed = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise GatewayError("model stream sent a non-JSON event", retryable=True) from exc
        if not isinstance(parsed, dict):
            raise GatewayError("model stream sent an event that is not an object", retryable=True)
        if "type" not in parsed and isinstance(parsed.get("error"), dict):
            error = parsed["error"]  # llama.cpp's shape (module docstring)
            parsed = {"type": "error", "code": error.get("type") or error.get("code"), "message": error.get("message")}
        kind = parsed.get("type") or event
        index = parsed.get("output_index", 0)
        if kind == "response.output_item.added":
            item = parsed.get("item") or {}
            if item.get("type") == "function_call":
                self.calls[index] = (item.get("call_id"), item.get("name"))
        elif kind == "response.output_text.delta":
            self.on_delta(Delta("text", index, str(parsed.get("delta") or "")))
        elif kind == "response.function_call_arguments.delta":
            call_id, name = self.calls.get(index, (None, None))
            self.on_delta(Delta("arguments", index, str(parsed.get("delta") or ""), call_id, name))
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            return parse_response(parsed.get("response"))  # response.failed raises, not retryable
        elif kind == "error":
            code = parsed.get("code") or ""
            raise GatewayError(
                f"model stream error {code}: {parsed.get('message', '')}"[:500], retryable=code not in _FATAL_CODES
            )
        return None

    def end(self) -> ModelReply:
        """A Responses stream always ends with a terminal event: raises ``GatewayError`` (retryable)."""
        raise GatewayError("model stream ended before response.completed", retryable=True)


def _parse_body(content: bytes) -> ModelReply:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("model gateway sent a non-JSON body", retryable=True) from exc
    return parse_response(data)


_ITEM_FIELDS = {"function_call": ("call_id", "name", "arguments")}


def parse_response(data: Any) -> ModelReply:
    """Check a Responses API body's shape and parse it.

    Raises ``GatewayError`` for ``status: failed`` (not retryable), and for a body that is
    not a response object: not an object, ``output`` not a list of objects, a
    ``function_call`` whose ``name`` / ``call_id`` / ``arguments`` are not strings (a
    malformed 200 is retried like a 5xx: a gateway glitch, not the model's answer; ``arguments``
    missing or null is taken as ``""``: ``worker.model.items.normalize_reply_calls``), or
    ``status`` ``in_progress`` / ``queued`` (background mode is not used).
    """
    if not isinstance(data, dict):
        raise GatewayError(
            f"model gateway sent a malformed response: a JSON {type(data).__name__}, not a response object",
            retryable=True,
        )
    status = data.get("status") or "completed"
    if status == "failed":
        err = data.get("error") or {}
        msg = err.get("message", err) if isinstance(err, dict) else err
        raise GatewayError(f"model response failed: {msg}", retryable=False)
    if status in ("in_progress", "queued"):
        raise GatewayError(f"model gateway sent an unfinished response (status {status})", retryable=True)
    output = data.get("output")
    if output is None:
        output = []
    if not isinstance(output, list) or not all(isinstance(i, dict) for i in output):
        raise GatewayError("model gateway sent a malformed response: output is not a list of items", retryable=True)
    for item in output:
        for key in _ITEM_FIELDS.get(item.get("type"), ()):
            value = item.get(key)
            if key == "call_id" and value is None:
                continue  # a missing call_id gets a placeholder (worker.model.items.normalize_reply_calls)
            if key == "arguments" and value is None:
                continue  # no arguments at all (Gemini omits them): "" (worker.model.items.normalize_reply_calls)
            if not isinstance(value, str):
                raise GatewayError(
                    f"model gateway sent a malformed function_call: {key} is {type(value).__name__}, not a string",
                    retryable=True,
                )
    return ModelReply.from_json(data)


def _stream_body(request: ModelRequest) -> dict[str, Any]:
    return {**responses_body(request), "stream": True}


RESPONSES = WireFormat("/responses", responses_body, _stream_body, _parse_body, ResponsesStream)
"""The Responses API as a ``WireFormat`` (``WIRE_STYLES["responses"]``; both transports drive it)."""
