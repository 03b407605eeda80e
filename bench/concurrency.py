"""Turns in flight on one node: the runtime against a hand-written minimal turn on bare Celery.

N turns of (model call, one tool call, model call) against a model endpoint that answers in
``--latency`` seconds, on one node. The endpoint (``--endpoint``) is by default the scripted
gateway behind ``devtools.hosted_endpoint``: HTTP/1.1 keep-alive and chunked streams, as a
hosted API answers (``scripted``: the bare gateway, a connection per request); ``--stream``
makes the runtime stream its model calls (the floor posts JSON). Model calls that waited for
their read timeout (``--model-timeout``, 30 s) are counted from the turns' ``model_retry`` events.
The node runs the steps' queue on ``--ours-pool`` (solo, as
deployed), the tool calls on prefork (as deployed). The floor is ``bench/bare_celery.py``: the same
turn shape as three bare Celery tasks on the same broker and endpoint (its steps on ``--pools``,
threads by default: a bare model call holds its thread; its tools on prefork), posting the same
request body as the runtime (its tool definitions; ``--floor-body minimal`` posts only the model
and the input), with nothing of the runtime (no turn store, fencing, validation or events). Both
run in this one process's measurement, in alternation (who goes first alternates too), against
one embedded Redis.

Printed per run: wall time and its ratio to the ideal (2 x latency) and to the floor, turns/s,
peak model calls in flight (counted by the gateway), unfinished turns, the peak RSS of the steps'
worker, Redis commands per turn, and the CPU milliseconds per turn of each part sharing the
cores (steps worker, tools worker with its pool children, Redis, this process: gateway and
enqueueing). Run: ``.venv/bin/python bench/concurrency.py [--turns 1000] [--rounds 4]``.
Development knobs: ``BENCH_PROFILE=<prefix>`` (py-spy profiles of both steps workers),
``BENCH_SYS=1`` (the steps worker's system time and context switches); ``--commands`` prints
the Redis commands per turn per command name.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from devtools.hosted_endpoint import HostedEndpoint  # noqa: E402
from devtools.scripted_gateway import ScriptedGateway  # noqa: E402
from devtools.workers import worker_argv  # noqa: E402

MODEL_TIMEOUT = 30.0
STREAM = "0"


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by ``pid`` and its live descendants."""
    try:
        proc = psutil.Process(pid)
        total = 0.0
        for p in [proc, *proc.children(recursive=True)]:
            t = p.cpu_times()
            total += t.user + t.system
        return total
    except psutil.NoSuchProcess:
        return float("nan")


def _profile(pid: int, name: str, children: bool = False) -> subprocess.Popen | None:
    """With ``BENCH_PROFILE=<prefix>`` (development), py-spy samples the steps worker ``pid`` while
    it holds the GIL, into ``<prefix>-<name>.txt`` (py-spy's raw format)."""
    prefix = os.environ.get("BENCH_PROFILE")
    if not prefix:
        return None
    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "-f", "raw", "-r", "100", "--gil"]
    spy += ["--subprocesses", "--pid"] if children else ["--pid"]
    proc = subprocess.Popen([*spy, str(pid), "-o", f"{prefix}-{name}.txt"], stdout=subprocess.DEVNULL)
    time.sleep(1)
    return proc


def _stop_profile(proc: subprocess.Popen | None) -> None:
    if proc is not None:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _cpu_all(srv: EmbeddedRedis, steps: subprocess.Popen, tools: subprocess.Popen) -> dict[str, float]:
    """CPU seconds so far of each part sharing the cores: the steps worker, the tools worker (with
    its pool children), Redis, and this process (the gateway's threads and the enqueueing)."""
    me = psutil.Process().cpu_times()
    out = {"steps": _cpu_s(steps.pid), "tools": _cpu_s(tools.pid), "redis": _cpu_s(srv.proc.pid),
           "bench": me.user + me.system}  # fmt: skip
    if os.environ.get("BENCH_SYS"):  # development: the steps worker's system time and context switches
        p = psutil.Process(steps.pid)
        out["steps_sys"] = p.cpu_times().system
        out["steps_ctxsw/1000"] = sum(p.num_ctx_switches()) / 1000
    return out


