"""The Responses API's background mode: a model call whose answer outlives its client.

Without it, a model answer exists only on the connection that asked for it: a process that dies
after the provider generated the answer (and billed it) and before the answer was stored leaves
its step to be made again, and paid again. With ``background: true`` (and ``store: true``, which
the API requires of it) the provider generates the answer whoever listens and keeps it under its
id for a while (OpenAI Responses API reference, "Background mode"): a step that finds the id of
the response it started fetches that response instead of paying for a new one.

What this module gives the clients (``worker.model.async_client``):

- ``Background(response_id, on_created)``: what a call knows and reports. ``response_id``: the
  response a former attempt of the step started (None: none); ``on_created(id)``: called once
  the stream's ``response.created`` event named a new response's id, so that the caller records
  it before the model has written much (``worker.turn.memo.ReplyMemo.note_response``);
- ``background_body(body)``: a streamed request's body in background mode;
- ``resume_url(base, id)``: ``GET {base}/{id}?stream=true``, the response's events from the first
  (the reader builds the reply from them as from the creating stream);
- ``WatchCreated(reader, on_created)``: a ``StreamReader`` that reports the id of
  ``response.created`` and passes every event on;
- ``cancel_url(base, id)``: ``POST {base}/{id}/cancel`` (a background response keeps generating,
  and billing, when its client goes: a cancelled turn's response is cancelled by id).

Only the Responses wire API has it; Chat Completions has no such mode (a chat endpoint never gets
these fields).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import orjson

from worker.model.interface import ModelReply
from worker.model.wire_format import StreamReader


@dataclass(frozen=True)
class Background:
    """One call's background mode: ``response_id`` to fetch (None: create one), ``on_created`` to
    report a created response's id (called on the calling loop's thread: it must not block)."""

    response_id: str | None
    on_created: Callable[[str], None]


def background_body(body: dict[str, Any]) -> dict[str, Any]:
    """A streamed Responses body in background mode (``background``, ``store``: both required)."""
    return {**body, "background": True, "store": True}


def resume_url(responses_url: str, response_id: str) -> str:
    """``{responses_url}/{id}?stream=true``: the response's events, from the first."""
    return f"{responses_url}/{response_id}?stream=true"


def cancel_url(responses_url: str, response_id: str) -> str:
    """``{responses_url}/{id}/cancel``."""
    return f"{responses_url}/{response_id}/cancel"


class WatchCreated:
    """A ``StreamReader`` around ``reader`` that calls ``on_created(id)`` at the stream's
    ``response.created`` event (once, and not for ``known``, the id being resumed)."""

    def __init__(self, reader: StreamReader, on_created: Callable[[str], None], known: str | None = None):
        self.reader = reader
        self.on_created = on_created
        self.seen = known

    def feed(self, event: str, data: str) -> ModelReply | None:
        """Pass the event on; report a new response's id first."""
        if self.seen is None and (event == "response.created" or (not event and '"response.created"' in data)):
            response_id = _created_id(data)
            if response_id:
                self.seen = response_id
                self.on_created(response_id)
        return self.reader.feed(event, data)

    def end(self) -> ModelReply:
        """The stream ended without a terminal event (``StreamReader.end``)."""
        return self.reader.end()


def _created_id(data: str) -> str | None:
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    response = parsed.get("response") if isinstance(parsed, dict) else None
    response_id = response.get("id") if isinstance(response, dict) else None
    return response_id if isinstance(response_id, str) and response_id else None
