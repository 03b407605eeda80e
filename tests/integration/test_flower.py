"""Flower shows turns, not the watchdog: a real Flower process (``tasks.flower``) on a stack of its
own (Redis, a worker, beat sending the sweep twice a second) for a minute, with a turn run through
it; Flower's own task list (``/api/tasks``) holds the turn's tasks and not one sweep, because beat
sends a task that sends no events without a ``task-sent`` event either (``tasks.beat``).
"""

from __future__ import annotations

import base64
import subprocess
import sys
import time

import httpx
import pytest

from devtools.ports import free_port
from tests.support.private_stack import ROOT, PrivateStack
from tests.support.scripts import msg, wait_for

BEAT_SECONDS = 60
AUTH = "ops:flower-test-secret"


@pytest.fixture
def stack():
    s = PrivateStack()  # AGENT_WATCHDOG_INTERVAL 0.5: beat sends the sweep twice a second
    yield s
    s.close()


def _tasks(base_url: str) -> dict[str, dict]:
    auth = {"Authorization": "Basic " + base64.b64encode(AUTH.encode()).decode()}
    resp = httpx.get(f"{base_url}/api/tasks", headers=auth, timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_flower_lists_the_turn_and_no_sweep_after_a_minute_of_beat(stack, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("done")]}])
    port = free_port()
    flower = stack._spawn(
        "flower",
        [sys.executable, "-m", "tasks.flower", f"--port={port}", "--address=127.0.0.1"],
        env={"FLOWER_BASIC_AUTH": AUTH},
    )
    base_url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{base_url}/healthcheck", auth=tuple(AUTH.split(":")), timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, timeout=90)
    stack.start_worker()
    beat = stack.start_beat()
    started = time.monotonic()
    turn_id = stack.control.enqueue({"agent_id": "flower-watch", "input": "hello", "model": script_name})
    assert stack.control.wait(turn_id, timeout=60).status.value == "completed"
    time.sleep(max(0.0, BEAT_SECONDS - (time.monotonic() - started)))
    sent = beat.log.read_text().count("Sending due task watchdog-sweep")  # type: ignore[attr-defined]
    assert sent >= BEAT_SECONDS, f"beat sent {sent} sweeps in {BEAT_SECONDS} s"
    tasks = _tasks(base_url)
    names = [t.get("name") for t in tasks.values()]
    assert "tasks.watchdog.sweep" not in names, f"{names.count('tasks.watchdog.sweep')} sweep rows of {len(names)}"
    assert all(t.get("state") != "PENDING" or t.get("name") for t in tasks.values())  # no nameless PENDING rows
    steps = [t for t in tasks.values() if t.get("name") == "tasks.turns.turn_step" and turn_id in str(t.get("args"))]
    assert steps and all(t["state"] == "SUCCESS" for t in steps), steps
    assert flower.poll() is None, subprocess.run(
        ["tail", "-20", str(flower.log)], capture_output=True, text=True, cwd=ROOT
    ).stdout
