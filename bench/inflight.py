"""Ten thousand turns in flight on one node, waiting on a slow model over keep-alive and streams.

N turns (``--turns``, 10,000) of (model call, one tool call, model call) against the scripted
gateway answering after ``--latency`` seconds (30), served by ``devtools.async_endpoint`` in a
process of its own (HTTP/1.1 keep-alive, the Responses API's server-sent events: the runtime
streams). One node: the steps' queue on ``--pool`` (solo, as deployed; or threads of ``--concurrency``,
16; model calls wait on the process's event loop, not a thread), the tool calls on prefork ``-c 2``, both with their
metrics server on (``AGENT_METRICS_PORT``): a deployment's health check is that ``/metrics``
answers (compose.yaml, deploy/kubernetes/workers.yaml). The turns are enqueued by ``--enqueuers``
processes through the Python client (``control.client.ControlPlane``).

Measured per round, while the turns run:
- wall time from the first enqueue to the last turn ended, against the ideal (2 x latency);
- lost turns (not ``completed``: unfinished or failed) and model calls that waited for their read
  timeout (``AGENT_MODEL_TIMEOUT``, ``--model-timeout``, 2 x latency: the turns' ``model_retry``
  events saying "timed out"), and model retries of any kind;
- the gateway's peak of requests in flight, and the steps worker's peak of open file descriptors;
- peak RSS of the node (the steps worker's ``VmHWM`` plus the tools worker's processes at their
  sampled peak), its sampled peak PSS (the RSS sum counts the pages a prefork parent shares with
  its children once per process; PSS splits them), and per 1,000 waiting turns: the steps worker's
  RSS over idle when the most calls were in flight, divided by them (thousands), and its peak
  over idle divided by the peak in flight;
- ``GET /metrics`` of the steps worker from a separate probe process every ``--probe-interval``
  seconds with a 10 s timeout (the health check's): failures, median, p99 and max latency;
- the node's heartbeat: the least time its ``agent:alive`` key had left (0 or less: the watchdog
  would have declared the node dead and re-driven its turns);
- CPU seconds of each part (steps worker, tools worker, Redis, gateway).

Run: ``.venv/bin/python bench/inflight.py [--turns 10000] [--latency 30] [--rounds 1]``; every
round and the median are printed. Raises the soft limit on open files to the hard one for the
processes it starts (10,000 connections need more than the usual 1,024; the worker raises its own).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from concurrency import _celery, _profile, _spawn, _stop, _stop_profile, _wait_heartbeat  # noqa: E402

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from devtools.ports import free_port  # noqa: E402
from worker.turn.store import TurnStore  # noqa: E402

SCRIPT = {
    "name": "bench",
    "steps": [
        {"output": [{"type": "function_call", "name": "read_thing", "arguments": '{"label": "x"}'}]},
        {"output": [{"type": "message", "text": "done"}]},
    ],
}
PROBE_TIMEOUT = 10.0  # seconds: the health check's timeout (compose.yaml, deploy/kubernetes/workers.yaml)


def _get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def probe(url: str, out: Path, interval: float) -> None:
    """In its own process until killed: ``GET url`` every ``interval`` s, a JSON line per probe
    ``{"at": epoch s, "s": latency s, "ok": bool}`` appended to ``out``."""
    with open(out, "a") as fh:
        while True:
            t0 = time.time()
            try:
                with urllib.request.urlopen(url, timeout=PROBE_TIMEOUT) as resp:
                    ok = resp.status == 200 and b"agent_turns_in_flight" in resp.read()
            except Exception:
                ok = False
            fh.write(json.dumps({"at": t0, "s": time.time() - t0, "ok": ok}) + "\n")
            fh.flush()
            time.sleep(max(0.0, interval - (time.time() - t0)))


_control: Any = None  # an enqueuer process's client


def _connect(url: str) -> None:
    """An enqueuer process's initializer: its ``ControlPlane`` (imports and connection made before the clock starts)."""
    global _control
    from control.client import ControlPlane

    _control = ControlPlane(url)


def _ready(_: int) -> None:
    time.sleep(0.5)  # one task per enqueuer process: each has run its initializer when all are back


def _enqueue(args: tuple[int, int, str]) -> list[str]:
    """In an enqueuer process: turns ``lo``..``hi - 1`` enqueued through the Python client; their ids."""
    lo, hi, run = args
    return [
        _control.enqueue({"agent_id": f"i{run}-{i}", "input": "go", "model": "bench", "toolset": "testing"})
        for i in range(lo, hi)
    ]


