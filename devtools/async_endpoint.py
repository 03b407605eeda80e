"""The hosted-like model endpoint on one event loop: ten thousand streaming requests at once.

``devtools.hosted_endpoint.HostedEndpoint`` serves each connection on a thread of its own
(``ThreadingHTTPServer``). Measured with 10,000 streaming requests at once from one aiohttp
client (10 s latency, this 2-core machine): it held at most 3,665 of them in flight, 9,027 of the
10,000 waited out a 120 s read timeout, and the load average reached 2,757 (bench/README.md,
"Ten thousand turns in flight"). Here the same wire is served by aiohttp's server on one loop: a
waiting request is a sleeping coroutine, not a thread.

The wire is ``HostedEndpoint``'s (a hosted Responses API's): HTTP/1.1 keep-alive, a JSON answer
with ``Content-Length``, a ``stream: true`` request answered with ``Transfer-Encoding: chunked``
server-sent events (``devtools.sse_script``: the real event names and shapes) ending with the
last chunk; answers come from ``ScriptedGateway.respond_step`` after ``latency`` seconds.

``AsyncEndpoint(gateway, latency=...)``: ``start()`` serves in a thread of its own (tests);
``answered``, ``in_flight``, ``peak_in_flight`` and ``connections`` (accepted so far) count what
it served. ``python -m devtools.async_endpoint --scripts DIR --latency 30 --port N`` serves in its
own process (``bench/inflight.py``: a gateway sharing a process with the bench would share its
GIL); ``GET /stats`` answers those counts as JSON, ``POST /stats/reset`` zeroes the peak.
``keep_requests``: how many of the newest request bodies ``gateway.requests`` keeps (ten
thousand turns' bodies, tools included, are hundreds of megabytes).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import weakref
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from devtools.scripted_gateway import ScriptedGateway
from devtools.sse_script import sse_events

# Pending connections the listening socket queues (the kernel caps it at net.core.somaxconn):
# thousands of clients connect at once, and a full queue drops SYNs (the client retries a second later).
BACKLOG = 4096


def stream_bytes(payload: dict[str, Any]) -> bytes:
    """The server-sent events of a Responses body ``payload``, framed (``event:`` and ``data:`` lines)."""
    return b"".join(
        b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
        for event in sse_events(payload)
    )


class AsyncEndpoint:
    """A keep-alive HTTP/1.1 server answering from ``gateway`` (a ``ScriptedGateway``, never started
    itself) on ``host:port`` (0 picks a free port); ``latency`` seconds before each answer."""

    def __init__(
        self,
        gateway: ScriptedGateway,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        latency: float = 0.0,
        keep_requests: int = 16,
    ):
        self.gateway = gateway
        self.latency = latency
        self.keep_requests = keep_requests
        self.host, self._port = host, port
        self.answered = 0
        self.connections = 0
        self.in_flight = 0
        self.peak_in_flight = 0
        self._seen: weakref.WeakSet[asyncio.BaseTransport] = weakref.WeakSet()  # connections counted
        self._runner: web.AppRunner | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The TCP port served (known once started)."""
        return self._port

    @property
    def base_url(self) -> str:
        """The ``OPENAI_BASE_URL`` to use, e.g. ``http://127.0.0.1:8091/v1``."""
        return f"http://{self.host}:{self.port}/v1"

    def stats(self) -> dict[str, int]:
        """``{"answered", "in_flight", "peak_in_flight", "connections"}`` so far."""
        return {"answered": self.answered, "in_flight": self.in_flight, "peak_in_flight": self.peak_in_flight,
                "connections": self.connections}  # fmt: skip

    def app(self) -> web.Application:
        """The aiohttp application: ``POST .../responses``, ``GET /stats``, ``POST /stats/reset``."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/stats/reset", self._reset)
        app.router.add_get("/stats", self._stats)
        app.router.add_get("/health", self._stats)
        app.router.add_post("/{path:.*}", self._responses)
        return app

    async def _stats(self, _request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps({"ok": True, **self.stats()}), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.peak_in_flight = self.in_flight
        return await self._stats(request)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read() or b"null")
        except orjson.JSONDecodeError:
            body = None
        if not request.path.rstrip("/").endswith("/responses") or not isinstance(body, dict):
            status = 404 if isinstance(body, dict) else 400
            return web.json_response({"error": {"message": "bad request"}}, status=status, dumps=_dumps)
        self.answered += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        try:
            if self.latency:
                await asyncio.sleep(self.latency)
            status, payload, _ = self.gateway.respond_step(body)
            if len(self.gateway.requests) > 2 * self.keep_requests:
                del self.gateway.requests[: -self.keep_requests]
        finally:
            self.in_flight -= 1
        if status != 200 or body.get("stream") is not True:
            self.gateway.note_answer(body, status, True)
            return web.Response(status=status, body=orjson.dumps(payload), content_type="application/json")
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream; charset=utf-8"})
        resp.enable_chunked_encoding()
        try:
            await resp.prepare(request)
            await resp.write(stream_bytes(payload))  # one chunk: the whole answer is ready
            await resp.write_eof()
            complete = True
        except ConnectionError:
            complete = False
        self.gateway.note_answer(body, 200, complete)
        return resp

    async def serve(self) -> None:
        """Start serving on the running loop (``port`` is known once this returns)."""
        app = self.app()
        app.on_response_prepare.append(self._count_connection)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self._port, backlog=BACKLOG)
        await site.start()
        self._port = self._runner.addresses[0][1]

    async def _count_connection(self, request: web.Request, _response: web.StreamResponse) -> None:
        transport = request.transport
        if transport is not None and transport not in self._seen:
            self._seen.add(transport)
            self.connections += 1

    def start(self) -> AsyncEndpoint:
        """Serve on a loop in a daemon thread; returns self once listening."""
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            assert self._loop is not None
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(self.serve())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name="async-endpoint", daemon=True)
        self._thread.start()
        ready.wait(30)
        return self

    def stop(self) -> None:
        """Stop serving (a ``start``ed endpoint) and join its thread."""
        if self._loop is None or self._runner is None:
            return
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(30)
        if self._thread is None or not self._thread.is_alive():
            # Closed here, not by the garbage collector: a loop collected later, after its
            # self-pipe's descriptor was reused or closed, fails in __del__ inside another test.
            self._loop.close()


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


def main(argv: list[str] | None = None) -> None:
    """CLI: serve the ``*.json`` scripts of ``--scripts`` on ``--port`` after ``--latency`` seconds."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8091)
    parser.add_argument("--scripts", type=Path, required=True, help="folder of *.json scripts")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds before each answer")
    args = parser.parse_args(argv)
    gateway = ScriptedGateway()
    gateway.load_dir(args.scripts)
    endpoint = AsyncEndpoint(gateway, port=args.port, host=args.host, latency=args.latency)

    async def forever() -> None:
        await endpoint.serve()
        print(f"async endpoint on {endpoint.base_url}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(forever())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
