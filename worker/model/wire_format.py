"""What a model wire API is, apart from how its bytes travel: ``WireFormat``.

A wire API (Responses, Chat Completions) is its path, its request body (whole and streamed), the
parse of a whole answer, and a ``StreamReader`` fed one server-sent event at a time. Both the
synchronous transport (``worker.model.http_pool.ModelHTTP``, a thread per call) and the
asynchronous one (``worker.model.async_client.AsyncModelClient``, a coroutine per call on the
process's event loop) drive the same ``WireFormat``, so a wire API is parsed by one piece of code
whichever way the call is made.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol

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


# Seconds to wait, after the terminal event, for the rest of the body (a blank line, ``[DONE]``).
TAIL_WAIT = 1.0


def read_events(events: Iterable[ServerSentEvent | None], reader: StreamReader) -> ModelReply:
    """Feed ``events`` to ``reader`` up to the terminal event, then read what follows
    (``_read_tail``); the reply. A None in ``events`` is a line or a read that completed no event
    (skipped here; it lets the tail's reader look at the clock). Raises ``GatewayError``."""
    it = iter(events)
    for sse in it:
        if sse is None:
            continue
        reply = reader.feed(sse.event, sse.data)
        if reply is not None:
            _read_tail(it)
            return reply
    return reader.end()


def _read_tail(it: Iterator[ServerSentEvent | None]) -> None:
    """Read the stream to its end, so a keep-alive connection goes back to its pool clean, for
    ``TAIL_WAIT`` s at most. The reply is already in hand (paid for): a stream that keeps sending
    (keep-alive comments, or bytes without a line end: each line or read is a None) is left unread, and one that breaks or times out now costs its
    connection (closed with its response), never the reply: raising would retry, and pay for, a
    call that succeeded. A stream that sends nothing at all is waited for up to its read timeout."""
    until = time.monotonic() + TAIL_WAIT
    try:
        for _ in it:
            if time.monotonic() > until:
                return
    except Exception:  # the transport's own error (httpx's), whatever it is: the reply stands
        return
