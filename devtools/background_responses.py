"""The Responses API's background mode, as the scripted gateway plays it.

A request with ``background: true`` (and ``store: true``, which the real API requires of it) is
generated on a thread of its own, whoever listens: the client may go, the answer is still made
(and paid for), and it is kept under its id. What the wire carries is the real API's (OpenAI
Responses API reference, "Background mode" and "Retrieve a model response"):

- ``POST /v1/responses`` with ``background: true``: streamed (``stream: true``), the events as they
  are made, ``response.created`` first (the response with its ``id``, ``status: queued``,
  ``background: true``); not streamed, the response object at once, ``status: queued``;
- ``GET /v1/responses/{id}``: the response object as it stands (``queued``, ``in_progress``,
  ``completed``, ``incomplete``, ``cancelled``); ``GET /v1/responses/{id}?stream=true&starting_after=N``
  streams the events whose ``sequence_number`` is above ``N`` (all of them without ``N``), then
  the rest as they are made, up to the terminal event;
- ``POST /v1/responses/{id}/cancel``: stops the generation (``status: cancelled``; a stream in
  progress ends without a terminal event) and answers the response object;
- an unknown id: HTTP 404, ``invalid_request_error``.

A generation is counted once, when it ends, whatever number of clients read it: ``generated``
counts generations per ``(model, first user text, step)`` (the gateway's ``note_answer`` key), so
a test or the soak sees "paid twice" as a step generated twice. A finished response is appended
to ``store`` (a JSON-lines file, when given) and loaded again at start: a gateway process that is
killed and started again still answers the ids it made, as a provider's store does.

A script step's streaming knobs apply as for a plain stream: ``stream_delay_ms`` paces the
generation, ``stream_break_after`` cuts the creating request's stream (the generation goes on).
The gateway's ``latency`` is spent by the generation, after ``response.created``.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler
from io import BufferedIOBase
from pathlib import Path
from typing import Any, Callable

import orjson

from devtools.sse_script import sse_events

# ``note(body, status, complete)``: the gateway's record of an answer (``ScriptedGateway.note_answer``).
Note = Callable[[dict[str, Any], int, bool], None]
TERMINAL = ("response.completed", "response.incomplete")


def not_found(response_id: str) -> dict[str, Any]:
    """The real API's 404 body for an unknown response id."""
    message = f"Response with id '{response_id}' not found."
    return {"error": {"message": message, "type": "invalid_request_error", "param": "response_id", "code": None}}


class Generation:
    """One background response: its events as made (``frames``: ``(is_delta, SSE frame)``), its
    ``status``, and ``changed`` (a condition readers wait on)."""

    def __init__(self, body: dict[str, Any], payload: dict[str, Any], step: dict[str, Any]):
        self.body = body
        self.payload = payload
        self.step = step
        self.id = str(payload["id"])
        self.status = "queued"
        self.frames: list[tuple[bool, bytes]] = []
        self.finished = False
        self.changed = threading.Condition()

    def response(self) -> dict[str, Any]:
        """The response object as it stands (its output once the generation completed)."""
        with self.changed:
            if self.status in ("completed", "incomplete"):
                return self.payload
            return {**self.payload, "status": self.status, "output": [], "usage": None}

    def add(self, event: dict[str, Any]) -> None:
        frame = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        with self.changed:
            self.frames.append((event["type"].endswith(".delta"), frame))
            self.changed.notify_all()

    def end(self, status: str) -> None:
        with self.changed:
            if not self.finished:
                self.status, self.finished = status, True
            self.changed.notify_all()


