"""Celery's lazy broker and producer pools raced under many publishing threads (kombu#781):
``tasks.app.init_broker_pools``, run at worker start, creates them in one thread first."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import kombu.pools
from celery import Celery

from tasks.app import init_broker_pools

ROOT = Path(__file__).resolve().parents[2]


def _first_publishes_at_once(app: Celery, threads: int = 64) -> list[str]:
    """``threads`` threads take a producer at the same instant, as a threads pool's first tasks do."""
    start = threading.Barrier(threads)
    errors: list[str] = []
    held = []

    def take() -> None:
        start.wait()
        try:
            held.append(app.producer_pool.acquire(block=True, timeout=5))
        except Exception as exc:  # the race raises RuntimeError("Can't shrink pool when in use")
            errors.append(repr(exc))

    workers = [threading.Thread(target=take) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return errors


def rounds(n: int = 100) -> None:
    """``n`` rounds of a fresh app whose pools ``init_broker_pools`` created, each taking 64 producers
    at once; raises AssertionError on the first error. It resets kombu's process-wide pools (the
    race only shows on fresh ones), so the test runs it in a process of its own."""
    sys.setswitchinterval(1e-6)  # interleave the threads as a loaded worker does
    for _ in range(n):  # without the initialisation about 1 round in 30 fails here
        kombu.pools.reset()
        app = Celery("pools-race", broker="redis://127.0.0.1:1/0")  # nothing connects
        app.conf.broker_pool_limit = 2048
        init_broker_pools(app)
        assert _first_publishes_at_once(app) == []
        assert app.amqp.producer_pool.limit == 2048


def test_pools_created_first_survive_many_first_publishes():
    code = "from tests.integration.test_broker_pools import rounds; rounds()"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
