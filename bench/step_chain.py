"""P1: the runtime's turn step against the leanest bare-Celery step, ``chain(tool | next step)``.

A step is one model call and one tool call. The floor (``bench/bare_celery.py``,
``bare_chain_step``) posts the same request body to the same endpoint, then publishes
``chain(tool, next step)``: Celery's own link from the tool to the next step, with nothing of the
runtime. The runtime's step is its real one: claims, memo, validation, plan, barrier, events,
usage, the next step's message. The tool itself does no I/O on either side (the runtime's
``read_thing`` from ``tests.support.toolsets.bench_tools``, without the tests' log; the floor's
only appends its output, the counterpart of the runtime storing the result). Both run K turns
of N steps at once, the tools on prefork ``-c 2`` (as deployed) and the steps on the pool each is
deployed on: the runtime's on solo, its model calls on the event loop (on threads ``-c 16`` with
``--calls inline``); the floor's on threads ``-c 16``, a bare model call holding its thread. Both
call the keep-alive model endpoint
(``devtools/hosted_endpoint.py``) answering at once; floor and runtime alternate (and which goes
first), and each round reports milliseconds per step (wall time over K x N steps) and the ratio.
``--stream`` makes the runtime stream its model calls (the floor posts JSON either way: the
streamed figure includes the cost of streaming).

The defaults are the setting of every figure in ``bench/README.md`` ("P1: a step against the
leanest bare-Celery step"): 16 turns x 20 steps, 8 alternated rounds. Everything the run writes
(the agents' homes of each runtime round, the workers' logs, the embedded Redis) is removed at
the end; ``--keep-logs`` keeps the logs, and a round that did not finish every turn keeps them too
(the path is printed).

Run: ``.venv/bin/python bench/step_chain.py [--turns 16] [--steps 20] [--rounds 8] [--stream]
[--calls async|inline] [--keep-logs]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import concurrency as harness  # noqa: E402  (the shared worker and CPU helpers)

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from devtools.hosted_endpoint import HostedEndpoint  # noqa: E402
from devtools.scripted_gateway import ScriptedGateway  # noqa: E402


def _call(i: int) -> dict[str, Any]:
    return {"output": [{"type": "function_call", "name": "read_thing", "arguments": f'{{"label": "s{i}"}}'}]}


def run_ours(
    srv: EmbeddedRedis, gw: Any, turns: int, steps: int, stream: bool, logs: Path, calls: str = "async"
) -> dict[str, Any]:
    """``turns`` runtime turns of ``steps`` steps at once; ms per step and CPU per step."""
    import os

    homes = Path(tempfile.mkdtemp(prefix="bench-homes-"))
    env = {**os.environ, "REDIS_URL": srv.url, "OPENAI_BASE_URL": gw.base_url, "OPENAI_API_KEY": "bench",
           "AGENT_HOMES_ROOT": str(homes), "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:bench_tools",
           "AGENT_MODEL_STREAM": "1" if stream else "0", "AGENT_APPROVAL_MODE": "off", "AGENT_MODEL_CALLS": calls}  # fmt: skip
    env.pop("CONTROL_REDIS_URL", None)
    os.environ.update(REDIS_URL=srv.url, AGENT_EXTRA_TOOLSETS=env["AGENT_EXTRA_TOOLSETS"])
    from control.client import ControlPlane
    from worker.settings import get_settings

    get_settings.cache_clear()
    try:
        # Solo as deployed; an inline model call holds its thread, so ``--calls inline`` needs threads.
        pool, size = ("threads", 16) if calls == "inline" else ("solo", 1)
        steps_w = harness._spawn(harness._celery("tasks.app", "turns", pool, size), env, ROOT, logs / "p1-ours.log")
        tools_w = harness._spawn(
            harness._celery("tasks.app", "tools", "prefork", 2), env, ROOT, logs / "p1-ours-tools.log"
        )
    except BaseException:
        shutil.rmtree(homes, ignore_errors=True)
        raise
    r = redis.Redis.from_url(srv.control_url)
    try:
        harness._wait_heartbeat(r, steps_w.pid, steps_w, "the steps worker")
        harness._wait_heartbeat(r, tools_w.pid, tools_w, "the tools worker")
        control = ControlPlane(srv.control_url)
        request = {"input": "go", "model": f"p1-{steps}", "toolset": "testing", "max_model_calls": steps + 1}
        cpu_before = harness._cpu_all(srv, steps_w, tools_w)
        started = time.monotonic()
        ids = [control.enqueue({**request, "agent_id": f"p1-{i}"}) for i in range(turns)]
        while control.store.watched_count() and time.monotonic() < started + 300:
            time.sleep(0.01)
        wall = time.monotonic() - started
        n = turns * steps
        cpu = harness._cpu_delta(cpu_before, harness._cpu_all(srv, steps_w, tools_w), n)
        done = sum(control.status(tid).status.value == "completed" for tid in ids)
        return {"ms": wall * 1000 / n, "done": done, "cpu": cpu}
    finally:
        harness._stop([steps_w, tools_w])
        shutil.rmtree(homes, ignore_errors=True)  # the round's agents' homes (one folder per round)


def run_floor(srv: EmbeddedRedis, gw: Any, turns: int, steps: int, logs: Path) -> dict[str, Any]:
    """``turns`` bare chained turns of ``steps`` steps at once; the same shape of result."""
    import json
    import os

    posted = next(b for b in reversed(gw.requests) if b.get("tools"))
    body = {k: v for k, v in posted.items() if k not in ("model", "input", "stream")}
    env = {**os.environ, "REDIS_URL": srv.url, "BENCH_MODEL_URL": gw.base_url, "BENCH_MODEL": f"p1-{steps}",
           "BENCH_MODEL_BODY": json.dumps(body)}  # fmt: skip
    bench_dir = ROOT / "bench"
    steps_w = harness._spawn(
        harness._celery("bare_celery", "bare", "threads", 16), env, bench_dir, logs / "p1-bare.log"
    )
    tools_w = harness._spawn(
        harness._celery("bare_celery", "bare_tools", "prefork", 2), env, bench_dir, logs / "p1-bare-tools.log"
    )
    r = redis.Redis.from_url(srv.control_url)
    try:
        os.environ["REDIS_URL"] = srv.url
        import bare_celery

        bare_celery.app.conf.broker_url = srv.url
        time.sleep(6)  # no heartbeat in the floor: give both workers time to start
        r.delete("bare:done")
        cpu_before = harness._cpu_all(srv, steps_w, tools_w)
        started = time.monotonic()
        run = uuid.uuid4().hex[:6]
        for i in range(turns):
            bare_celery.bare_chain_step.apply_async((f"{run}-{i}", 0, steps), queue="bare")
        while r.llen("bare:done") < turns and time.monotonic() < started + 300:
            time.sleep(0.01)
        wall = time.monotonic() - started
        n = turns * steps
        cpu = harness._cpu_delta(cpu_before, harness._cpu_all(srv, steps_w, tools_w), n)
        return {"ms": wall * 1000 / n, "done": int(r.llen("bare:done")), "cpu": cpu}
    finally:
        harness._stop([steps_w, tools_w])


def parser() -> argparse.ArgumentParser:
    """The command line; its defaults are the README's setting (the module docstring)."""
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--turns", type=int, default=16, help="turns at once (default 16, the README's setting)")
    p.add_argument("--steps", type=int, default=20, help="steps per turn (default 20, the README's setting)")
    p.add_argument("--rounds", type=int, default=8, help="alternated rounds of floor and runtime (default 8)")
    p.add_argument("--stream", action="store_true", help="the runtime streams its model calls")
    p.add_argument("--calls", choices=("async", "inline"), default="async", help="the runtime's AGENT_MODEL_CALLS")
    p.add_argument("--keep-logs", action="store_true", help="keep the workers' logs (removed by default)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="bench-p1-"))
    keep = args.keep_logs
    srv = EmbeddedRedis()
    srv.start()
    script = {
        f"p1-{args.steps}": [_call(i) for i in range(args.steps - 1)]
        + [{"output": [{"type": "message", "text": "done"}]}]
    }
    gw = HostedEndpoint(ScriptedGateway(script)).start()
    print(
        f"P1: {args.turns} turns x {args.steps} steps at once; the runtime {'streams' if args.stream else 'posts JSON'}"
    )
    ratios = []
    try:
        for i in range(args.rounds):
            if i % 2:
                floor = run_floor(srv, gw, args.turns, args.steps, logs)
                ours = run_ours(srv, gw, args.turns, args.steps, args.stream, logs, args.calls)
            else:  # the runtime first: the floor posts the request body it posted
                ours = run_ours(srv, gw, args.turns, args.steps, args.stream, logs, args.calls)
                floor = run_floor(srv, gw, args.turns, args.steps, logs)
            ratios.append(ours["ms"] / floor["ms"])
            for name, m in (("chain", floor), ("runtime", ours)):
                keep = keep or m["done"] < args.turns  # an unfinished round keeps the logs to read
                print(f"round {i + 1} {name:8} {m['ms']:7.2f} ms/step  done {m['done']}/{args.turns}  CPU ms/step "
                      + " ".join(f"{k} {v:.2f}" for k, v in m["cpu"].items()), flush=True)  # fmt: skip
            print(f"round {i + 1} runtime / chain: {ratios[-1]:.2f}x", flush=True)
    except BaseException:
        keep = True
        raise
    finally:
        harness.stop_services(gw, srv, logs, keep)
    print(f"P1 runtime step / chain step, median of {args.rounds} rounds: {statistics.median(ratios):.2f}x "
          f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip


if __name__ == "__main__":
    main()
