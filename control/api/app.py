"""The HTTP control plane: ``create_app()`` builds the ASGI app (FastAPI), ``python -m control.api``
(``make api``) serves it with uvicorn.

One process holds: a ``ControlPlane`` (sync Redis client and Celery producer, used by the routes
in the thread pool; an enqueue only builds its creation script there, ``ControlPlane.create_call``),
an asyncio Redis client (tokens, rate limits, enqueues, event streams) and a ``StreamHub`` (one
``XREAD`` for every event stream followed). Redis is the control user's
(``CONTROL_REDIS_URL``, else ``REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import redis
from fastapi import Depends, FastAPI, Request

from control.api import collector, errors, metrics, page, routes
from control.api.auth import authenticate_first, caller
from control.api.edge import Edge
from control.api.hub import StreamHub
from control.api.json_response import JsonResponse
from control.api.limits import BodySizeLimit
from control.api.settings import ApiSettings
from control.api.streams import StreamCaps
from control.api.tokens import AuthenticatedScript, TokenStore
from control.client import ControlPlane
from control.errors import ControlPlaneUnavailable
from worker.redis_connection import RedisEndpoint, redis_endpoint
from worker.settings import get_settings
from worker.turn.guard import CREATE_LUA

log = logging.getLogger("agent.api")

HUB_BLOCK_MS = 10_000
REDIS_CONNECTIONS = 64  # the request side's pool (tokens, limits, event-stream reads)

DESCRIPTION = """Enqueue agent turns, follow their events (server-sent events, resumable with
`Last-Event-ID`), and decide the tool calls that wait for a person's approval.

Every route needs a token (`Authorization: Bearer atr_...`; `agent-runtime token create`), scoped
to agents or to all agents. Errors have one shape: `{"error": {"type", "message", "param", "code"}}`.
"""


def redis_url() -> RedisEndpoint:
    """The control plane's Redis: ``CONTROL_REDIS_URL``, else ``REDIS_URL``, through the settings'
    Sentinels and TLS files (``worker.redis_connection``). Raises ``ValueError`` for a bad URL."""
    return redis_endpoint(get_settings(), control=True)


async def _connect(endpoint: RedisEndpoint) -> ControlPlane:
    """A ``ControlPlane`` once Redis answers (a briefly missing Redis at start is waited for)."""
    waited = 0.0
    while True:
        try:
            control = await asyncio.to_thread(ControlPlane, endpoint)
            await asyncio.to_thread(control.open_broker)
            return control
        except ControlPlaneUnavailable as exc:
            if waited == 0.0 or waited % 10 < 1:
                log.warning("waiting for Redis at %s: %s", endpoint.display, exc)
            await asyncio.sleep(1.0)
            waited += 1.0


def create_app(settings: ApiSettings | None = None, *, url: str | None = None) -> FastAPI:
    """The app, on the Redis at ``url`` (default: ``redis_url()``'s)."""
    settings = settings or ApiSettings()
    endpoint = redis_endpoint(get_settings(), url=url) if url else redis_url()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.control = await _connect(endpoint)
        # A bounded pool: a burst of requests waits for a connection (up to 10 s) instead of
        # opening hundreds of Redis connections at once. Both clients follow a Sentinel failover.
        app.state.aredis = endpoint.async_client(
            max_connections=REDIS_CONNECTIONS, wait_for_connection=10, socket_timeout=10
        )
        hub_client = endpoint.async_client(socket_timeout=HUB_BLOCK_MS / 1000 + 10)
        app.state.create_turn = app.state.aredis.register_script(CREATE_LUA)  # ControlPlane.create_call's
        # An enqueue with a token seen before: its checks and the turn's creation in one script.
        app.state.enqueue = AuthenticatedScript(app.state.aredis, CREATE_LUA)
        app.state.tokens = TokenStore(app.state.aredis)
        app.state.hub = StreamHub(hub_client, block_ms=HUB_BLOCK_MS, heartbeat=settings.heartbeat)
        app.state.hub.start()
        # Garbage collected between bursts of events, not inside one (``control.api.collector``).
        pacer = asyncio.get_running_loop().create_task(collector.pace(app.state.hub.idle_for), name="gc-pacer")
        app.state.stream_caps = StreamCaps(settings.max_streams_per_token)
        app.state.started = time.time()
        log.info("control-plane API on Redis %s", endpoint.display)
        try:
            yield
        finally:
            pacer.cancel()
            await asyncio.wait({pacer})
            await app.state.hub.stop()
            await hub_client.aclose()
            await app.state.aredis.aclose()

    app = FastAPI(
        title="Agent runtime control plane",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # Swagger UI would load its assets from a CDN; the document is at /openapi.json
        redoc_url=None,
        openapi_url=None,
        default_response_class=JsonResponse,
    )
    app.state.settings = settings
    errors.install(
        app, settings.retry_after, authenticate_first=authenticate_first, self_checking=frozenset({routes.enqueue_turn})
    )
    app.include_router(routes.router)
    page.install(app)
    metrics.install(app)

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi(_: Any = Depends(caller)) -> dict[str, Any]:
        return app.openapi()

    @app.get("/healthz", include_in_schema=False)
    async def healthz(request: Request) -> JsonResponse:
        """Open (no token): 200 when Redis answers, else 503. Says nothing else."""
        try:
            await request.app.state.aredis.ping()
        except redis.RedisError:
            return errors.error_response(503, "Redis is not answering", headers={"Retry-After": "2"})
        return JsonResponse({"ok": True})

    # ``POST /v1/turns``'s common case and the event streams' writes skip the framework (``edge``).
    return Edge(BodySizeLimit(app, settings.max_body_bytes), app, settings.max_body_bytes)  # type: ignore[return-value]
