"""A scripted model gateway speaking the OpenAI Responses (and Chat Completions) wire format over HTTP.

``POST /v1/responses`` answers with the next step of a scripted conversation.
The script is chosen by the request's ``model`` field. The step is derived
from the request itself (stateless): every output item the gateway emits has
an ``id`` like ``fc_s3_0``; the next step is one past the highest step found
in the request's ``input``. Retried or duplicated requests therefore get the
same answer, as a memoizing client expects.

Like the real API, the gateway answers HTTP 400 when a ``function_call`` in
the input has no ``function_call_output`` ("No tool output found for function
call ..."), when an output has no call, or when an output is not a string.

Script format (JSON file or Python list): a list of steps, each
``{"output": [item, ...], "status": "completed" | "incomplete"}``, optionally with
streaming knobs ``stream_chunk`` (characters per delta, default 12), ``stream_delay_ms``
(pause before each delta, default 0), ``stream_break_after`` (close the connection
after that many deltas, without a terminal event: a stream cut mid-way) and ``stream_error``
(an error object sent after ``stream_error_after`` deltas, default 0, as a bare ``data:
{"error": ...}`` frame, then the end of the stream: what llama.cpp's server sends in either
style when the model's output cannot be parsed mid-stream). Items:
``{"type": "function_call", "name": ..., "arguments": "<raw string>"}`` or
``{"type": "message", "text": ...}``. A step may also be a callable
``(request_body) -> step dict`` (in-process scripts for tests).

Every reply carries ``usage`` like the real API's: ``input_tokens`` (about one per four
characters of the request's ``instructions``, ``input`` and ``tools``), ``output_tokens`` (same
over the output items), ``total_tokens``, ``input_tokens_details.cached_tokens`` and
``output_tokens_details.reasoning_tokens`` (0). A step's ``usage`` object overrides these counts.

A request with ``stream: true`` is answered with server-sent events carrying the real event
names and shapes (``devtools.sse_script``), unless the gateway was built with
``streaming=False`` (an endpoint without streaming: it answers the JSON body).

A request with ``background: true`` is the Responses API's background mode: generated whoever
listens, kept under its id, retrieved, resumed or cancelled by id (``devtools.background_responses``).

``POST /v1/chat/completions`` plays the same scripts in the Chat Completions wire format
(``devtools.chat_wire``: a ``chat.completion`` body, or its chunk stream ending ``data: [DONE]``).
The step is the number of assistant messages in ``messages``; broken tool-call pairing gets the
HTTP 400 a real server gives; ``requests`` records the body seen as a Responses request.

Run: ``python -m devtools.scripted_gateway --port 8089 --scripts scripts/``.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

from devtools.background_responses import BackgroundResponses, write_frame
from devtools.chat_wire import assistant_turns, chat_chunks, chat_completion, history_problem, responses_view
from devtools.sse_script import sse_events

Step = dict[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]

_ID_STEP = re.compile(r"^(?:fc|msg)_s(\d+)_")


def _check_history(items: list[dict[str, Any]]) -> str | None:
    calls = [it.get("call_id") for it in items if isinstance(it, dict) and it.get("type") == "function_call"]
    outputs = [it for it in items if isinstance(it, dict) and it.get("type") == "function_call_output"]
    answered = {}
    for out in outputs:
        cid = out.get("call_id")
        if cid not in calls:
            return f"No tool call found for function call output with call_id {cid}."
        if not isinstance(out.get("output"), str):
            return f"Invalid type for 'input.output': expected a string for call_id {cid}."
        if cid in answered:
            return f"Duplicate function call output for call_id {cid}."
        answered[cid] = True
    for cid in calls:
        if cid not in answered:
            return f"No tool output found for function call {cid}."
    return None


def _next_step(items: list[dict[str, Any]]) -> int:
    highest = -1
    for it in items:
        if isinstance(it, dict):
            m = _ID_STEP.match(str(it.get("id", "")))
            if m:
                highest = max(highest, int(m.group(1)))
    return highest + 1


def responses_frames(payload: dict[str, Any], size: int) -> Iterator[tuple[bool, bytes]]:
    """``(is_delta, frame bytes)`` of a Responses event stream."""
    for event in sse_events(payload, chunk=size):
        data = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        yield event["type"].endswith(".delta"), data


def chat_frames(payload: dict[str, Any], size: int) -> Iterator[tuple[bool, bytes]]:
    """``(is_delta, frame bytes)`` of a Chat Completions chunk stream, ``data: [DONE]`` last."""
    for is_delta, chunk in chat_chunks(payload, chunk=size):
        yield is_delta, b"data: " + orjson.dumps(chunk) + b"\n\n"
    yield False, b"data: [DONE]\n\n"


def _stream_end(step: dict[str, Any]) -> tuple[int | None, bytes]:
    """Where a scripted stream stops early (module docstring): the number of deltas sent before it
    stops (None: it does not), and the frame sent then (empty: the connection just closes)."""
    if step.get("stream_error") is not None:
        frame = b"data: " + orjson.dumps({"error": step["stream_error"]}) + b"\n\n"
        return int(step.get("stream_error_after", 0)), frame
    cut = step.get("stream_break_after")
    return (None if cut is None else int(cut)), b""


def _stream_payload(
    handler: BaseHTTPRequestHandler,
    first_delta_at: dict[str, float],
    payload: dict[str, Any],
    step: dict[str, Any],
    *,
    chat: bool,
) -> bool:
    """Stream ``payload`` on ``handler`` as the script ``step`` says (its knobs); True when the
    terminal event was sent. The first delta's time goes to ``first_delta_at``."""
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream; charset=utf-8")
    handler.send_header("Cache-Control", "no-cache")
    handler.send_header("Connection", "close")
    handler.end_headers()
    handler.close_connection = True
    delay = float(step.get("stream_delay_ms", 0)) / 1000
    cut, last = _stream_end(step)
    deltas = 0
    size = int(step.get("stream_chunk", 12))
    frames = chat_frames(payload, size) if chat else responses_frames(payload, size)
    for is_delta, frame in frames:
        if is_delta:
            if cut is not None and deltas >= cut:
                write_frame(handler.wfile, last)  # the error, if the stream ends in one
                return False  # no terminal event
            if delay:
                time.sleep(delay)
            if not deltas:
                first_delta_at.setdefault(payload["id"], time.time())
            deltas += 1
        if not write_frame(handler.wfile, frame):
            return False
    return True


