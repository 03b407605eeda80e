"""A client for the OpenAI Responses API over httpx.

``ResponsesClient.create(...)`` posts ``{base_url}/responses`` with
``model``, ``instructions``, ``input`` items and ``tools`` and returns a
``ModelReply``. It works unchanged against api.openai.com, any
OpenAI-compatible Responses endpoint, and the project's scripted gateway.
"""

from __future__ import annotations

import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

import certifi
import httpx
import orjson

from worker.model.items import assistant_text, function_calls


class GatewayError(RuntimeError):
    """The model call failed.

    ``retryable`` is true for transport errors, timeouts, HTTP 408/409/429 and
    5xx (worth retrying with backoff); false for other 4xx (the request is wrong).
    ``status_code`` is the HTTP status or None for transport errors.
    """

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code


@dataclass
class ModelReply:
    """One Responses API reply.

    - ``status``: ``completed`` or ``incomplete`` (stopped at the output-token
      limit; see ``incomplete_details``) or ``failed``.
    - ``output``: the output items as sent by the API (dicts).
    - ``usage``: token counts as sent.
    """

    id: str
    status: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] = field(default_factory=dict)
    incomplete_reason: str | None = None

    @property
    def function_calls(self) -> list[dict[str, Any]]:
        """The reply's ``function_call`` items in emitted order."""
        return function_calls(self.output)

    @property
    def text(self) -> str:
        """The assistant's text (concatenated ``output_text`` parts)."""
        return assistant_text(self.output)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the per-step memo in Redis."""
        return {
            "id": self.id,
            "status": self.status,
            "output": self.output,
            "usage": self.usage,
            "incomplete_reason": self.incomplete_reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ModelReply":
        """Parse a Responses API response body (or our memo) into a ``ModelReply``."""
        status = data.get("status") or "completed"
        reason = data.get("incomplete_reason")
        if reason is None and isinstance(data.get("incomplete_details"), dict):
            reason = data["incomplete_details"].get("reason")
        return cls(
            id=str(data.get("id", "")),
            status=status,
            output=list(data.get("output") or []),
            usage=dict(data.get("usage") or {}),
            incomplete_reason=reason,
        )


class ResponsesClient:
    """Synchronous Responses API client.

    ``base_url`` like ``https://api.openai.com/v1``; ``timeout`` and ``connect_timeout`` in
    seconds; ``max_connections`` bounds the connections of each thread's pool. The API key is
    sent as a bearer token and never logged. Reuse one instance per process.

    Each thread gets its own ``httpx.Client`` (its own keep-alive pool; one TLS context for
    all): httpcore's sync pool, shared by hundreds of threads, closes connections that another
    thread was handed and is about to use or already uses (surplus keep-alive, keep-alive
    expiry; encode/httpcore#1110), and that thread either fails with ``EBADF`` or waits in a
    ``poll()`` that nothing wakes until its read timeout. With one pool per thread, a pool's
    clean-up only ever closes its own thread's idle connections. ``transport``, when given, is
    shared by every thread's client (tests).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str = "",
        *,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_connections: int = 100,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._settings: dict[str, Any] = {
            "base_url": base_url.rstrip("/"),
            "headers": headers,
            "timeout": httpx.Timeout(timeout, connect=connect_timeout),
            "limits": httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            "transport": transport,
        }
        self._tls: ssl.SSLContext | None = None
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    @property
    def http(self) -> httpx.Client:
        """This thread's ``httpx.Client`` (base URL and headers set): ``worker.model.streaming`` streams through it."""
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                if self._tls is None:  # loading the CA bundle costs ~10 ms: once per process, not per thread
                    self._tls = ssl.create_default_context(cafile=certifi.where())
                client = httpx.Client(verify=self._tls, **self._settings)
                self._clients.append(client)
            self._local.client = client
        return client

    def close(self) -> None:
        """Close every thread's pooled connections."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()

    def build_request(
        self,
        *,
        model: str,
        input: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        instructions: str | None = None,
        max_output_tokens: int | None = None,
        metadata: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """The JSON body of ``POST /responses`` (a ``ResponseCreateParams``)."""
        body: dict[str, Any] = {"model": model, "input": input, "store": False}
        if tools:
            body["tools"] = tools
            body["parallel_tool_calls"] = True
        if instructions:
            body["instructions"] = instructions
        if max_output_tokens:
            body["max_output_tokens"] = max_output_tokens
        if metadata:
            body["metadata"] = metadata
        return body

    def create(self, body: dict[str, Any]) -> ModelReply:
        """POST the request body; return the parsed reply. Raises ``GatewayError``."""
        try:
            resp = self.http.post("/responses", content=orjson.dumps(body))
        except httpx.TimeoutException as exc:
            raise GatewayError(f"model call timed out: {exc.__class__.__name__}", retryable=True) from exc
        except httpx.TransportError as exc:
            raise GatewayError(f"model gateway unreachable: {exc.__class__.__name__}: {exc}", retryable=True) from exc
        if resp.status_code >= 400:
            retryable = resp.status_code in (408, 409, 429) or resp.status_code >= 500
            detail = resp.text[:500]
            raise GatewayError(
                f"model gateway answered HTTP {resp.status_code}: {detail}",
                retryable=retryable,
                status_code=resp.status_code,
            )
        try:
            data = orjson.loads(resp.content)
        except orjson.JSONDecodeError as exc:
            raise GatewayError("model gateway sent a non-JSON body", retryable=True) from exc
        return parse_response(data)


_ITEM_FIELDS = {"function_call": ("call_id", "name", "arguments")}


def parse_response(data: Any) -> ModelReply:
    """Check a Responses API body's shape and parse it.

    Raises ``GatewayError`` for ``status: failed`` (not retryable), and for a body that is
    not a response object: not an object, ``output`` not a list of objects, a
    ``function_call`` whose ``name`` / ``call_id`` / ``arguments`` are not strings (a
    malformed 200 is retried like a 5xx: a gateway glitch, not the model's answer), or
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
            if not isinstance(value, str):
                raise GatewayError(
                    f"model gateway sent a malformed function_call: {key} is {type(value).__name__}, not a string",
                    retryable=True,
                )
    return ModelReply.from_json(data)
