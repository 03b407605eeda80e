"""Services a test run or a dev command starts never outlive it: an embedded Redis (its own session,
so a Ctrl-C does not stop it before its clients) dies with a starter killed outright, and a pytest
run sent SIGTERM tears its services down as after Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from tests.conftest import ROOT

STARTER = textwrap.dedent(
    """
    import sys, threading, time
    from devtools.embedded_redis import EmbeddedRedis
    main = EmbeddedRedis(); main.start()
    other = EmbeddedRedis()
    t = threading.Thread(target=other.start); t.start(); t.join()
    print(main.proc.pid, other.proc.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (not yet reaped) has stopped
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.1)
    return False


def test_an_embedded_redis_dies_with_a_starter_killed_outright():
    """SIGKILL of the process that started it: the Redis it started from its main thread exits;
    one started from a helper thread is not tied to it (the kernel would signal it when that thread
    ends, ``devtools/lifetime.py``) and is still running, which the test then stops itself."""
    starter = subprocess.Popen([sys.executable, "-c", STARTER], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert starter.stdout is not None
    tied, untied = (int(p) for p in starter.stdout.readline().split())
    try:
        assert _alive(tied) and _alive(untied)
        starter.kill()
        starter.wait()
        assert _gone_within(tied, 10), f"redis-server {tied} outlived its starter"
        assert _alive(untied), "a Redis started from a thread that already ended was stopped"
    finally:
        for pid in (tied, untied):
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


SESSION = textwrap.dedent(
    """
    from devtools.embedded_redis import EmbeddedRedis
    _redis = EmbeddedRedis()

    def pytest_configure(config):
        _redis.start()
        print("REDIS", _redis.proc.pid, flush=True)

    def pytest_unconfigure(config):
        _redis.stop()
    """
)


def test_a_test_run_sent_sigterm_stops_what_its_conftest_started(tmp_path: Path):
    """The project's root conftest turns SIGTERM into an interrupt: pytest_unconfigure runs and the
    session's Redis is stopped (without it, SIGTERM ends pytest at once and the Redis stays)."""
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_configure as _project_configure\n"
        + SESSION.replace(
            "def pytest_configure(config):\n", "def pytest_configure(config):\n    _project_configure(config)\n"
        )
    )
    (tmp_path / "test_wait.py").write_text(
        "import time\n\ndef test_wait():\n    print('WAITING', flush=True)\n    time.sleep(600)\n"
    )
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-s", "-p", "no:cacheprovider", "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,  # this run's own session, so its own tied children are its alone
    )
    assert run.stdout is not None
    pid = 0
    try:
        for line in run.stdout:
            if line.startswith("REDIS"):
                pid = int(line.split()[1])
            if "WAITING" in line:
                break
        assert pid and _alive(pid)
        # SIGTERM makes the run's main thread exit too (the tie would then stop Redis anyway):
        # what is checked is that it is stopped by the teardown, so the run ends cleanly.
        run.send_signal(signal.SIGTERM)
        out = run.stdout.read()
        assert run.wait(30) != 0
        assert "KeyboardInterrupt" in out or "Interrupted" in out, out[-2000:]
        assert _gone_within(pid, 10), f"redis-server {pid} outlived the run"
    finally:
        if run.poll() is None:
            run.kill()
        if pid and _alive(pid):
            os.kill(pid, signal.SIGKILL)
