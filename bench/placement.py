"""The cost of placement routing per computer call, against an unrouted call, in the same run.

One embedded Redis, the scripted gateway, one worker (``--pool solo`` by default) that serves every
queue and is therefore a node holding homes. Its toolset (``toolset`` below) offers ``read_file``
twice: the catalog's tool (``needs_computer``: located in the placement records when its batch is
dispatched, sent to the node's queue, admitted by the node: a second lookup, the agent's lock and
its epoch file) and the very same tool with ``needs_computer=False`` (sent to ``tools``, run as is).

Measured, alternating rounds of routed and unrouted turns (this VM's speed drifts):
- a turn whose one step fans out ``--group`` parallel calls of one kind: time per call;
- in-process micro costs: ``Placement.locate`` (one Lua script) and ``NodeHomes.admit`` +
  ``release``, against a Redis ``PING`` round trip (their floor).

Run: ``.venv/bin/python bench/placement.py`` (heavy: through ``flock /tmp/bench.lock`` on a shared machine).
"""

from __future__ import annotations

import argparse
import dataclasses
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


def toolset(ctx):
    """The worker's toolset: ``read_file`` routed (the catalog's) and ``read_file_unrouted``."""
    from worker.tools.computer.catalog import create_computer_tools

    read = next(t for t in create_computer_tools(ctx) if t.name == "read_file")
    return [read, dataclasses.replace(read, name="read_file_unrouted", needs_computer=False)]


def _micro(url: str, n: int) -> tuple[float, float, float]:
    """(PING, locate, admit + release) in microseconds, medians of ``n``."""
    import redis

    from worker.placement.homes import NodeHomes
    from worker.placement.records import Placement
    from worker.settings import Settings

    r = redis.Redis.from_url(url)
    p = Placement(r, ttl=60)
    p.beat("bench-node")
    homes = NodeHomes(p, Settings(homes_root=tempfile.mkdtemp(prefix="bench-micro-")), "bench-node", None)

    def timed(fn) -> float:
        samples = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples) * 1e6

    def admit() -> None:
        homes.admit("micro-agent", destructive=False).release()

    admit()
    return timed(r.ping), timed(lambda: p.locate("micro-agent")), timed(admit)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--group", type=int, default=32, help="parallel calls in the turn's one step")
    parser.add_argument("--rounds", type=int, default=7, help="pairs of routed / unrouted turns")
    parser.add_argument("--pool", default="solo")
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()

    from devtools.embedded_redis import EmbeddedRedis
    from worker.model.scripted_gateway import ScriptedGateway

    redis_srv = EmbeddedRedis()
    url = redis_srv.start()
    gw = ScriptedGateway().start()
    homes = tempfile.mkdtemp(prefix="bench-homes-")
    os.environ.update(
        {
            "REDIS_URL": url,
            "OPENAI_BASE_URL": gw.base_url,
            "OPENAI_MODEL": "x",
            "AGENT_HOMES_ROOT": homes,
            "AGENT_EXTRA_TOOLSETS": "bench_placement=bench.placement:toolset",
            "AGENT_APPROVAL_MODE": "off",
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

        while not app.control.ping(timeout=0.5):
            pass
        control = ControlPlane()
        agent = "bench-agent"
        Path(homes, agent).mkdir(parents=True, exist_ok=True)
        Path(homes, agent, "f.txt").write_text("line\n" * 20)

        def run_turn(tool: str) -> float:
            name = f"bench-{uuid.uuid4().hex[:6]}"
            calls = [
                {"type": "function_call", "name": tool, "arguments": '{"path": "f.txt"}'} for _ in range(args.group)
            ]
            gw.add_script(name, [{"output": calls}, {"output": [{"type": "message", "text": "done"}]}])
            t = time.perf_counter()
            tid = control.enqueue({"agent_id": agent, "input": "go", "model": name, "toolset": "bench_placement"})
            view = control.wait(tid, timeout=300)
            assert view.status.value == "completed", view
            return (time.perf_counter() - t) / args.group

        run_turn("read_file")  # warm-up (also places the agent)
        run_turn("read_file_unrouted")
        routed, unrouted, ratios = [], [], []
        for i in range(args.rounds):
            order = ("read_file", "read_file_unrouted") if i % 2 == 0 else ("read_file_unrouted", "read_file")
            got = {tool: run_turn(tool) for tool in order}
            routed.append(got["read_file"])
            unrouted.append(got["read_file_unrouted"])
            ratios.append(got["read_file"] / got["read_file_unrouted"])
        ping, locate, admit = _micro(url, 2000)
        r_ms, u_ms = statistics.median(routed) * 1000, statistics.median(unrouted) * 1000
        print(f"worker pool: {args.pool} -c {args.concurrency}; {args.group} parallel read_file calls per turn")
        print(f"unrouted call (floor, tools queue)     {u_ms:8.2f} ms per call")
        print(f"routed call (node queue, admitted)     {r_ms:8.2f} ms per call")
        print(f"ratio routed / unrouted (median of {args.rounds} paired rounds): {statistics.median(ratios):.3f}x")
        print(f"  Redis PING round trip                {ping:8.1f} us")
        print(f"  Placement.locate (Lua)               {locate:8.1f} us  = {locate / ping:.2f}x PING")
        print(f"  NodeHomes.admit + release            {admit:8.1f} us  = {admit / ping:.2f}x PING")
    finally:
        worker.terminate()
        worker.wait(20)
        gw.stop()
        redis_srv.stop()


if __name__ == "__main__":
    main()
