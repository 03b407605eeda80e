"""Test infrastructure: a real Redis (embedded, started here and stopped after), the
scripted gateway over HTTP, and a real Celery worker subprocess (``--pool solo -c 1``
serving every queue: any hidden blocking wait would deadlock it).

Set ``TEST_REDIS_URL`` to use an existing Redis instead of the embedded one.

``--fast`` (``make test-fast``) runs the modules of ``FAST_MODULES`` only and starts none of
the services: Redis, gateway and model URLs point at a closed port, and the service fixtures
fail, so a test that needs them fails loudly in that tier instead of passing or reaching a
Redis of the machine. ``make test`` runs every module, these included.

``tests/real_model/`` (a real model server, minutes per turn on 2 cores) is left out of a run over
the whole suite (``make test``); ``--real-model``, or naming the folder, collects it
(``make test-real-model``, docs/real-model.md).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from devtools.workers import worker_argv
from worker.model.wire_styles import WIRE_STYLES, UnknownWireStyle, wire_format

ROOT = Path(__file__).resolve().parent.parent
REAL_MODEL_TESTS = ROOT / "tests" / "real_model"
_state: dict = {}

FAST_MODULES = frozenset(
    {
        "test_arguments.py",
        "test_arguments_doc.py",
        "test_arguments_round2.py",
        "test_citations.py",
        "test_layout.py",
        "test_real_model_setup.py",
        "test_redis_clients.py",
        "test_repair_cases.py",
        "test_schemas.py",
        "test_store_owns_keys.py",
        "test_strict.py",
        "test_tracing_config.py",
        "test_turn_request.py",
        "test_wire_conformance.py",
        "test_wire_rules.py",
        "test_wire_styles.py",
    }
)
"""The pure-Python modules (``--fast``). Their tests that take a service fixture or carry the
``slow`` marker (a subprocess, or a timing measured over many runs) stay in ``make test`` only."""

SERVICE_FIXTURES = frozenset({"gateway", "web_server", "redis_url", "solo_worker", "control"})

NO_SERVICE_URL = "redis://127.0.0.1:1/0"  # a closed port: a fast-tier test that reaches for Redis fails


def pytest_addoption(parser):
    parser.addoption(
        "--fast", action="store_true", help="the fast tier: FAST_MODULES only, no Redis, gateway, web server or worker"
    )
    parser.addoption(
        "--real-model", action="store_true", help="also collect tests/real_model (a real model server; slow)"
    )


def pytest_configure(config):
    session_api_style()  # a wrong OPENAI_API_STYLE stops the run before anything starts
    if config.getoption("--fast"):
        _configure_fast_tier()
        return
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


def _configure_fast_tier() -> None:
    homes = Path(tempfile.mkdtemp(prefix="agent-homes-"))
    os.environ.update(
        {
            "REDIS_URL": NO_SERVICE_URL,
            "CONTROL_REDIS_URL": NO_SERVICE_URL,
            "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
            "OPENAI_API_KEY": "sk-test-secret-never-logged",
            "OPENAI_MODEL": "unset-script",
            "AGENT_HOMES_ROOT": str(homes),
            "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
            "AGENT_APPROVAL_MODE": "off",
        }
    )
    _state["homes"] = homes
    _state["fast"] = True


def pytest_ignore_collect(collection_path, config):
    if collection_path == REAL_MODEL_TESTS and not config.getoption("--real-model"):
        return True
    # The fast tier does not even import the other modules (their imports alone take seconds).
    if config.getoption("--fast") and collection_path.name.startswith("test_") and collection_path.suffix == ".py":
        return collection_path.name not in FAST_MODULES or None
    return None


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--fast"):
        return

    def fast(item: pytest.Item) -> bool:
        return (
            item.path.name in FAST_MODULES
            and not SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ()))
            and item.get_closest_marker("slow") is None
        )

    keep = [item for item in items if fast(item)]
    dropped = [item for item in items if not fast(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = keep


def _not_in_fast_tier(what: str) -> None:
    """Fail the test that asks for ``what`` (a service of the suite) in the fast tier."""
    if _state.get("fast"):
        pytest.fail(f"{what} is not started in the fast tier (--fast): take the module out of FAST_MODULES")


def pytest_unconfigure(config):
    for proc in _state.get("workers", []):
        stop_process(proc)
    release_mounts(
        _state.get("homes"), config._tmp_path_factory.getbasetemp() if hasattr(config, "_tmp_path_factory") else None
    )
    if "gateway" in _state:
        _state["gateway"].stop()
    if "web" in _state:
        _state["web"].stop()
    if "redis" in _state:
        _state["redis"].stop()


def release_mounts(*roots: Path | None) -> None:
    """Unmount every home image mounted under ``roots`` (lazily: never fails on a busy one; the
    loop device goes with its last user)."""
    from worker.tools.computer.homes import release_all

    for root in roots:
        if root is not None:
            release_all(root)


@pytest.fixture(autouse=True)
def _unmount_test_homes(request):
    """Homes a test made under its ``tmp_path`` are unmounted after it, whatever its outcome."""
    path = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    release_mounts(path)


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
    _not_in_fast_tier("a Celery worker")
    name = f"test-{uuid.uuid4().hex[:6]}@%h"
    cmd = worker_argv(queues, name=name, loglevel="WARNING", extra=extra)
    log = open(Path(tempfile.gettempdir()) / f"worker-{uuid.uuid4().hex[:6]}.log", "w")
    # A worker gets its own Redis user only, as in a deployment.
    worker_env = {k: v for k, v in os.environ.items() if k != "CONTROL_REDIS_URL"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**worker_env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT)
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
    _not_in_fast_tier("the scripted gateway")
    return _state["gateway"]


@pytest.fixture(scope="session")
def web_server():
    _not_in_fast_tier("the web server")
    return _state["web"]


@pytest.fixture(scope="session")
def redis_url():
    _not_in_fast_tier("Redis")
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


@pytest.fixture
def script_name():
    return f"script-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def homes_root() -> Path:
    return _state["homes"]


API_STYLES = tuple(WIRE_STYLES)


def session_api_style() -> str:
    """The wire API the session's worker speaks: ``OPENAI_API_STYLE`` as the suite was started with
    (``responses`` when unset), so ``OPENAI_API_STYLE=chat make test`` runs the end-to-end tests
    through ``/chat/completions``. A worker refuses a name ``WIRE_STYLES`` does not have; so does
    this, before anything starts."""
    style = os.environ.get("OPENAI_API_STYLE") or "responses"
    try:
        wire_format(style)
    except UnknownWireStyle as exc:
        raise pytest.UsageError(str(exc)) from None
    return style


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
