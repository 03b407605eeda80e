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

from worker.model.content_decoding import ACCEPT_ENCODING, BoundedDecoder, ContentEncodingError, parse_content_encoding
from worker.model.interface import GatewayError, ModelReply, ModelRequest, OnDelta
from worker.model.sse_lines import SSEEvents
from worker.model.wire_format import WireFormat, read_events

# Cap on one model answer as read from the wire (bytes): the JSON body, or the whole event stream
# with its framing. The largest outputs (128k tokens) stream as about 25-30 MB of events; setting
# ``model_max_reply_bytes`` (``AGENT_MODEL_MAX_REPLY_BYTES``).
MAX_REPLY_BYTES = 64 * 1024 * 1024
# What is read of an error answer's body, for its message (which keeps 500 characters of it).
ERROR_TEXT_BYTES = 4096


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
    ``connect_timeout`` in seconds; ``max_connections`` per thread's pool; ``max_reply_bytes``:
    the cap on one answer as read (``ReplySize``).

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
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ):
        self.max_reply_bytes = max_reply_bytes
        headers = {"Content-Type": "application/json", "Accept-Encoding": ACCEPT_ENCODING}
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
        """POST ``wire.body(request)`` as JSON; the parsed answer. Raises ``GatewayError`` (not
        retryable for an answer above ``max_reply_bytes``)."""
        try:
            with self.pool.get().stream("POST", wire.path, content=orjson.dumps(wire.body(request))) as resp:
                if resp.status_code >= 400:
                    raise status_error_of(resp.status_code, _error_text(resp))
                content = _read_body(resp, self.max_reply_bytes)
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=False) from exc
        return wire.parse(content)

    def stream(self, wire: WireFormat, request: ModelRequest, on_delta: OnDelta) -> ModelReply:
        """POST ``wire.stream_body(request)`` and read the server-sent events with ``wire.reader``
        (``on_delta`` gets each piece); an endpoint that does not stream answers whole and is read
        with ``wire.parse``. Raises ``GatewayError`` (not retryable for an answer, the whole event
        stream, above ``max_reply_bytes``)."""
        try:
            body = orjson.dumps(wire.stream_body(request))
            with connect_sse(self.pool.get(), "POST", wire.path, content=body) as source:
                resp = source.response
                if resp.status_code >= 400:
                    raise status_error_of(resp.status_code, _error_text(resp))
                if "text/event-stream" not in resp.headers.get("content-type", ""):
                    # an endpoint without streaming answered the whole reply
                    return wire.parse(_read_body(resp, self.max_reply_bytes))
                return read_events(_events(resp, ReplySize(self.max_reply_bytes)), wire.reader(on_delta))
        except httpx.HTTPError as exc:
            raise transport_error(exc, streamed=True) from exc


class ReplySize:
    """Counts one answer's bytes as they are read, and stops it past ``limit``: a gateway that
    sends without end (or a reply far beyond any model's output) must not take a worker's memory,
    which thousands of calls in flight share. ``declared``: the answer's ``Content-Length``, if
    any, refused at once when above the limit. ``add(chunk)`` returns the chunk. Raises
    ``GatewayError`` (not retryable: the same request would be answered the same way, and paid
    again) naming the setting (``AGENT_MODEL_MAX_REPLY_BYTES``)."""

    def __init__(self, limit: int, declared: str | None = None):
        self.limit = limit
        self.read = 0
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            raise reply_too_large(limit)

    def add(self, chunk: bytes) -> bytes:
        self.read += len(chunk)
        if self.read > self.limit:
            raise reply_too_large(self.limit)
        return chunk


def reply_too_large(limit: int) -> GatewayError:
    """The ``GatewayError`` of an answer above ``limit`` bytes (``ReplySize``)."""
    return GatewayError(
        f"model answer larger than {limit} bytes (AGENT_MODEL_MAX_REPLY_BYTES); not read further", retryable=False
    )


def _read_body(resp: httpx.Response, limit: int) -> bytes:
    """The whole body of ``resp`` (opened streamed), at most ``limit`` bytes (``ReplySize``)."""
    size = ReplySize(limit, resp.headers.get("content-length"))
    return b"".join(size.add(chunk) for chunk in _decoded(resp, limit))


def _error_text(resp: httpx.Response) -> str:
    """The start of an error answer's body (``ERROR_TEXT_BYTES``), for its message; the rest unread."""
    parts: list[bytes] = []
    read = 0
    for chunk in _decoded(resp):
        parts.append(chunk)
        read += len(chunk)
        if read >= ERROR_TEXT_BYTES:
            break
    return b"".join(parts)[:ERROR_TEXT_BYTES].decode("utf-8", "replace")


def _events(resp: httpx.Response, size: ReplySize) -> Iterator[ServerSentEvent | None]:
    """The response's server-sent events (``SSEEvents``: not httpx's ``iter_lines``, which also
    splits at U+2028 inside an event), a None for each line that completes none and for each read
    that completes no line (so ``read_events``'s tail looks at the clock while bytes arrive without
    a line end); the stream's bytes counted by ``size``."""
    events = SSEEvents()
    for chunk in _decoded(resp, size.limit):
        yield from events.feed(size.add(chunk)) or (None,)
    yield from events.close()


def _decoded(resp: httpx.Response, limit: int = MAX_REPLY_BYTES) -> Iterator[bytes]:
    """The body of ``resp`` (opened streamed), decoded from its ``Content-Encoding`` with a bound
    per piece (``content_decoding.BoundedDecoder``): httpx's own decoding (``iter_bytes``) expands
    each 64 KiB read whole, up to ~66 MB of deflate, before any ``ReplySize`` could count it. The
    raw bytes are capped at ``limit`` too (``ReplySize``): data after a compressed stream's end
    decodes to nothing. Raises ``httpx.DecodingError`` for a coding it cannot decode, and
    ``GatewayError`` past ``limit``."""
    raw_size = ReplySize(limit)
    try:
        decoder = BoundedDecoder(parse_content_encoding(resp.headers.get("content-encoding")))
        for raw in resp.iter_raw():
            yield from decoder.feed(raw_size.add(raw))
    except ContentEncodingError as exc:
        raise httpx.DecodingError(str(exc), request=resp.request) from exc


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


def status_error_of(status: int, text: str) -> GatewayError:
    """The ``GatewayError`` of HTTP ``status`` with body ``text``: retryable for 408, 409, 429
    and 5xx (the providers' retry guidance, docs/architecture.md), not for any other 4xx."""
    retryable = status in (408, 409, 429) or status >= 500
    return GatewayError(f"model gateway answered HTTP {status}: {text[:500]}", retryable=retryable, status_code=status)
