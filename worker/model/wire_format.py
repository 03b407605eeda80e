"""What a model wire API is, apart from how its bytes travel: ``WireFormat``.

A wire API (Responses, Chat Completions) is its path, its request body (whole and streamed), the
parse of a whole answer, and a ``StreamReader`` fed one server-sent event at a time. Both the
synchronous transport (``worker.model.http_pool.ModelHTTP``, a thread per call) and the
asynchronous one (``worker.model.async_client.AsyncModelClient``, a coroutine per call on the
process's event loop) drive the same ``WireFormat``, so a wire API is parsed by one piece of code
whichever way the call is made.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from httpx_sse import ServerSentEvent

from worker.model.interface import ModelReply, ModelRequest, OnDelta


class StreamReader(Protocol):
    """Reads one streamed answer, event by event; raises ``GatewayError`` for a broken stream."""

    def feed(self, event: str, data: str) -> ModelReply | None:
        """Take one event (its ``event:`` name and ``data:`` text); the whole reply once the
        stream's terminal event arrived, else None (``on_delta`` got any piece it carried)."""
        ...

    def end(self) -> ModelReply:
        """The stream ended without a terminal event: the reply if the stream still says how it
        ended, else raises ``GatewayError`` (retryable: the stream was cut)."""
        ...


@dataclass(frozen=True)
class WireFormat:
    """One wire API: ``path`` under the base URL (``/responses``); ``body(request)`` and
    ``stream_body(request)`` the JSON bodies (``GatewayError``, not retryable, when the request
    cannot be expressed); ``parse(content)`` a whole answer's ``ModelReply``; ``reader(on_delta)``
    a fresh ``StreamReader``."""

    path: str
    body: Callable[[ModelRequest], dict[str, Any]]
    stream_body: Callable[[ModelRequest], dict[str, Any]]
    parse: Callable[[bytes], ModelReply]
    reader: Callable[[OnDelta], StreamReader]


def read_events(events: Iterable[ServerSentEvent], reader: StreamReader) -> ModelReply:
    """Feed ``events`` to ``reader`` up to the terminal event, then read the stream to its end (so
    a keep-alive connection goes back to its pool clean); the reply. Raises ``GatewayError``."""
    it = iter(events)
    for sse in it:
        reply = reader.feed(sse.event, sse.data)
        if reply is not None:
            for _ in it:
                pass
            return reply
    return reader.end()
