"""What every test shares: the options, the wire styles, the agent homes and their mounts.

The tests are in two trees. ``tests/unit/`` holds the pure-Python tests, mirroring the packages
they test (``tests/unit/tooling/`` for ``worker/tooling/``...): they start no service, and their
conftest points Redis and the model at a closed port, so a unit test that reaches for one fails
(``make test-fast`` runs them alone). ``tests/integration/`` holds the end-to-end tests: its
conftest starts a real Redis, the scripted gateway, a local web server and real Celery workers.
``make test`` runs both. ``tests/support/`` holds helpers, ``tests/fixtures/`` data.

``tests/integration/real_model/`` (a real model server, minutes per turn on 2 cores) is left out
of a run over the whole suite (``make test``); ``--real-model``, or naming the folder, collects it
(``make test-real-model``, docs/real-model.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from worker.model.wire_styles import WIRE_STYLES, UnknownWireStyle, wire_format

ROOT = Path(__file__).resolve().parent.parent
REAL_MODEL_TESTS = ROOT / "tests" / "integration" / "real_model"
_state: dict = {}
"""What the tiers' conftests started or made: ``homes`` (the agent homes' root), ``services``
(true once tests/integration/conftest.py set the environment up), the services themselves."""


def pytest_addoption(parser):
    parser.addoption(
        "--real-model",
        action="store_true",
        help="also collect tests/integration/real_model (a real model server; slow)",
    )


def pytest_configure(config):
    session_api_style()  # a wrong OPENAI_API_STYLE stops the run before anything starts
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)


def _interrupted(signum: int, frame: object) -> None:
    """A run sent SIGTERM or SIGHUP (a CI timeout, a closed terminal, ``kill`` on ``make test``)
    ends as after Ctrl-C: pytest tears the session down, so the services the tiers started (Redis,
    workers, the gateway) are stopped and the homes unmounted instead of outliving the run."""
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def pytest_ignore_collect(collection_path, config):
    if collection_path == REAL_MODEL_TESTS and not config.getoption("--real-model"):
        return True
    return None


def pytest_unconfigure(config):
    release_mounts(
        _state.get("homes"), config._tmp_path_factory.getbasetemp() if hasattr(config, "_tmp_path_factory") else None
    )
    if _state.get("homes") is not None:  # the run's homes root (tests/*/conftest.py), made in /tmp per run
        shutil.rmtree(_state["homes"], ignore_errors=True)


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