class ScriptedGateway:
    """Holds scripts and serves them over HTTP on ``127.0.0.1:port`` (0 picks a free port).

    ``requests`` keeps every request body received (for tests), newest last. ``latency``
    (seconds) delays every answer, as a real model does; ``in_flight`` and ``peak_in_flight``
    count the requests being answered (benchmarks read them).
    """

    def __init__(
        self,
        scripts: dict[str, list[Step]] | None = None,
        port: int = 0,
        host: str = "127.0.0.1",
        *,
        streaming: bool = True,
        latency: float = 0.0,
    ):
        self.scripts: dict[str, list[Step]] = dict(scripts or {})
        self.requests: list[dict[str, Any]] = []
        self.chat_requests: list[dict[str, Any]] = []
        self.streaming = streaming
        self.latency = latency
        self.in_flight = 0
        self.peak_in_flight = 0
        # Wall-clock time (time.time()) at which the first delta of each streamed response id was written.
        self.first_delta_at: dict[str, float] = {}
        # Optional JSON-lines record of every answer (bench/soak.py counts paid model calls with it).
        self.answer_log: Path | None = None
        self._lock = threading.Lock()
        # Requests with ``background: true`` (devtools.background_responses).
        self.background = BackgroundResponses(self.note_answer, latency)
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/") in ("/health", "/v1/health"):
                    self._send(200, {"ok": True, "scripts": sorted(gateway.scripts)})
                elif self.path.rstrip("/") in ("/stats", "/v1/stats"):
                    self._send(
                        200,
                        {
                            "requests": len(gateway.requests),
                            "in_flight": gateway.in_flight,
                            "peak_in_flight": gateway.peak_in_flight,
                        },
                    )
                elif not gateway.background.answer_by_id(self, self.path, post=False):
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self) -> None:
                path = self.path.rstrip("/")
                if gateway.background.answer_by_id(self, path, post=True):
                    return
                chat = path.endswith("/chat/completions")
                if not chat and not path.endswith("/responses"):
                    self._send(404, {"error": {"message": f"unknown path {self.path}"}})
                    return
                length = int(self.headers.get("Content-Length") or 0)
                try:
                    body = orjson.loads(self.rfile.read(length))
                except orjson.JSONDecodeError:
                    self._send(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
                    return
                if body.get("background") is True and not chat:
                    gateway.background.latency = gateway.latency
                    status, payload, step = gateway.respond_step(body)
                    gateway.background.answer_create(self, body, (status, payload, step), gateway.answer_key(body))
                    return
                with gateway._lock:
                    gateway.in_flight += 1
                    gateway.peak_in_flight = max(gateway.peak_in_flight, gateway.in_flight)
                try:
                    if gateway.latency:
                        time.sleep(gateway.latency)
                    if chat:
                        status, payload, step = gateway.respond_chat(body)
                    else:
                        status, payload, step = gateway.respond_step(body)
                finally:
                    with gateway._lock:
                        gateway.in_flight -= 1
                if status == 200 and body.get("stream") is True and gateway.streaming:
                    complete = self._stream(payload, step, chat=chat)
                else:
                    try:
                        self._send(status, chat_completion(payload) if chat and status == 200 else payload)
                        complete = True
                    except (BrokenPipeError, ConnectionResetError):
                        complete = False
                gateway.note_answer(body, status, complete)

            def _stream(self, payload: dict[str, Any], step: dict[str, Any], *, chat: bool = False) -> bool:
                return _stream_payload(self, gateway.first_delta_at, payload, step, chat=chat)

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = orjson.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 1024  # hundreds of model calls connect at once under an I/O pool

        self._server = Server((host, port), Handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """The ``OPENAI_BASE_URL`` to use, e.g. ``http://127.0.0.1:8089/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def add_script(self, name: str, steps: list[Step]) -> None:
        """Register (or replace) the script served for model ``name``."""
        self.scripts[name] = steps

    def load_dir(self, folder: Path) -> None:
        """Load every ``*.json`` script in ``folder`` (name = file stem, or the file's ``name``)."""
        for path in sorted(Path(folder).glob("*.json")):
            data = orjson.loads(path.read_bytes())
            self.scripts[data.get("name", path.stem)] = data["steps"]

    def respond(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Answer one request body: ``(http_status, json_payload)``."""
        status, payload, _ = self.respond_step(body)
        return status, payload

    def answer_key(self, body: dict[str, Any]) -> tuple[str, Any, int]:
        """``(model, first user text, step)`` of a request: what one paid answer is for."""
        given = body.get("input")
        items: list[Any] = given if isinstance(given, list) else [{"role": "user", "content": given}]
        first = next((i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"), None)
        if isinstance(first, list):
            first = " ".join(str(c.get("text", "")) for c in first if isinstance(c, dict))
        return str(body.get("model", "")), first, _next_step(items)

    def note_answer(self, body: dict[str, Any], status: int, complete: bool) -> None:
        """Append ``{"at", "model", "input", "step", "status", "complete"}`` to ``answer_log`` (if set):
        ``input`` is the first user text, ``step`` the model items already in the input, ``complete``
        whether the whole answer reached the client (a paid model call)."""
        if self.answer_log is None:
            return
        model, first, step = self.answer_key(body)
        line = {"at": time.time(), "model": model, "input": first, "step": step, "status": status,
                "complete": complete, "background": body.get("background") is True}  # fmt: skip
        with self._lock, open(self.answer_log, "ab") as fh:
            fh.write(orjson.dumps(line) + b"\n")

    def respond_chat(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """``respond_step`` for a Chat Completions body: the step is the number of assistant
        messages; ``requests`` gets the body seen as a Responses request (``chat_wire.responses_view``,
        with ``wire: "chat"``), ``chat_requests`` the body as received. The payload is the Responses
        body (the handler writes it in Chat shape)."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            error: dict[str, Any] = {"message": "messages must be a list of objects", "type": "invalid_request_error"}
            return 400, {"error": error}, {}
        view = responses_view(body)
        with self._lock:
            self.chat_requests.append(body)
            self.requests.append(view)
        problem = history_problem(messages)
        if problem:
            error = {"message": problem, "type": "invalid_request_error", "param": "messages", "code": None}
            return 400, {"error": error}, {}
        return self._play(view, assistant_turns(messages))

    def respond_step(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, Any]]:
        """``respond`` plus the script step played (its streaming knobs); ``{}`` for an error."""
        with self._lock:
            self.requests.append(body)
        items = body.get("input")
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        if not isinstance(items, list):
            return (
                400,
                {"error": {"message": "input must be a string or a list", "type": "invalid_request_error"}},
                {},
            )
        problem = _check_history(items)
        if problem:
            error = {"message": problem, "type": "invalid_request_error", "param": "input", "code": None}
            return 400, {"error": error}, {}
        return self._play(body, _next_step(items))

    def _play(self, body: dict[str, Any], n: int) -> tuple[int, dict[str, Any], dict[str, Any]]:
        model = body.get("model", "")
        script = self.scripts.get(model)
        if script is None:
            error = {
                "message": f"The model `{model}` does not exist",
                "type": "invalid_request_error",
                "code": "model_not_found",
            }
            return 404, {"error": error}, {}
        if n >= len(script):
            step: dict[str, Any] = {"output": [{"type": "message", "text": "(script finished)"}]}
        else:
            entry = script[n]
            step = entry(body) if callable(entry) else entry
        return 200, self._render(model, n, step, body), step

    @staticmethod
    def _usage(body: dict[str, Any], output: list[dict[str, Any]], given: dict[str, Any] | None) -> dict[str, Any]:
        # A rough tokenizer (4 characters a token) is enough for budgets and metrics to move.
        sent = len(orjson.dumps([body.get("instructions"), body.get("input"), body.get("tools")]))
        counts = {"input_tokens": max(1, sent // 4), "output_tokens": max(1, len(orjson.dumps(output)) // 4)}
        counts.update({k: v for k, v in (given or {}).items() if k in ("input_tokens", "output_tokens")})
        given = given or {}
        return {
            **counts,
            "total_tokens": given.get("total_tokens", counts["input_tokens"] + counts["output_tokens"]),
            "input_tokens_details": {"cached_tokens": given.get("cached_tokens", 0), "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": given.get("reasoning_tokens", 0)},
        }

    def _render(self, model: str, n: int, step: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        seed = hashlib.sha1(orjson.dumps([model, n])).hexdigest()[:8]
        output: list[dict[str, Any]] = []
        for i, item in enumerate(step.get("output", [])):
            if item.get("type") == "function_call":
                output.append(
                    {
                        "type": "function_call",
                        "id": f"fc_s{n}_{i}",
                        "call_id": item.get("call_id") or f"call_{seed}_{n}_{i}",
                        "name": item["name"],
                        "arguments": item.get("arguments", "{}"),
                        "status": "completed",
                    }
                )
            else:
                output.append(
                    {
                        "type": "message",
                        "id": f"msg_s{n}_{i}",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": item.get("text", ""), "annotations": []}],
                    }
                )
        status = step.get("status", "completed")
        payload: dict[str, Any] = {
            "id": f"resp_{seed}",
            "object": "response",
            "created_at": 0,
            "model": model,
            "status": status,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": self._usage(body, output, step.get("usage")),
        }
        payload["incomplete_details"] = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return payload

    def start(self) -> "ScriptedGateway":
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="scripted-gateway", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve in the calling thread (the CLI)."""
        self._server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: serve the ``*.json`` scripts of ``--scripts`` on ``--host``/``--port``."""
    parser = argparse.ArgumentParser(description="Scripted Responses API gateway")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--scripts", type=Path, required=True, help="folder of *.json scripts")
    parser.add_argument("--no-stream", action="store_true", help="answer JSON even when a request asks to stream")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer (a real model's pace)")
    parser.add_argument("--answer-log", type=Path, default=None, help="append a JSON line per answer here")
    parser.add_argument("--background-store", type=Path, default=None, help="keep finished background responses here")
    args = parser.parse_args(argv)
    gw = ScriptedGateway(port=args.port, host=args.host, streaming=not args.no_stream, latency=args.latency)
    gw.answer_log = args.answer_log
    gw.background = BackgroundResponses(gw.note_answer, args.latency, args.background_store)
    gw.load_dir(args.scripts)
    print(
        f"scripted gateway on http://{args.host}:{gw.port}/v1 with scripts: {', '.join(sorted(gw.scripts))}", flush=True
    )
    try:
        gw.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        gw._server.server_close()


if __name__ == "__main__":
    main()
