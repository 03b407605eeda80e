"""The HTTP API's own metrics (``prometheus-client``), served by the API at ``GET /metrics`` to a
token that covers all agents (an operator's: ``agent-runtime token create prometheus --all-agents``;
Prometheus sends it with ``authorization: {credentials_file: ...}``).

- ``agent_api_requests_total{route,method,status}``: every answered request; ``route`` is the
  matched route's path template (``/v1/turns/{turn_id}``), ``(unmatched)`` for a path no route
  declares (its label values stay bounded), so 4xx, 5xx and 429 (over a token's rate, or its
  streams cap) are read by ``status``;
- ``agent_api_request_seconds{route}`` (histogram): time to the end of the response (an event
  stream's lasts as long as the stream: read it for the other routes);
- ``agent_api_open_streams{route}``: server-sent event streams open now (turn events, the
  approvals feed).

They live in a registry of their own (``REGISTRY``): the turn loop's metrics are counted by the
workers, never here (a turn this process ends is counted by a worker: ``worker.turn.ending``).
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from control.api.auth import Caller, caller
from control.api.errors import ApiError

REGISTRY = CollectorRegistry(auto_describe=True)
REQUESTS = Counter(
    "agent_api_requests",
    "HTTP API requests answered, by route, method and status.",
    ["route", "method", "status"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "agent_api_request_seconds",
    "HTTP API time to the end of the response.",
    ["route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=REGISTRY,
)
OPEN_STREAMS = Gauge("agent_api_open_streams", "Server-sent event streams open now.", ["route"], registry=REGISTRY)


def count(route: str, method: str, status: int, seconds: float) -> None:
    """Count one answered request (``agent_api_requests_total``, ``agent_api_request_seconds``)
    taking ``seconds`` to the end of its response, on ``route`` (a path template)."""
    REQUESTS.labels(route, method, str(status)).inc()
    REQUEST_SECONDS.labels(route).observe(seconds)


def _route(scope: dict[str, Any]) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else "(unmatched)"


class RequestMetrics:
    """An ASGI middleware counting every HTTP request (the module docstring's series)."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        seen: dict[str, Any] = {"status": 500, "stream": None}

        def counted_send(message: Any) -> Any:
            # Not a coroutine of its own: it hands back ``send``'s (``limits.BodySizeLimit``).
            if message["type"] == "http.response.start":
                seen["status"] = message["status"]
                headers = dict(message.get("headers") or [])
                if headers.get(b"content-type", b"").startswith(b"text/event-stream"):
                    seen["stream"] = _route(scope)
                    OPEN_STREAMS.labels(seen["stream"]).inc()
            return send(message)

        try:
            await self.app(scope, receive, counted_send)
        finally:
            route = _route(scope)
            if seen["stream"] is not None:
                OPEN_STREAMS.labels(seen["stream"]).dec()
            count(route, scope.get("method", ""), seen["status"], time.perf_counter() - started)


def install(app: FastAPI) -> None:
    """Add ``GET /metrics`` (the Prometheus text format; 403 for a token scoped to some agents only)
    and the middleware that counts requests."""
    app.add_middleware(RequestMetrics)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(c: Caller = Depends(caller)) -> Response:
        if c.token.agents is not None:
            raise ApiError(403, "the metrics need a token for all agents (token create --all-agents)")
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
