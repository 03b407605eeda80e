"""Flower as an operator runs it (``python -m tasks.flower``, what ``make flower`` and compose run):
the password comes from ``FLOWER_BASIC_AUTH`` only, and ``/metrics`` is behind it."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from devtools.embedded_redis import free_port
from tests.conftest import ROOT, stop_process
from tests.support.scripts import wait_for

AUTH = ("operator", "not-on-the-command-line")


@pytest.fixture(scope="module")
def flower(redis_url, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("flower") / "flower.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tasks.flower", f"--port={port}", "--address=127.0.0.1"],
            cwd=ROOT,
            env={**os.environ, "FLOWER_BASIC_AUTH": ":".join(AUTH)},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def up():
        assert proc.poll() is None, log.read_text()[-2000:]
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthcheck", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, timeout=60, poll=0.3)
        yield {"base": f"http://127.0.0.1:{port}", "proc": proc}
    finally:
        stop_process(proc)


def test_metrics_and_pages_need_the_password(flower):
    base = flower["base"]
    assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
    assert httpx.get(f"{base}/metrics", auth=("operator", "wrong"), timeout=10).status_code == 401
    assert httpx.get(f"{base}/", timeout=10).status_code == 401
    ok = httpx.get(f"{base}/metrics", auth=AUTH, timeout=10)
    assert ok.status_code == 200 and "flower_" in ok.text
    assert httpx.get(f"{base}/tasks", auth=AUTH, timeout=10).status_code == 200


def test_the_password_is_not_on_flowers_command_line(flower):
    cmdline = open(f"/proc/{flower['proc'].pid}/cmdline", "rb").read().decode()
    assert AUTH[1] not in cmdline


def test_flower_refuses_to_start_without_a_password_or_with_one_on_the_command_line():
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    run = subprocess.run([sys.executable, "-m", "tasks.flower"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert run.returncode == 2 and "FLOWER_BASIC_AUTH" in run.stderr
    run = subprocess.run(
        [sys.executable, "-m", "tasks.flower", "--basic-auth=a:b"],
        cwd=ROOT,
        env={**env, "FLOWER_BASIC_AUTH": "a:b"},
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "not on the command line" in run.stderr