class BackgroundResponses:
    """The gateway's background responses (see the module docstring); ``note`` records a finished
    generation as a paid answer; ``latency`` (s) is spent by each generation."""

    def __init__(self, note: Note, latency: float = 0.0, store: Path | None = None):
        self.note = note
        self.latency = latency
        self.store = store
        self.responses: dict[str, Generation] = {}
        self.generated: Counter[tuple[str, Any, int]] = Counter()
        self.cancelled: list[str] = []
        self._lock = threading.Lock()
        if store is not None and store.exists():
            for line in store.read_bytes().splitlines():
                kept = orjson.loads(line)
                gen = Generation(kept["body"], kept["payload"], {})
                for event in sse_events(gen.payload):
                    gen.add(event)
                gen.end(str(gen.payload.get("status") or "completed"))
                self.responses[gen.id] = gen

    def create(
        self, body: dict[str, Any], payload: dict[str, Any], step: dict[str, Any], key: tuple[str, Any, int]
    ) -> Generation:
        """Start generating ``payload`` (the scripted answer to ``body``) under a fresh id."""
        payload = {**payload, "id": f"resp_bg_{uuid.uuid4().hex}", "background": True}
        gen = Generation(body, payload, step)
        with self._lock:
            self.responses[gen.id] = gen
        threading.Thread(target=self._generate, args=(gen, key), name=f"generate-{gen.id[-8:]}", daemon=True).start()
        with gen.changed:  # ``response.created`` is there before the request is answered
            gen.changed.wait_for(lambda: gen.frames or gen.finished, timeout=5)
        return gen

    def get(self, response_id: str) -> Generation | None:
        """The response ``response_id``, or None."""
        with self._lock:
            return self.responses.get(response_id)

    def cancel(self, response_id: str) -> Generation | None:
        """Stop ``response_id``'s generation (nothing when it ended); the response, or None."""
        gen = self.get(response_id)
        if gen is not None:
            with self._lock:
                self.cancelled.append(response_id)
            with gen.changed:
                if not gen.finished:
                    gen.end("cancelled")
        return gen

    def answer_create(
        self,
        handler: Any,
        body: dict[str, Any],
        played: tuple[int, dict[str, Any], dict[str, Any]],
        key: tuple[str, Any, int],
    ) -> None:
        """Answer ``POST /v1/responses`` with ``background: true`` on ``handler`` (the gateway's
        request handler, with its ``_send``); ``played``: the gateway's ``(status, payload, script
        step)`` for ``body``; ``key``: what the answer is for (``generated``)."""
        status, payload, step = played
        if body.get("store") is not True:
            error = {"message": "Background mode requires store=true.", "type": "invalid_request_error"}
            handler._send(400, {"error": {**error, "param": "background", "code": None}})
        elif status != 200:
            handler._send(status, payload)
        elif body.get("stream") is True:
            cut = step.get("stream_break_after")
            serve_stream(handler, self.create(body, payload, step, key), -1, None if cut is None else int(cut))
        else:
            handler._send(200, self.create(body, payload, step, key).response())

    def answer_by_id(self, handler: Any, path: str, *, post: bool) -> bool:
        """Answer ``GET /v1/responses/{id}`` (``?stream=true&starting_after=N``) or, ``post``,
        ``POST /v1/responses/{id}/cancel`` on ``handler``; False when ``path`` is neither."""
        url = urllib.parse.urlsplit(path)
        parts = url.path.strip("/").split("/")
        if parts[:2] != ["v1", "responses"] or parts[3:] != (["cancel"] if post else []) or len(parts) < 3:
            return False
        gen = self.cancel(parts[2]) if post else self.get(parts[2])
        query = urllib.parse.parse_qs(url.query)
        if gen is None:
            handler._send(404, not_found(parts[2]))
        elif not post and query.get("stream") == ["true"]:
            serve_stream(handler, gen, int(query.get("starting_after", ["-1"])[0]))
        else:
            handler._send(200, gen.response())
        return True

    def _generate(self, gen: Generation, key: tuple[str, Any, int]) -> None:
        delay = float(gen.step.get("stream_delay_ms", 0)) / 1000
        events = list(sse_events(gen.payload, chunk=int(gen.step.get("stream_chunk", 12))))
        created = {**events[0]["response"], "status": "queued"}
        gen.add({**events[0], "response": created})
        if self.latency:
            time.sleep(self.latency)
        with gen.changed:
            if gen.finished:  # cancelled while queued
                return
            gen.status = "in_progress"
        for event in events[1:]:
            if event["type"].endswith(".delta") and delay:
                time.sleep(delay)
            with gen.changed:
                if gen.finished:  # cancelled: nothing more is made (or paid)
                    return
            if event["type"] in TERMINAL:
                self._keep(gen)
                with self._lock:
                    self.generated[key] += 1
                self.note(gen.body, 200, True)
            gen.add(event)
        gen.end(str(gen.payload.get("status") or "completed"))

    def _keep(self, gen: Generation) -> None:
        if self.store is None:
            return
        with self._lock, open(self.store, "ab") as fh:
            fh.write(orjson.dumps({"body": gen.body, "payload": gen.payload}) + b"\n")


def write_frame(wfile: BufferedIOBase, frame: bytes) -> bool:
    """Send one stream frame; False when the client has gone."""
    try:
        wfile.write(frame)
        wfile.flush()
    except (BrokenPipeError, ConnectionResetError):
        return False
    return True


def serve_stream(
    handler: BaseHTTPRequestHandler, gen: Generation, after: int = -1, cut: int | None = None, last: bytes = b""
) -> bool:
    """Stream ``gen``'s events above sequence number ``after`` on ``handler`` (a
    ``BaseHTTPRequestHandler``), waiting for those not made yet, up to its end. ``cut``: stop after
    that many deltas, sending ``last`` (a cut stream; the generation goes on). True when the
    terminal event was sent."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    at, deltas = after + 1, 0
    while True:
        with gen.changed:
            gen.changed.wait_for(lambda: len(gen.frames) > at or gen.finished)  # noqa: B023
            frames, finished = gen.frames[at:], gen.finished
        for is_delta, frame in frames:
            if is_delta and cut is not None and deltas >= cut:
                write_frame(handler.wfile, last)
                return False
            deltas += is_delta
            if not write_frame(handler.wfile, frame):
                return False
            at += 1
            if frame.startswith(b"event: response.completed") or frame.startswith(b"event: response.incomplete"):
                return True
        if finished and not frames:
            return False  # cancelled: no terminal event