def _cpu_delta(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    """CPU milliseconds per turn of each part between two ``_cpu_all`` readings."""
    return {k: (after[k] - before[k]) * 1000 / n for k in before}


def _redis_calls(r: redis.Redis) -> dict[str, int]:
    """Commands Redis has run so far (all clients), per command name (``INFO commandstats``: a
    command a Lua script runs counts as one, like one a client sends, and so do ``MULTI`` and
    ``EXEC``). ``_per_turn`` turns two readings into the figures printed."""
    stats = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _per_turn(before: dict[str, int], after: dict[str, int], n: int) -> tuple[float, dict[str, float]]:
    """Commands per turn between two ``_redis_calls`` readings: the total and per command."""
    per = {k: (after.get(k, 0) - before.get(k, 0)) / n for k in after}
    per = {k: v for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if v}
    return sum(per.values()), per


def _spawn(cmd: list[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True
    )


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def stop_services(gw: Any, srv: EmbeddedRedis, logs: Path, keep: bool) -> None:
    """End a bench run: stop the model endpoint and the embedded Redis, then remove the workers'
    logs (``logs``) unless ``keep`` (then say where they are)."""
    gw.stop()
    srv.stop()
    if keep:
        print(f"logs kept: {logs}")
    else:
        shutil.rmtree(logs, ignore_errors=True)


def _wait_heartbeat(r: redis.Redis, pid: int, proc: subprocess.Popen, what: str) -> None:
    host = os.uname().nodename
    deadline = time.monotonic() + 60
    while not r.exists(f"agent:alive:{host}:{pid}"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.1)
    time.sleep(1.0)


def _celery(app: str, queues: str, pool: str, concurrency: int) -> list[str]:
    name = f"{uuid.uuid4().hex[:6]}@%h"
    return worker_argv(queues, name=name, pool=pool, concurrency=concurrency, loglevel="WARNING", app=app)


def run_ours(srv: EmbeddedRedis, gw: Any, n: int, pool: str, concurrency: int, logs: Path) -> dict:
    """``n`` runtime turns on a fresh steps worker (``pool``, ``concurrency``) and a prefork tools worker.
    Returns ``{"wall" s, "peak" calls in flight, "unfinished", "failed", "rss" MB, "enqueue" s, "redis_calls"}``."""
    homes = Path(tempfile.mkdtemp(prefix="bench-homes-"))
    env = {
        **os.environ,
        "REDIS_URL": srv.url,
        "OPENAI_BASE_URL": gw.base_url,
        "OPENAI_API_KEY": "bench",
        "AGENT_HOMES_ROOT": str(homes),
        # read_thing without the tests' log line: the floor's tool does no I/O of its own either
        "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:bench_tools",
        "AGENT_MODEL_STREAM": STREAM,  # "0" by default: the floor posts plain JSON, same wire for both
        "AGENT_APPROVAL_MODE": "off",
        "AGENT_MODEL_TIMEOUT": str(MODEL_TIMEOUT),
    }
    env.pop("CONTROL_REDIS_URL", None)
    os.environ.update(REDIS_URL=srv.url, AGENT_EXTRA_TOOLSETS=env["AGENT_EXTRA_TOOLSETS"])
    from control.client import ControlPlane
    from worker.settings import get_settings

    get_settings.cache_clear()

    steps = _spawn(_celery("tasks.app", "turns", pool, concurrency), env, ROOT, logs / f"ours-{pool}.log")
    tools = _spawn(_celery("tasks.app", "tools", "prefork", 2), env, ROOT, logs / f"ours-{pool}-tools.log")
    r = redis.Redis.from_url(srv.control_url)
    try:
        _wait_heartbeat(r, steps.pid, steps, "the steps worker")
        _wait_heartbeat(r, tools.pid, tools, "the tools worker")
        control = ControlPlane(srv.control_url)
        profiler = _profile(steps.pid, "ours")
        tools_profiler = _profile(tools.pid, "ours-tools", children=True)
        gw.peak_in_flight = 0
        del gw.requests[:-1]  # the bodies received so far (the floor reads the newest)
        calls_before = _redis_calls(r)
        cpu_before = _cpu_all(srv, steps, tools)
        started = time.monotonic()
        ids = [
            control.enqueue({"agent_id": f"b{i}", "input": "go", "model": "bench", "toolset": "testing"})
            for i in range(n)
        ]
        enqueued = time.monotonic() - started
        # Unfinished turns: those still watched by the watchdog (one ZCARD, as cheap as the floor's LLEN).
        deadline = started + 120 + n * 0.05
        while control.store.watched_count() and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.monotonic() - started
        cpu = _cpu_delta(cpu_before, _cpu_all(srv, steps, tools), n)
        # Read now: the bench's own reads below (statuses, events) are not the turns' commands.
        calls, per_command = _per_turn(calls_before, _redis_calls(r), n)
        _stop_profile(profiler)
        _stop_profile(tools_profiler)
        statuses = [s.value if s else None for s in control.store.statuses(ids)]
        failed = sum(s not in ("completed", None) for s in statuses)
        pending = [tid for tid, s in zip(ids, statuses) if s in (None, "queued", "running")]
        timed_out = sum(
            1
            for tid in ids
            for e in control.events(tid)
            if e.get("kind") == "model_retry" and "timed out" in e["error"]
        )
        return {"wall": wall, "peak": gw.peak_in_flight, "unfinished": len(pending), "failed": failed,
                "timed_out": timed_out,
                "rss": _peak_rss_mb(steps.pid), "enqueue": enqueued, "cpu": cpu,
                "redis_calls": calls, "per_command": per_command}  # fmt: skip
    finally:
        _stop([steps, tools])
        shutil.rmtree(homes, ignore_errors=True)


def run_bare(
    srv: EmbeddedRedis, gw: Any, n: int, pool: str, concurrency: int, logs: Path, minimal: bool = False
) -> dict:
    """``n`` floor turns (``bench/bare_celery.py``) on the same pools; returns the same shape as ``run_ours``."""
    # The floor posts the body the runtime posted (its tools...), with its own model and input, as
    # JSON (the runtime may stream: ``--stream``);
    # ``minimal=True``: only the model and the input (no tool definitions).
    posted = next(b for b in reversed(gw.requests) if b.get("tools"))
    body = {} if minimal else {k: v for k, v in posted.items() if k not in ("model", "input", "stream")}
    env = {**os.environ, "REDIS_URL": srv.url, "BENCH_MODEL_URL": gw.base_url, "BENCH_MODEL": "bench",
           "BENCH_MODEL_TIMEOUT": str(MODEL_TIMEOUT),
           "BENCH_MODEL_BODY": json.dumps(body)}  # fmt: skip
    bench_dir = ROOT / "bench"
    steps = _spawn(_celery("bare_celery", "bare", pool, concurrency), env, bench_dir, logs / f"bare-{pool}.log")
    tools = _spawn(_celery("bare_celery", "bare_tools", "prefork", 2), env, bench_dir, logs / f"bare-{pool}-tools.log")
    r = redis.Redis.from_url(srv.control_url)
    try:
        os.environ["REDIS_URL"] = srv.url
        sys.path.insert(0, str(bench_dir))
        import bare_celery

        bare_celery.app.conf.broker_url = srv.url
        time.sleep(6)  # no heartbeat in the floor: give both workers time to start
        if steps.poll() is not None or tools.poll() is not None:
            raise SystemExit("the bare Celery workers did not start")
        r.delete("bare:done", "bare:timed_out")
        profiler = _profile(steps.pid, "bare")
        tools_profiler = _profile(tools.pid, "bare-tools", children=True)
        gw.peak_in_flight = 0
        calls_before = _redis_calls(r)
        cpu_before = _cpu_all(srv, steps, tools)
        started = time.monotonic()
        run = uuid.uuid4().hex[:6]  # fresh conversations every round
        for i in range(n):
            bare_celery.bare_step.apply_async((f"{run}-{i}", 0), queue="bare")
        enqueued = time.monotonic() - started
        deadline = started + 120 + n * 0.05
        while r.llen("bare:done") < n and time.monotonic() < deadline:
            time.sleep(0.05)
        wall = time.monotonic() - started
        cpu = _cpu_delta(cpu_before, _cpu_all(srv, steps, tools), n)
        calls, per_command = _per_turn(calls_before, _redis_calls(r), n)
        _stop_profile(profiler)
        _stop_profile(tools_profiler)
        return {"wall": wall, "peak": gw.peak_in_flight, "unfinished": n - r.llen("bare:done"), "failed": 0,
                "timed_out": int(r.get("bare:timed_out") or 0),
                "rss": _peak_rss_mb(steps.pid), "enqueue": enqueued, "cpu": cpu,
                "redis_calls": calls, "per_command": per_command}  # fmt: skip
    finally:
        _stop([steps, tools])


def _ours_pool(args: argparse.Namespace, floor_pool: str) -> tuple[str, int]:
    """The runtime's steps pool and its size: ``--ours-pool`` (``same``: the floor's), solo's 1, else
    ``--ours-concurrency`` or 16 (threads) or 8 (prefork)."""
    pool = floor_pool if args.ours_pool == "same" else args.ours_pool
    return pool, 1 if pool == "solo" else args.ours_concurrency or (16 if pool == "threads" else 8)


def main() -> None:
    global MODEL_TIMEOUT, STREAM
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds the model takes to answer")
    parser.add_argument("--pools", default="threads", help="comma-separated: threads, prefork")
    parser.add_argument(
        "--concurrency", type=int, default=0, help="the floor's pool; default: turns (threads) or 8 (prefork)"
    )
    parser.add_argument("--ours-pool", default="solo",
                        help="the runtime's steps pool: solo (as deployed), threads, prefork, or 'same' (the floor's)")  # fmt: skip
    parser.add_argument("--ours-concurrency", type=int, default=0,
                        help="the runtime's steps pool size; default: 16 (threads: model calls wait on the event loop) or 8 (prefork)")  # fmt: skip
    parser.add_argument("--p2", action="store_true",
                        help="P2 instead: the runtime alone at --latency and at 0 s, alternated; turns/s and CPU per turn")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=4, help="alternated floor/runtime rounds per pool")
    parser.add_argument(
        "--floor-body",
        choices=("same", "minimal"),
        default="same",
        help="the floor's request body: the runtime's (tool definitions included) or only model and input",
    )
    parser.add_argument("--endpoint", choices=("hosted", "scripted"), default="hosted",
                        help="keep-alive HTTP/1.1 like a hosted API, or the scripted gateway (a connection per request)")  # fmt: skip
    parser.add_argument("--stream", action="store_true", help="the runtime streams its model calls")
    parser.add_argument("--model-timeout", type=float, default=MODEL_TIMEOUT, help="the model call's read timeout")
    parser.add_argument("--commands", action="store_true",
                        help="also print each round's Redis commands per turn, per command name")  # fmt: skip
    args = parser.parse_args()
    MODEL_TIMEOUT, STREAM = args.model_timeout, "1" if args.stream else "0"
    logs = Path(tempfile.mkdtemp(prefix="bench-concurrency-"))
    srv = EmbeddedRedis()
    srv.start()
    step = {"output": [{"type": "function_call", "name": "read_thing", "arguments": '{"label": "x"}'}]}
    script = {"bench": [step, {"output": [{"type": "message", "text": "done"}]}]}
    if args.endpoint == "hosted":
        gw: Any = HostedEndpoint(ScriptedGateway(script), latency=args.latency).start()
    else:
        gw = ScriptedGateway(script, latency=args.latency, streaming=args.stream).start()
    print(f"model endpoint: {args.endpoint}; the runtime {'streams' if args.stream else 'posts JSON'}")
    ideal = 2 * args.latency
    print(f"{args.turns} turns (model {args.latency:g} s, tool call, model {args.latency:g} s); ideal {ideal:g} s")
    print(f"{'pool':10} {'runtime':8} {'wall s':>7} {'/ideal':>7} {'/floor':>7} {'turns/s':>8} {'in flight':>9} "
          f"{'unfinished':>10} {'failed':>6} {'timed out':>9} {'RSS MB':>7} {'enqueue s':>9} {'Redis cmds/turn':>15}   CPU ms/turn")  # fmt: skip
    try:
        if args.p2:
            for pool in args.pools.split(","):
                p2(srv, gw, args, *_ours_pool(args, pool), logs)
            return
        for pool in args.pools.split(","):
            c = args.concurrency or (args.turns if pool == "threads" else 8)
            op, oc = _ours_pool(args, pool)
            ratios = []
            for i in range(args.rounds):  # alternated, and which goes first too: drift hits both alike
                if i % 2:
                    bare = run_bare(srv, gw, args.turns, pool, c, logs, args.floor_body == "minimal")
                    ours = run_ours(srv, gw, args.turns, op, oc, logs)
                else:  # the runtime first: the floor posts the request body it posted
                    ours = run_ours(srv, gw, args.turns, op, oc, logs)
                    bare = run_bare(srv, gw, args.turns, pool, c, logs, args.floor_body == "minimal")
                ratios.append(ours["wall"] / bare["wall"])
                for name, m, pp, cc in (("bare", bare, pool, c), ("ours", ours, op, oc)):
                    print(f"{pp + ' -c ' + str(cc):10} {name:8} {m['wall']:7.2f} {m['wall'] / ideal:7.2f} "
                          f"{m['wall'] / bare['wall']:7.2f} {args.turns / m['wall']:8.1f} {m['peak']:9d} "
                          f"{m['unfinished']:10d} {m['failed']:6d} {m['timed_out']:9d} {m['rss']:7.0f} {m['enqueue']:9.2f} "
                          f"{m['redis_calls']:15.0f}   "
                          + " ".join(f"{k} {v:.1f}" for k, v in m["cpu"].items()), flush=True)  # fmt: skip
                    if args.commands:
                        print(
                            f"  {name} commands/turn: " + ", ".join(f"{k} {v:.2f}" for k, v in m["per_command"].items())
                        )
            print(f"{pool}: runtime / floor, median of {args.rounds} rounds: {statistics.median(ratios):.2f}x "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")  # fmt: skip
    finally:
        gw.stop()
        srv.stop()
        print(f"logs: {logs}")


def p2(srv: EmbeddedRedis, gw: Any, args: argparse.Namespace, pool: str, concurrency: int, logs: Path) -> None:
    """P2: the runtime's turns/s with the model at ``args.latency`` against the same at 0 s, on
    one node, in alternated rounds (which latency goes first alternates too); the median ratio,
    and the steps worker's CPU milliseconds per turn at each latency."""
    ratios, cpu = [], {0.0: [], args.latency: []}
    for i in range(args.rounds):
        order = (args.latency, 0.0) if i % 2 else (0.0, args.latency)
        rate = {}
        for latency in order:
            gw.latency = latency
            m = run_ours(srv, gw, args.turns, pool, concurrency, logs)
            rate[latency] = args.turns / m["wall"]
            cpu[latency].append(m["cpu"]["steps"])
            print(f"{pool} -c {concurrency}  latency {latency:g} s: {m['wall']:7.2f} s, {rate[latency]:7.1f} turns/s, "
                  f"in flight {m['peak']}, unfinished {m['unfinished']}, failed {m['failed']}, timed out {m['timed_out']}, "
                  + " ".join(f"{k} {v:.1f}" for k, v in m["cpu"].items()) + " CPU ms/turn", flush=True)  # fmt: skip
        ratios.append(rate[args.latency] / rate[0.0])
    gw.latency = args.latency
    print(f"P2 ({pool}): turns/s at {args.latency:g} s / at 0 s, median of {args.rounds} rounds: "
          f"{statistics.median(ratios):.2f} (rounds: {', '.join(f'{r:.2f}' for r in ratios)}); steps worker CPU per "
          f"turn, median: {statistics.median(cpu[args.latency]):.1f} ms at {args.latency:g} s, "
          f"{statistics.median(cpu[0.0]):.1f} ms at 0 s")  # fmt: skip


if __name__ == "__main__":
    main()