def _rss_mb(proc: psutil.Process, children: bool = False) -> float:
    try:
        procs = [proc, *proc.children(recursive=True)] if children else [proc]
        return sum(p.memory_info().rss for p in procs) / 2**20
    except psutil.NoSuchProcess:
        return 0.0


def _pss_mb(proc: psutil.Process, children: bool = False) -> float:
    """Proportional set size (MB) of ``proc`` (and its children): a page shared by n processes
    counts 1/n in each. The RSS of a prefork parent and its children counts every page they
    share (copy-on-write after the fork) once per process."""
    total = 0
    try:
        for p in [proc, *proc.children(recursive=True)] if children else [proc]:
            for line in Path(f"/proc/{p.pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    except (psutil.NoSuchProcess, FileNotFoundError):
        pass
    return total / 1024


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu(pid: int) -> float:
    try:
        proc = psutil.Process(pid)
        return sum(p.cpu_times().user + p.cpu_times().system for p in [proc, *proc.children(recursive=True)])
    except psutil.NoSuchProcess:
        return float("nan")


class Sampler:
    """Every ``interval`` s until ``stop``: the node's RSS and open files, the gateway's requests
    in flight and the heartbeat's time left; keeps the peaks (and the least time left)."""

    def __init__(self, steps: int, tools: int, stats_url: str, r: redis.Redis, alive_key: str, interval: float = 0.5):
        self.steps, self.tools = psutil.Process(steps), psutil.Process(tools)
        self.stats_url, self.r, self.alive_key, self.interval = stats_url, r, alive_key, interval
        self.turns = TurnStore(r)
        self.peak: dict[str, float] = {"tools_rss": 0.0, "steps_rss": 0.0, "fds": 0, "in_flight": 0, "watched": 0,
                                       "node_pss": 0.0}  # fmt: skip
        self.heartbeat_left = float("inf")
        self.timeline: list[tuple[float, float, int, int]] = []  # (monotonic s, steps RSS MB, in flight, turns left)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                now = {"tools_rss": _rss_mb(self.tools, children=True), "steps_rss": _rss_mb(self.steps),
                       "fds": self.steps.num_fds(), "in_flight": _get_json(self.stats_url)["in_flight"],
                       "watched": self.turns.watched_count(),
                       "node_pss": _pss_mb(self.steps) + _pss_mb(self.tools, children=True)}  # fmt: skip
                self.heartbeat_left = min(self.heartbeat_left, self.r.pttl(self.alive_key) / 1000)
            except Exception as exc:  # a sample missed is not a result
                print(f"  (sample failed: {exc})", flush=True)
                continue
            for k, v in now.items():
                self.peak[k] = max(self.peak[k], v)
            self.timeline.append((time.monotonic(), now["steps_rss"], now["in_flight"], now["watched"]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _probe_summary(path: Path, start: float, end: float) -> dict[str, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if start <= r["at"] <= end]
    lat = sorted(r["s"] for r in rows)
    if not lat:
        return {"n": 0, "failed": 0, "p50": float("nan"), "p99": float("nan"), "max": float("nan")}
    return {"n": len(rows), "failed": sum(not r["ok"] for r in rows), "p50": statistics.median(lat),
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))], "max": lat[-1]}  # fmt: skip


