"""`make test-fast` (``pytest --fast``) starts no service, and a test in it that reaches for one fails.

A module named in ``FAST_MODULES`` is planted next to a copy of the suite's conftest (never in
the tree itself) and run with ``--fast`` in a subprocess.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLANTED = """
import os

import redis


def test_pure():
    assert os.environ["REDIS_URL"].startswith("redis://127.0.0.1:1/")


def test_reaches_for_redis_without_a_fixture():
    redis.Redis.from_url(os.environ["REDIS_URL"], socket_connect_timeout=5).ping()


def test_asks_for_redis(redis_url):
    raise AssertionError("a test that takes a service fixture is not in the fast tier")
"""


def test_fast_tier_starts_nothing_and_a_test_needing_redis_fails(tmp_path):
    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_strict.py").write_text(PLANTED)  # a name FAST_MODULES holds
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("REDIS_URL", "CONTROL_REDIS_URL", "TEST_REDIS_URL", "OPENAI_BASE_URL"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--fast", "-p", "no:cacheprovider", "-q", "-rf", str(tests)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 failed, 1 passed, 1 deselected" in out, out
    assert "FAILED tests/test_strict.py::test_reaches_for_redis_without_a_fixture" in out, out
    assert "ConnectionError" in out, out
