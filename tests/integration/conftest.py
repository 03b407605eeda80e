"""The integration tier: end-to-end tests against real services, started here and stopped after.

A real Redis (embedded, with ACL users; ``TEST_REDIS_URL`` uses an existing one instead), the
scripted gateway over HTTP, a local web server for the web tools, and a real Celery worker
subprocess (``--pool solo -c 1`` serving every queue: any hidden blocking wait would deadlock it),
plus the helpers that start more workers (``start_worker_process``) and the fixtures that give
them (``redis_url``, ``gateway``, ``web_server``, ``solo_worker``, ``control``, ``styled_control``).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from devtools import lifetime
from devtools.workers import worker_argv
from tests.conftest import API_STYLES, ROOT, _state, session_api_style


def pytest_configure(config):
    from devtools.embedded_redis import EmbeddedRedis
    from devtools.scripted_gateway import ScriptedGateway

    _state["started"] = time.time()
    url = control_url = os.environ.get("TEST_REDIS_URL")
    if not url:
        emb = EmbeddedRedis()
        url = emb.start()
        control_url = emb.control_url
        _state["redis"] = emb
    gw = ScriptedGateway().start()
    _state["gateway"] = gw
    from tests.support.web_server import WebServer

    web = WebServer()
    _state["web"] = web
    homes = Path(tempfile.mkdtemp(prefix="agent-homes-"))
    os.environ.update(
        {
            "REDIS_URL": url,  # the worker ACL user (workers, beat, tests acting as a worker)
            "CONTROL_REDIS_URL": control_url,  # the control ACL user (ControlPlane)
            "OPENAI_BASE_URL": gw.base_url,
            "OPENAI_API_KEY": "sk-test-secret-never-logged",
            "OPENAI_MODEL": "unset-script",
            "AGENT_HOMES_ROOT": str(homes),
            "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
            "AGENT_TOOL_TIME_LIMIT": "60",
            "AGENT_MAX_MODEL_CALLS": "8",
            # Approvals are waived unless a test's turn request asks for them (approval.mode), so
            # tests of other features never park on a catalog tool's needs_approval.
            "AGENT_APPROVAL_MODE": "off",
            # Web provider profiles bound to a local server; loopback allowed for it only
            # (private, link-local and metadata ranges stay refused).
            "AGENT_WEB_SEARCH_URL": f"{web.base_url}/search",
            "AGENT_WEB_SEARCH_KEY": "search-key-never-shown",
            "AGENT_WEB_FETCH_ENABLED": "1",
            "AGENT_WEB_FETCH_ALLOW_LOOPBACK": "1",
            # The command egress proxy may reach the local web server's port only (test-only
            # setting, for the positive egress test); every other loopback port stays refused.
            "AGENT_TEST_ONLY_EGRESS_LOOPBACK_PORTS": str(web.httpd.server_address[1]),
            # Every home the suite makes is a real quota mount (loop-mounted ext4), small and sparse
            # (the disk-fill attack test allocates its own whole); unmounted at the end (below).
            "AGENT_HOME_QUOTA_MB": "64",
            "AGENT_HOME_IMAGE_PREALLOCATE": "0",
        }
    )
    _state["homes"] = homes
    _state["services"] = True
    from worker.settings import get_settings

    get_settings.cache_clear()  # settings read before (a unit module collected first) had other URLs


def pytest_unconfigure(config):
    for proc in _state.get("workers", []):
        stop_process(proc)
    if "gateway" in _state:
        _state["gateway"].stop()
    if "web" in _state:
        _state["web"].stop()
    if "redis" in _state:
        _state["redis"].stop()


def stop_process(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_worker_process(
    *extra: str, queues: str = "turns,tools,background,workflow", env: dict | None = None, broker_url: str | None = None
) -> subprocess.Popen:
    """Start ``celery worker`` as a subprocess and wait until it answers a ping (on ``broker_url``
    when the worker uses another broker than the suite's). The process gets ``node_name`` and
    ``log_path`` attributes."""
    name = f"test-{uuid.uuid4().hex[:6]}@%h"
    cmd = worker_argv(queues, name=name, loglevel="WARNING", extra=extra)
    log = open(Path(tempfile.gettempdir()) / f"worker-{uuid.uuid4().hex[:6]}.log", "w")
    # A worker gets its own Redis user only, as in a deployment.
    worker_env = {k: v for k, v in os.environ.items() if k != "CONTROL_REDIS_URL"}
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env={**worker_env, **(env or {})},
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=lifetime.preexec(),
    )
    proc.log_path = log.name
    from tasks.app import app

    if broker_url is not None:
        app = broker_app(broker_url)
    deadline = time.monotonic() + 90  # a loaded 2-core machine once took over 30 s to start a worker
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"worker exited early; see {log.name}")
        replies = app.control.ping(timeout=0.5) or []
        nodes = [k for r in replies for k in r if k.startswith(name.split("@")[0] + "@")]
        if nodes:
            proc.node_name = nodes[0]
            _state.setdefault("workers", []).append(proc)
            return proc
    stop_process(proc)
    raise RuntimeError(f"worker did not come up; see {log.name}")


def broker_app(broker_url: str):
    """A Celery app like ``tasks.app``'s (transport, serializers) on another broker, for control commands."""
    from celery import Celery

    from tasks.serialization import SERIALIZER, register_orjson

    register_orjson()
    app = Celery(broker=broker_url)
    app.conf.update(
        broker_transport="tasks.broker:Transport",
        accept_content=[SERIALIZER, "json"],
        result_accept_content=[SERIALIZER, "json"],
    )
    return app


@pytest.fixture
def held(redis_url):
    """A prefork node's held hash (``worker.turn.liveness.held_key``), recorded at fetch for
    ``tool_call`` (``tasks.broker.record_fetched_turns``) while the test runs."""
    from tasks import broker
    from worker.turn.liveness import held_key

    key = held_key(f"test-node:{uuid.uuid4().hex[:8]}")
    broker.record_fetched_turns(key, frozenset({"tasks.turns.tool_call"}))
    yield key
    broker.record_fetched_turns(None)


@pytest.fixture(scope="session")
def gateway():
    return _state["gateway"]


@pytest.fixture(scope="session")
def web_server():
    return _state["web"]


@pytest.fixture(scope="session")
def redis_url():
    return os.environ["REDIS_URL"]


@pytest.fixture(scope="session")
def solo_worker():
    """One worker process, ``--pool solo -c 1``, serving every queue."""
    proc = start_worker_process("--pool", "solo", "-c", "1")
    yield proc
    stop_process(proc)
    _state["workers"].remove(proc)


@pytest.fixture(scope="session")
def control(solo_worker):
    from control.client import ControlPlane

    return ControlPlane()


@pytest.fixture(scope="session")
def other_style_stacks():
    """For each wire style the session's worker does not speak, on first use: a worker (``--pool
    solo -c 1``) speaking it, on a Redis of its own, so no step of its turns is taken by the
    session's worker; the same scripted gateway. A mapping style -> ``PrivateStack``."""
    from tests.support.private_stack import PrivateStack

    class Stacks(dict):
        def __missing__(self, style: str) -> PrivateStack:
            stack = self[style] = PrivateStack(OPENAI_API_STYLE=style)  # closed at the end, also if it fails now
            stack.start_worker(pool="solo", concurrency=1)
            return stack

    stacks = Stacks()
    try:
        yield stacks
    finally:
        for stack in stacks.values():
            stack.close()


@pytest.fixture(params=API_STYLES)
def api_style(request) -> str:
    """Each wire style the workers can speak (``OPENAI_API_STYLE``: a name of ``WIRE_STYLES``)."""
    return request.param


@pytest.fixture
def styled_control(request, api_style):
    """A control plane whose turns run on a worker speaking ``api_style``: the session's worker
    when it speaks that style (``session_api_style``), else ``other_style_stacks``' one. A module runs
    its end-to-end tests in every style of ``WIRE_STYLES`` with ``control = styled_control`` (a
    fixture of that name)."""
    if api_style != session_api_style():
        return request.getfixturevalue("other_style_stacks")[api_style].control
    request.getfixturevalue("solo_worker")
    from control.client import ControlPlane

    return ControlPlane()


@pytest.fixture
def stack():
    """A private stack (``tests.support.private_stack``) whose progress deadline cannot be what
    recovers a turn (``SLOW_DEADLINE``); stopped after the test. Modules that need another stack
    define their own ``stack``."""
    from tests.support.private_stack import SLOW_DEADLINE, PrivateStack

    s = PrivateStack(**SLOW_DEADLINE)
    yield s
    s.close()