def run_round(srv: EmbeddedRedis, args: argparse.Namespace, logs: Path, scripts: Path, n_round: int) -> dict[str, Any]:
    """One round on fresh processes (gateway, steps and tools workers); the figures of the module docstring."""
    gw_port, metrics_port = free_port(), free_port(2)
    gateway = _spawn([sys.executable, "-m", "devtools.async_endpoint", "--port", str(gw_port), "--scripts",
                      str(scripts), "--latency", str(args.latency)], dict(os.environ), ROOT, logs / "gateway.log")  # fmt: skip
    homes = Path(tempfile.mkdtemp(prefix="bench-homes-"))
    env = {
        **os.environ,
        "REDIS_URL": srv.url,
        "OPENAI_BASE_URL": f"http://127.0.0.1:{gw_port}/v1",
        "OPENAI_API_KEY": "bench",
        "AGENT_HOMES_ROOT": str(homes),
        "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
        "AGENT_MODEL_STREAM": "1",
        "AGENT_APPROVAL_MODE": "off",
        "AGENT_MODEL_TIMEOUT": str(args.model_timeout),
        "AGENT_METRICS_PORT": str(metrics_port),
    }
    env.pop("CONTROL_REDIS_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    # The enqueuers (spawned) and this process's client read their settings from the environment.
    os.environ.update(REDIS_URL=srv.url, AGENT_EXTRA_TOOLSETS=env["AGENT_EXTRA_TOOLSETS"])
    os.environ.pop("CONTROL_REDIS_URL", None)
    tools_env = {**env, "AGENT_METRICS_PORT": str(metrics_port + 1)}
    pool, concurrency = (args.pool, args.concurrency) if args.pool == "threads" else (args.pool, 1)
    steps = _spawn(_celery("tasks.app", "turns", pool, concurrency), env, ROOT, logs / f"steps-{n_round}.log")
    tools = _spawn(_celery("tasks.app", "tools", "prefork", 2), tools_env, ROOT, logs / f"tools-{n_round}.log")
    probe_out = logs / f"probe-{n_round}.jsonl"
    prober = None
    r = redis.Redis.from_url(srv.control_url)
    try:
        _wait_heartbeat(r, steps.pid, steps, "the steps worker")
        _wait_heartbeat(r, tools.pid, tools, "the tools worker")
        stats_url = f"http://127.0.0.1:{gw_port}/stats"
        _get_json(stats_url)
        prober = subprocess.Popen([sys.executable, __file__, "--probe", f"http://127.0.0.1:{metrics_port}/metrics",
                                   "--probe-out", str(probe_out), "--probe-interval", str(args.probe_interval)])  # fmt: skip
        time.sleep(2)
        idle_rss = _rss_mb(psutil.Process(steps.pid))
        idle_tools = _rss_mb(psutil.Process(tools.pid), children=True)
        cpu0 = {k: _cpu(p) for k, p in (("steps", steps.pid), ("tools", tools.pid), ("redis", srv.proc.pid),
                                        ("gateway", gateway.pid))}  # fmt: skip
        n, k = args.turns, args.enqueuers
        run = f"{n_round}{os.getpid()}"
        pool = multiprocessing.get_context("spawn").Pool(k, initializer=_connect, initargs=(srv.control_url,))
        pool.map(_ready, range(k), chunksize=1)
        profiler = _profile(steps.pid, f"inflight-{n_round}")  # BENCH_PROFILE=<prefix>: py-spy (development)
        sampler = Sampler(steps.pid, tools.pid, stats_url, r, f"agent:alive:{os.uname().nodename}:{steps.pid}")
        t_start, started = time.time(), time.monotonic()
        with pool:
            parts = pool.map(_enqueue, [(i * n // k, (i + 1) * n // k, run) for i in range(k)], chunksize=1)
        ids = [tid for part in parts for tid in part]
        enqueued = time.monotonic() - started
        deadline = started + args.deadline
        while sampler.turns.watched_count() and time.monotonic() < deadline:
            time.sleep(0.2)
        wall, t_end = time.monotonic() - started, time.time()
        sampler.stop()
        _stop_profile(profiler)
        cpu = {k: _cpu(p) - cpu0[k] for k, p in (("steps", steps.pid), ("tools", tools.pid), ("redis", srv.proc.pid),
                                                 ("gateway", gateway.pid))}  # fmt: skip
        steps_hwm = _hwm_mb(steps.pid)
        gw_stats = _get_json(stats_url)
        from control.client import ControlPlane
        from worker.settings import get_settings

        get_settings.cache_clear()
        control = ControlPlane(srv.control_url)
        statuses = [s.value if s else None for s in control.store.statuses(ids)]
        lost = sum(s != "completed" for s in statuses)
        reasons: Counter[str] = Counter()
        for tid in ids:
            reasons.update(e.get("error", "")[:70] for e in control.events(tid) if e.get("kind") == "model_retry")
        timed_out = sum(v for k, v in reasons.items() if "timed out" in k)
        retries = sum(reasons.values())
        in_flight_k = max(sampler.peak["in_flight"], 1) / 1000
        at_peak = max(sampler.timeline, key=lambda row: row[2], default=(0.0, idle_rss, 1, 0))
        waiting_per_1000 = (at_peak[1] - idle_rss) / max(at_peak[2], 1) * 1000  # MB, at the peak in flight
        every = max(1, round(10 / sampler.interval))  # a row per 10 s
        timeline = [(t - started, rss, f, w) for t, rss, f, w in sampler.timeline[::every] if t >= started]
        return {
            "wall": wall, "enqueue": enqueued, "lost": lost, "reasons": reasons.most_common(3), "timed_out": timed_out, "retries": retries,
            "peak_in_flight": int(sampler.peak["in_flight"]), "gateway_peak": gw_stats["peak_in_flight"],
            "connections": gw_stats["connections"], "fds": int(sampler.peak["fds"]),
            "node_rss": steps_hwm + sampler.peak["tools_rss"], "node_pss": sampler.peak["node_pss"], "steps_hwm": steps_hwm, "steps_idle": idle_rss,
            "tools_peak": sampler.peak["tools_rss"], "tools_idle": idle_tools,
            "per_1000": (steps_hwm - idle_rss) / in_flight_k, "waiting_per_1000": waiting_per_1000, "node_per_1000": (steps_hwm + sampler.peak["tools_rss"]) / in_flight_k,
            "heartbeat_left": sampler.heartbeat_left, "timeline": timeline, "probe": _probe_summary(probe_out, t_start, t_end), "cpu": cpu,
        }  # fmt: skip
    finally:
        if prober is not None:
            prober.kill()
            prober.wait()
        _stop([steps, tools, gateway])
        shutil.rmtree(homes, ignore_errors=True)


def _print(i: int, m: dict[str, Any], ideal: float) -> None:
    p = m["probe"]
    print(f"round {i}: wall {m['wall']:.1f} s ({m['wall'] / ideal:.2f}x the ideal {ideal:g} s; enqueue {m['enqueue']:.1f} s), "
          f"lost {m['lost']}, read-timeout waits {m['timed_out']} (model retries {m['retries']}: {m['reasons']}), "
          f"in flight at the gateway {m['peak_in_flight']} (its own peak {m['gateway_peak']}, {m['connections']} connections), "
          f"steps worker open files {m['fds']}", flush=True)  # fmt: skip
    print(f"  RSS: node peak {m['node_rss']:.0f} MB, PSS {m['node_pss']:.0f} MB (steps worker {m['steps_hwm']:.0f} MB, idle {m['steps_idle']:.0f}; "
          f"tools worker {m['tools_peak']:.0f} MB, idle {m['tools_idle']:.0f}); per 1,000 waiting turns: "
          f"{m['waiting_per_1000']:.1f} MB over idle at the peak in flight, {m['per_1000']:.1f} MB over idle at the "
          f"steps worker's peak, {m['node_per_1000']:.1f} MB of node peak", flush=True)  # fmt: skip
    print(f"  /metrics during the run: {p['n']} probes, {p['failed']} failed, median {p['p50'] * 1000:.0f} ms, "
          f"p99 {p['p99'] * 1000:.0f} ms, max {p['max'] * 1000:.0f} ms; heartbeat least time left "
          f"{m['heartbeat_left']:.2f} s; CPU s: " + ", ".join(f"{k} {v:.1f}" for k, v in m["cpu"].items()), flush=True)  # fmt: skip
    print("  every 10 s (s: steps worker RSS MB / model calls in flight / turns not ended): "
          + ", ".join(f"{t:.0f}: {rss:.0f}/{f}/{w}" for t, rss, f, w in m["timeline"]), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--latency", type=float, default=30.0, help="seconds the model takes to answer")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--pool", choices=("solo", "threads"), default="solo", help="the steps worker's pool (solo, as deployed)"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="threads of the steps worker (--pool threads)")
    parser.add_argument("--enqueuers", type=int, default=2, help="processes enqueueing the turns")
    parser.add_argument("--model-timeout", type=float, default=0.0, help="read timeout (s); default 2 x latency")
    parser.add_argument("--probe-interval", type=float, default=1.0, help="seconds between /metrics probes")
    parser.add_argument(
        "--deadline", type=float, default=600.0, help="seconds a round may take before the rest count as lost"
    )
    parser.add_argument("--probe", help=argparse.SUPPRESS)
    parser.add_argument("--probe-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe(args.probe, args.probe_out, args.probe_interval)
        return
    args.model_timeout = args.model_timeout or 2 * args.latency
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    logs = Path(tempfile.mkdtemp(prefix="bench-inflight-"))
    scripts = logs / "scripts"
    scripts.mkdir()
    (scripts / "bench.json").write_text(json.dumps(SCRIPT))
    srv = EmbeddedRedis(extra_args=("--maxclients", "20000"))
    srv.start()
    ideal = 2 * args.latency
    print(f"{args.turns} turns (model {args.latency:g} s streamed, tool call, model {args.latency:g} s) on one node; "
          f"ideal {ideal:g} s; read timeout {args.model_timeout:g} s; open files limit {hard} (was {soft}); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    walls = []
    try:
        for i in range(args.rounds):
            m = run_round(srv, args, logs, scripts, i)
            walls.append(m["wall"])
            _print(i, m, ideal)
        print(f"median wall of {len(walls)} rounds: {statistics.median(walls):.1f} s "
              f"({statistics.median(walls) / ideal:.2f}x the ideal; rounds: {', '.join(f'{w:.1f}' for w in walls)}); "
              f"load average after {os.getloadavg()[0]:.2f}")  # fmt: skip
    finally:
        srv.stop()
        print(f"logs: {logs}")


if __name__ == "__main__":
    main()
