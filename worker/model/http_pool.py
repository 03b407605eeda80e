"""One keep-alive ``httpx.Client`` per thread, for the model clients (Responses and Chat Completions).

httpcore's sync connection pool, shared by hundreds of threads, closes connections that another
thread was handed and is about to use or already uses (surplus keep-alive, keep-alive expiry;
encode/httpcore#1110): that thread either fails with ``EBADF`` or waits in a ``poll()`` that
nothing wakes until its read timeout. With one pool per thread, a pool's clean-up only ever
closes its own thread's idle connections (bench/README.md, "Keep-alive endpoint and the hung
model call"). Every thread's client shares one TLS context: loading the CA bundle costs about
10 ms, once per process.
"""

from __future__ import annotations

import ssl
import threading
from typing import Iterator

import certifi
import httpx
import orjson
from httpx_sse import ServerSentEvent, connect_sse

from worker.model.interface import GatewayError, ModelReply, ModelRequest, OnDelta
from worker.model.sse_lines import SSEEvents
from worker.model.wire_format import WireFormat, read_events


class ThreadClients:
    """``get()``: this thread's ``httpx.Client`` with ``base_url``, ``headers``, ``timeout`` and
    ``limits`` (per thread); ``transport``, when given, is shared by every thread's client (tests).
    ``close()`` closes every thread's connections."""

    def __init__(
        self,
        base_url: str,
        headers: dict[str, str],
        timeout: httpx.Timeout,
        limits: httpx.Limits,
        transport: httpx.BaseTransport | None = None,
    ):
        self._base_url = base_url
        self._headers = headers
        self._timeout = timeout
        self._limits = limits
        self._transport = transport
        self._tls: ssl.SSLContext | None = None
        self._local = threading.local()
        self._clients: list[httpx.Client] = []
        self._lock = threading.Lock()

    def get(self) -> httpx.Client:
        """This thread's client, made on its first call."""
        client: httpx.Client | None = getattr(self._local, "client", None)
        if client is None:
            with self._lock:
                if self._tls is None:
                    self._tls = ssl.create_default_context(cafile=certifi.where())
                client = httpx.Client(
                    base_url=self._base_url,
                    headers=self._headers,
                    timeout=self._timeout,
                    limits=self._limits,
                    transport=self._transport,
                    verify=self._tls,
                )
                self._clients.append(client)
            self._local.client = client
        return client

    def close(self) -> None:
        """Close every thread's pooled connections (a thread's next ``get()`` makes a new client)."""
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()
        self._local = threading.local()


class ModelHTTP:
    """The HTTP side every model client shares: bearer headers, one keep-alive pool per thread
    (``ThreadClients``), a JSON POST and a server-sent-events POST, and one mapping of failures to
    ``GatewayError``. ``base_url`` like ``https://api.openai.com/v1``; ``timeout`` and
    ``connect_timeout`` in seconds; ``max_connections`` per thread's pool.

    Retryable (``GatewayError.retryable``): transport errors and timeouts, HTTP 408, 409, 429 and
    5xx; any other 4xx is not (the request itself is wrong). The rule is the providers' own
    retry guidance (OpenAI's and Anthropic's API error docs), written down in docs/architecture.md.
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
        self.pool = ThreadClients(
            base_url.rstrip("/"),
            headers,
            httpx.Timeout(timeout, connect=connect_timeout),
            httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport,
        )

    def close(self) -> None:
        """Close every thread's pooled connections."""
        self.pool.close()

    def create(self, wire: WireFormat, request: ModelRequest) -> ModelReply:
        """POST ``wire.body(request)`` as JSON; the parsed answer. Raises ``GatewayError``."""
        try:
            resp = self.pool.get().post(wire.path, content=orjson.dumps(wire.body(request)))
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=False) from exc
        if resp.status_code >= 400:
            raise status_error(resp)
        return wire.parse(resp.content)

    def stream(self, wire: WireFormat, request: ModelRequest, on_delta: OnDelta) -> ModelReply:
        """POST ``wire.stream_body(request)`` and read the server-sent events with ``wire.reader``
        (``on_delta`` gets each piece); an endpoint that does not stream answers whole and is read
        with ``wire.parse``. Raises ``GatewayError``."""
        try:
            body = orjson.dumps(wire.stream_body(request))
            with connect_sse(self.pool.get(), "POST", wire.path, content=body) as source:
                resp = source.response
                if resp.status_code >= 400:
                    resp.read()
                    raise status_error(resp)
                if "text/event-stream" not in resp.headers.get("content-type", ""):
                    resp.read()  # an endpoint without streaming answered the whole reply
                    return wire.parse(resp.content)
                return read_events(_events(resp), wire.reader(on_delta))
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=True) from exc


def _events(resp: httpx.Response) -> Iterator[ServerSentEvent | None]:
    """The response's server-sent events (``SSEEvents``: not httpx's ``iter_lines``, which also
    splits at U+2028 inside an event), a None for each line that completes none."""
    events = SSEEvents()
    for chunk in resp.iter_bytes():
        yield from events.feed(chunk)
    yield from events.close()


def transport_error(exc: httpx.HTTPError, *, streamed: bool) -> GatewayError:
    """The ``GatewayError`` (retryable) of a failed httpx exchange (``transport_failure``)."""
    return transport_failure(exc, streamed=streamed, timed_out=isinstance(exc, httpx.TimeoutException))


def transport_failure(exc: BaseException, *, streamed: bool, timed_out: bool) -> GatewayError:
    """The ``GatewayError`` (retryable) of a failed exchange, whatever the HTTP library: a timeout,
    a broken stream, or a gateway that could not be reached."""
    what = "model stream" if streamed else "model call"
    if timed_out:
        return GatewayError(f"{what} timed out: {exc.__class__.__name__}", retryable=True)
    if streamed:
        return GatewayError(f"model stream broke: {exc.__class__.__name__}: {exc}", retryable=True)
    return GatewayError(f"model gateway unreachable: {exc.__class__.__name__}: {exc}", retryable=True)


def status_error(resp: httpx.Response) -> GatewayError:
    """The ``GatewayError`` of an HTTP error answer (retryable per ``ModelHTTP``'s rule)."""
    return status_error_of(resp.status_code, resp.text)


def status_error_of(status: int, text: str) -> GatewayError:
    """The ``GatewayError`` of HTTP ``status`` with body ``text``: retryable for 408, 409, 429
    and 5xx (the providers' retry guidance, docs/architecture.md), not for any other 4xx."""
    retryable = status in (408, 409, 429) or status >= 500
    return GatewayError(f"model gateway answered HTTP {status}: {text[:500]}", retryable=retryable, status_code=status)
