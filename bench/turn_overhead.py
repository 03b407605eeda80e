"""Per-step overhead of a turn on Celery and Redis, against a floor measured in the same run.

Floor: one bare Celery task round trip (``tasks.health.ping`` sent, run by the worker, its
result read back through the Redis result backend).

Measured (same worker, same Redis, scripted gateway over HTTP):
- a turn of N model steps, each with one trivial parallel-mode tool call: time per step
  (a step = one model call + one tool call + the barrier + the next step's message);
- a turn whose single step fans out G parallel calls (a Celery group): time per call.

Reported as ratios to the floor, never as absolute targets. Run: ``.venv/bin/python bench/turn_overhead.py``
(starts its own embedded Redis, gateway and a worker; ``--pool`` picks the worker pool).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.workers import worker_argv  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--floor-n", type=int, default=200)
    parser.add_argument("--pool", default="solo", help="solo (one process) or prefork")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()

    from devtools.embedded_redis import EmbeddedRedis
    from devtools.scripted_gateway import ScriptedGateway

    redis_srv = EmbeddedRedis()
    url = redis_srv.start()
    gw = ScriptedGateway().start()
    os.environ.update(
        {
            "REDIS_URL": url,
            "OPENAI_BASE_URL": gw.base_url,
            "OPENAI_MODEL": "x",
            "AGENT_HOMES_ROOT": tempfile.mkdtemp(prefix="bench-homes-"),
            "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
            "AGENT_MAX_MODEL_CALLS": str(args.steps + 5),
        }
    )
    worker = subprocess.Popen(
        worker_argv(
            "turns,tools,background,workflow",
            name=f"bench-{uuid.uuid4().hex[:6]}@%h",
            pool=args.pool,
            concurrency=args.concurrency,
            loglevel="ERROR",
        ),
        cwd=ROOT,
        env=os.environ.copy(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        from control.client import ControlPlane
        from tasks.app import app
        from tasks.health import ping

        while not app.control.ping(timeout=0.5):
            pass
        control = ControlPlane()

        # Floor: bare task round trips.
        for _ in range(20):
            ping.delay(1).get(timeout=10)
        t0 = time.perf_counter()
        for i in range(args.floor_n):
            ping.delay(i).get(timeout=10)
        floor = (time.perf_counter() - t0) / args.floor_n

        def fc(label):
            return {"type": "function_call", "name": "read_thing", "arguments": f'{{"label": "{label}"}}'}

        def run_turn(steps):
            name = f"bench-{uuid.uuid4().hex[:6]}"
            gw.add_script(name, steps)
            t = time.perf_counter()
            tid = control.enqueue({"input": "go", "model": name, "toolset": "testing"})
            view = control.wait(tid, timeout=300)
            assert view.status.value == "completed", view
            return time.perf_counter() - t

        # warm-up
        run_turn([{"output": [fc("w")]}, {"output": [{"type": "message", "text": "ok"}]}])
        serial = []
        for _ in range(3):
            steps = [{"output": [fc(f"s{i}")]} for i in range(args.steps)]
            steps.append({"output": [{"type": "message", "text": "done"}]})
            serial.append(run_turn(steps) / (args.steps + 1))
        per_step = statistics.median(serial)

        fan = []
        for _ in range(3):
            fan.append(
                run_turn(
                    [
                        {"output": [fc(f"g{i}") for i in range(args.group)]},
                        {"output": [{"type": "message", "text": "done"}]},
                    ]
                )
            )
        fan_total = statistics.median(fan)

        print(f"worker pool: {args.pool} -c {args.concurrency}")
        print(f"floor: bare Celery task round trip        {floor * 1000:8.2f} ms")
        print(f"turn step (model call + 1 tool call)     {per_step * 1000:8.2f} ms  = {per_step / floor:5.2f}x floor")
        print(
            f"turn with a group of {args.group} parallel calls   {fan_total * 1000:8.2f} ms  = "
            f"{fan_total / floor:5.2f}x floor ({fan_total / args.group * 1000:.2f} ms per call)"
        )
    finally:
        worker.terminate()
        worker.wait(20)
        gw.stop()
        redis_srv.stop()


if __name__ == "__main__":
    main()
