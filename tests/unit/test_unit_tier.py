"""The unit tier (``tests/unit/``, ``make test-fast``) starts no service, and a test in it that
reaches for one fails.

A module is planted next to copies of the suite's conftests (never in the tree itself) and run
with ``pytest tests/unit`` in a subprocess: the environment points Redis at a closed port, and the
integration tier's service fixtures do not exist there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PLANTED = """
import os

import redis


def test_pure():
    assert os.environ["REDIS_URL"].startswith("redis://127.0.0.1:1/")


def test_reaches_for_redis_without_a_fixture():
    redis.Redis.from_url(os.environ["REDIS_URL"], socket_connect_timeout=5).ping()


def test_asks_for_redis(redis_url):
    raise AssertionError("a unit test cannot take a service fixture")
"""


def test_the_unit_tier_starts_nothing_and_a_test_needing_redis_fails(tmp_path):
    for conftest in ("conftest.py", "unit/conftest.py", "unit/__init__.py", "__init__.py"):
        (tmp_path / "tests" / conftest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tests" / conftest, tmp_path / "tests" / conftest)
    (tmp_path / "tests" / "unit" / "test_planted.py").write_text(PLANTED)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in ("REDIS_URL", "CONTROL_REDIS_URL", "TEST_REDIS_URL", "OPENAI_BASE_URL"):
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "tests/unit"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 failed, 1 passed, 1 error" in out, out
    assert "FAILED tests/unit/test_planted.py::test_reaches_for_redis_without_a_fixture" in out, out
    assert "ConnectionError" in out, out
    assert "fixture 'redis_url' not found" in out, out
