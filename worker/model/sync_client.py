"""The synchronous model client: one class for every wire API, a thread per call.

``SyncModelClient(wire, base_url, ...)`` makes calls of one wire API (``worker.model.wire_format``:
an entry of ``worker.model.wire_styles.WIRE_STYLES``, ``responses.RESPONSES`` or ``chat.CHAT``)
over httpx, through the HTTP side every synchronous call shares (``worker.model.http_pool.ModelHTTP``:
a keep-alive pool per thread, one retry rule). It is a ``ModelClient`` (``worker.model.interface``);
its asynchronous twin, on the same wire formats, is ``worker.model.async_client.AsyncModelClient``.

``worker.model.clients.model_client(settings)`` builds the client of ``OPENAI_API_STYLE``.
"""

from __future__ import annotations

import httpx

from worker.model.http_pool import MAX_REPLY_BYTES, ModelHTTP
from worker.model.interface import ModelReply, ModelRequest, OnDelta
from worker.model.wire_format import WireFormat


class SyncModelClient:
    """Model calls of ``wire`` at ``base_url`` (like ``https://api.openai.com/v1``); implements
    ``ModelClient``.

    ``timeout`` and ``connect_timeout`` in seconds (a read timeout: the longest wait for the next
    bytes); ``max_connections`` bounds the connections of each thread's pool; ``max_reply_bytes``
    caps one answer as read (``worker.model.http_pool.ReplySize``). The API key is sent as a bearer
    token and never logged. Each thread gets its own ``httpx.Client`` (``worker.model.http_pool``
    says why); ``transport``, when given, is shared by every thread's client (tests). Reuse one
    instance per process.
    """

    def __init__(
        self,
        wire: WireFormat,
        base_url: str,
        api_key: str = "",
        *,
        timeout: float = 120.0,
        connect_timeout: float = 10.0,
        max_connections: int = 100,
        transport: httpx.BaseTransport | None = None,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.wire = wire
        self._http = ModelHTTP(
            base_url,
            api_key,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
            transport=transport,
            max_reply_bytes=max_reply_bytes,
        )

    def close(self) -> None:
        """Close every thread's pooled connections."""
        self._http.close()

    def create(self, request: ModelRequest) -> ModelReply:
        """POST the request to ``wire.path``; the parsed reply. Raises ``GatewayError``
        (``retryable`` as ``ModelHTTP`` says; not retryable when the wire cannot express the request)."""
        return self._http.create(self.wire, request)

    def stream(self, request: ModelRequest, on_delta: OnDelta) -> ModelReply:
        """POST the request's streamed body; ``on_delta`` gets each text or arguments piece. The
        reply of the terminal event (or of a plain JSON body). Raises ``GatewayError``."""
        return self._http.stream(self.wire, request, on_delta)
