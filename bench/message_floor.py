"""What the bench turn's three Celery messages cost with nothing in them, against the runtime.

The runtime's worker CPU per bench turn (``bench/concurrency.py``: model call, one tool call, model
call; steps worker plus tools worker with its pool children) against the same three messages with
nothing in them (``bench/null_turn.py``): on the same pools (steps on solo, tool calls on prefork
``-c 2``), on the runtime's own Celery app (its transport, batched acks and events, orjson, time
limits), each message published as the runtime publishes a turn's next message (from a template,
in one round trip), each task doing nothing else. Rounds alternate the runtime
(``concurrency.run_ours``, against the keep-alive endpoint at ``--latency``) and the message
floor, and which goes first alternates too.

Printed per round: worker CPU ms per turn (steps, tools, total) of each, Redis commands per turn,
and the runtime's total less the floor's (what the runtime's own work costs: two model calls over
HTTP, the turn store, fencing, validation, the tool). Then the medians and every round. The
workers' logs and the embedded Redis are removed at the end, unless ``--keep-logs`` or a round left
turns unfinished. Run: ``.venv/bin/python bench/message_floor.py [--turns 1000] [--rounds 6] [--keep-logs]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import concurrency as harness  # noqa: E402  (puts the project's root on sys.path)

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from devtools.hosted_endpoint import HostedEndpoint  # noqa: E402
from devtools.scripted_gateway import ScriptedGateway  # noqa: E402


def run_floor(srv: EmbeddedRedis, n: int, logs: Path) -> dict[str, Any]:
    """``n`` null turns (``bench/null_turn.py``); returns ``{"wall" s, "unfinished", "cpu", "redis_calls"}``."""
    env = {**os.environ, "REDIS_URL": srv.url, "PYTHONPATH": str(harness.ROOT)}
    env.pop("CONTROL_REDIS_URL", None)
    steps = harness._spawn(harness._celery("null_turn", "null_steps", "solo", 1), env, BENCH, logs / "null.log")
    tools = harness._spawn(
        harness._celery("null_turn", "null_tools", "prefork", 2), env, BENCH, logs / "null-tools.log"
    )
    r = redis.Redis.from_url(srv.control_url)
    try:
        harness._wait_heartbeat(r, steps.pid, steps, "the floor's steps worker")
        harness._wait_heartbeat(r, tools.pid, tools, "the floor's tools worker")
        os.environ["REDIS_URL"] = srv.url
        import null_turn

        null_turn.app.conf.broker_url = srv.url
        r.delete(null_turn.DONE_KEY)
        calls_before = harness._redis_calls(r)
        cpu_before = harness._cpu_all(srv, steps, tools)
        started = time.monotonic()
        run = uuid.uuid4().hex[:6]
        for i in range(n):
            null_turn.null_step.apply_async((f"{run}-{i}", 0), queue=null_turn.STEPS_QUEUE)
        deadline = started + 120 + n * 0.05
        while r.llen(null_turn.DONE_KEY) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.monotonic() - started
        cpu = harness._cpu_delta(cpu_before, harness._cpu_all(srv, steps, tools), n)
        calls, _ = harness._per_turn(calls_before, harness._redis_calls(r), n)
        return {"wall": wall, "unfinished": n - r.llen(null_turn.DONE_KEY), "cpu": cpu, "redis_calls": calls}
    finally:
        harness._stop([steps, tools])


def _worker_ms(m: dict[str, Any]) -> float:
    return m["cpu"]["steps"] + m["cpu"]["tools"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6, help="alternated rounds (each: the runtime and the floor)")
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the runtime's model takes to answer")
    parser.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (removed by default)")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-message-floor-"))
    keep = args.keep_logs
    srv = EmbeddedRedis()
    srv.start()
    step = {"output": [{"type": "function_call", "name": "read_thing", "arguments": '{"label": "x"}'}]}
    script = {"bench": [step, {"output": [{"type": "message", "text": "done"}]}]}
    gw = HostedEndpoint(ScriptedGateway(script), latency=args.latency).start()
    print(f"{args.turns} turns a round; worker CPU ms per turn (steps + tools worker with its pool children)")
    print(
        f"{'round':>5} {'who':8} {'wall s':>7} {'unfinished':>10} {'cmds/turn':>9} {'steps':>6} {'tools':>6} {'total':>6}"
    )
    rows: list[tuple[float, float]] = []
    try:
        for i in range(args.rounds):
            if i % 2:
                floor = run_floor(srv, args.turns, logs)
                ours = harness.run_ours(srv, gw, args.turns, "solo", 1, logs)
            else:
                ours = harness.run_ours(srv, gw, args.turns, "solo", 1, logs)
                floor = run_floor(srv, args.turns, logs)
            for who, m in (("floor", floor), ("runtime", ours)):
                print(f"{i + 1:5d} {who:8} {m['wall']:7.2f} {m['unfinished']:10d} {m['redis_calls']:9.0f} "
                      f"{m['cpu']['steps']:6.2f} {m['cpu']['tools']:6.2f} {_worker_ms(m):6.2f}", flush=True)  # fmt: skip
            rows.append((_worker_ms(ours), _worker_ms(floor)))
            keep = keep or bool(ours["unfinished"] or floor["unfinished"])  # an unfinished round: logs to read
    except BaseException:
        keep = True
        raise
    finally:
        harness.stop_services(gw, srv, logs, keep)
    ours_ms, floor_ms = [o for o, _ in rows], [f for _, f in rows]
    own = [o - f for o, f in rows]
    print(f"runtime: median {statistics.median(ours_ms):.2f} ms (rounds {', '.join(f'{x:.2f}' for x in ours_ms)})")
    print(
        f"message floor: median {statistics.median(floor_ms):.2f} ms (rounds {', '.join(f'{x:.2f}' for x in floor_ms)})"
    )
    print(f"runtime less floor: median {statistics.median(own):.2f} ms (rounds {', '.join(f'{x:.2f}' for x in own)})")


if __name__ == "__main__":
    main()
