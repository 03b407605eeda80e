"""The HTTP control plane as a real server process for tests (``python -m control.api``)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import NamedTuple

import httpx

from devtools import lifetime
from devtools.ports import free_port

ROOT = Path(__file__).resolve().parent.parent.parent


class ApiServer:
    """``ApiServer(redis_url, **env).start()``; ``base_url``; ``tokens`` (a sync ``TokenStore``);
    ``token(agents)`` makes one; ``stop()``."""

    def __init__(self, redis_url: str, endpoint: object = None, root: Path = ROOT, **env: str):
        """``endpoint``: the ``RedisEndpoint`` the test process reaches ``redis_url`` with, when the
        settings the server gets in ``env`` are not the session's (TLS, Sentinels). ``root``: the
        source tree the server runs from (the benches' earlier version of the code)."""
        self.redis_url = redis_url
        self.root = root
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "CONTROL_REDIS_URL": redis_url, **env}
        self.proc: subprocess.Popen | None = None
        self.log = Path(tempfile.gettempdir()) / f"api-{uuid.uuid4().hex[:6]}.log"
        from control.api.tokens import TokenStore, sync_client

        self.tokens = TokenStore(sync_client(endpoint or redis_url))

    def start(self, timeout: float = 60) -> "ApiServer":
        argv = [sys.executable, "-m", "control.api", "--port", str(self.port), "--log-level", "warning"]
        self.proc = subprocess.Popen(
            argv,
            cwd=self.root,
            env=self.env,
            stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lifetime.preexec(),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the API exited at start; see {self.log}")
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the API did not answer within {timeout} s; see {self.log}")

    def token(self, agents: list[str] | None, **kw) -> str:
        return self.tokens.create(f"test-{uuid.uuid4().hex[:4]}", agents, **kw)[0]

    def client(self, token: str | None = None, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=kw.pop("timeout", 30), **kw)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class DeclaredRoute(NamedTuple):
    method: str
    path: str
    module: str
    """Where its endpoint is defined (``control.api.routes``...; a mount: the app's module)."""


def declared_routes() -> list[DeclaredRoute]:
    """Every route the app declares (its routes and mounts), read from the app itself: a route
    added later is in this list without any edit here."""
    from fastapi.routing import APIRoute
    from starlette.routing import Mount, Route

    from control.api.app import create_app
    from control.api.settings import ApiSettings

    def walk(routes, prefix: str = ""):
        for route in routes:
            included = getattr(route, "original_router", None)  # FastAPI >= 0.165 keeps an included router whole
            if included is not None:
                yield from walk(included.routes, prefix + route.include_context.prefix)
            elif isinstance(route, Mount):
                yield DeclaredRoute("GET", prefix + route.path, type(route.app).__module__)
            elif isinstance(route, APIRoute | Route):
                module = route.endpoint.__module__
                for method in sorted(route.methods or ()):
                    if method not in ("HEAD", "OPTIONS"):
                        yield DeclaredRoute(method, prefix + route.path, module)
            else:
                raise AssertionError(f"a route of a kind this test does not know: {route!r}")

    app = create_app(ApiSettings(), url="redis://127.0.0.1:1/0").app  # not started: no Redis needed
    return list(walk(app.routes))
