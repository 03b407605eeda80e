"""The scripted gateway behind a front that behaves like a hosted model API on the wire.

The scripted gateway answers HTTP/1.0-style: one connection per request, and a stream ends by
closing its connection. A hosted Responses API (api.openai.com and its peers) speaks HTTP/1.1
and keeps connections alive: a JSON answer carries ``Content-Length``, a stream is sent with
``Transfer-Encoding: chunked`` and ends with the last chunk, and the client reuses the
connection for its next request. A client pool shared by hundreds of threads behaves
differently against the two (bench/README.md, "Keep-alive endpoint and the hung model call"), so the concurrency bench and the
client's regression tests use this front.

``HostedEndpoint(gateway, latency=...)`` serves ``POST /v1/responses`` (JSON or, with
``stream: true``, server-sent events) from ``gateway.respond_step`` on ``127.0.0.1:port``;
``latency`` seconds pass before each answer; ``idle_timeout`` seconds after its last answer an
idle connection is closed by the server (None: never). ``answered``, ``connections`` and
``peak_in_flight`` count what it served, ``requests`` lists the bodies (the gateway's list); ``clients_by_connection`` which ``metadata.client``
values each connection carried (a test tells its client threads apart with it). ``python -m devtools.hosted_endpoint --scripts DIR`` runs it as a process.
"""

from __future__ import annotations

import argparse
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from devtools.scripted_gateway import ScriptedGateway
from devtools.sse_script import sse_events


class HostedEndpoint:
    """A keep-alive HTTP/1.1 server answering from ``gateway`` (a ``ScriptedGateway``, never
    started itself). ``port`` 0 picks a free port; ``latency`` in seconds."""

    def __init__(
        self,
        gateway: ScriptedGateway,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        latency: float = 0.0,
        idle_timeout: float | None = None,
    ):
        self.gateway = gateway
        self.latency = latency
        self.answered = 0
        self.connections = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        # Per connection (numbered in accept order): the ``metadata.client`` values its requests carried.
        self.clients_by_connection: dict[int, set[str]] = {}
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive unless the client says close
            # TCP_NODELAY, as hosted APIs' servers set it: the handler writes headers and body (or
            # each event) separately, and with Nagle's algorithm a write after the first waited
            # for the client's delayed ACK, about 40 ms added to every answer on a kept-alive
            # connection.
            disable_nagle_algorithm = True
            timeout = idle_timeout  # a connection idle this long is closed, as hosted APIs do

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def setup(self) -> None:
                super().setup()
                with endpoint._lock:
                    endpoint.connections += 1
                    self.number = endpoint.connections

            def do_GET(self) -> None:
                self._json(200, {"ok": True, "answered": endpoint.answered, "connections": endpoint.connections})

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"null")
                if not self.path.rstrip("/").endswith("/responses") or not isinstance(body, dict):
                    self._json(404 if isinstance(body, dict) else 400, {"error": {"message": "bad request"}})
                    return
                client = (body.get("metadata") or {}).get("client")
                with endpoint._lock:
                    endpoint.answered += 1
                    endpoint.in_flight += 1
                    if client is not None:
                        endpoint.clients_by_connection.setdefault(self.number, set()).add(str(client))
                    endpoint.peak_in_flight = max(endpoint.peak_in_flight, endpoint.in_flight)
                try:
                    if endpoint.latency:
                        time.sleep(endpoint.latency)
                    status, payload, _ = endpoint.gateway.respond_step(body)
                finally:
                    with endpoint._lock:
                        endpoint.in_flight -= 1
                try:
                    if status == 200 and body.get("stream") is True:
                        self._stream(payload)
                    else:
                        self._json(status, payload)
                    complete = True
                except (BrokenPipeError, ConnectionResetError):
                    complete = False
                    self.close_connection = True
                endpoint.gateway.note_answer(body, status, complete)

            def _json(self, status: int, payload: dict[str, Any]) -> None:
                data = orjson.dumps(payload)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, payload: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in sse_events(payload):
                    frame = b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        class Server(ThreadingHTTPServer):
            request_queue_size = 2048  # hundreds of clients connect at once
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hangs up (a closed stream, a killed worker) is not news

        self._server = Server((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every request body received, newest last (the gateway's list)."""
        return self.gateway.requests

    @property
    def port(self) -> int:
        """The TCP port served."""
        return self._server.server_address[1]

    @property
    def base_url(self) -> str:
        """The ``OPENAI_BASE_URL`` to use, e.g. ``http://127.0.0.1:8090/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "HostedEndpoint":
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="hosted-endpoint", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        self._server.shutdown()
        self._server.server_close()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve the ``*.json`` scripts of ``--scripts`` like a hosted API on ``--port``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8090)
    parser.add_argument("--scripts", type=Path, required=True, help="folder of *.json scripts")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    parser.add_argument("--answer-log", type=Path, default=None, help="append a JSON line per answer here")
    args = parser.parse_args(argv)
    gateway = ScriptedGateway()
    gateway.answer_log = args.answer_log
    gateway.load_dir(args.scripts)
    endpoint = HostedEndpoint(gateway, port=args.port, latency=args.latency)
    print(f"hosted-like endpoint on {endpoint.base_url}", flush=True)
    try:
        endpoint._server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        endpoint._server.server_close()


if __name__ == "__main__":
    main()
