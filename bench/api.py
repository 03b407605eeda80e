"""The HTTP control plane's costs (``control/api``), against floors measured in the same run, and
against an earlier version of the API (``--before REF``) served side by side in the same run.

1. Enqueue overhead: ``POST /v1/turns`` as a real client sends it (one httpx client, HTTP/1.1
   keep-alive: one connection for every request; token lookup, rate limit, validation, the turn's
   creation and its first step's publish) against the Python client's ``ControlPlane.create`` on
   the same Redis, one enqueue after another. No worker consumes: the steps stay queued, so only
   enqueueing is measured. Rounds alternate who goes first; each round's ratio is its HTTP time
   over its own floor, and the median of the rounds' ratios is the figure.
2. Event-stream fan-out: K concurrent SSE clients (one connection each, as a browser's
   ``EventSource``; read by one uvloop event loop with a protocol callback per connection, so the
   clients' own cost stays small), each following its own queued turn through one API process;
   then one ``model_delta`` event is written to every turn's Redis Stream and each client notes
   when it arrives; three such bursts per round. A burst's ``XADD``s are packed before its clock
   starts (as each worker packs its own event's) and written to Redis in one write; latency runs
   from that write. Reported per round: whether all K
   streams held, the API process's memory, and the latency from the ``XADD`` to the client
   (p50/p99). K=1 is the floor.

``--before REF``: the API of git revision ``REF`` (exported with ``git archive`` into a temporary
folder) is started beside the current one, on the same Redis, without httptools (which it did not
depend on: a module of that name that raises ``ImportError`` comes first on its path, so uvicorn's
automatic choice falls back to h11 as it did; ``--hide uvloop,httptools`` for a version older than
the uvloop dependency), and every measure alternates between the two; ``--before ''`` measures the
current API alone.

``python bench/api.py [--before REF] [--enqueues N] [--rounds R] [--streams 1,100,500,1000,2000]``;
prints tables for bench/README.md. Everything runs on this machine: an embedded Redis and the API
processes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def export_tree(ref: str, into: Path, hide: list[str]) -> tuple[Path, Path]:
    """The files of git revision ``ref`` under ``into``, and a folder of modules hiding the
    packages ``hide``: ``(tree, hiding)``."""
    tree, hiding = into / "tree", into / "hide"
    tree.mkdir()
    hiding.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for name in hide:
        (hiding / f"{name}.py").write_text(f"raise ImportError('{name}: not a dependency of this version')\n")
    return tree, hiding


def bench_enqueue(control: Any, servers: dict[str, Any], tokens: dict[str, str], n: int, rounds: int) -> dict:
    import httpx

    body = {"agent_id": "bench", "input": "hello"}
    clients = {
        name: httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {tokens[name]}"}, timeout=30)
        for name, srv in servers.items()
    }
    for _ in range(30):  # warm every path (and open each keep-alive connection)
        control.create(body)
        for c in clients.values():
            c.post("/v1/turns", json=body).raise_for_status()
    per = max(1, n // rounds)
    times: dict[str, list[float]] = {"client": [], **{name: [] for name in servers}}
    order = ["client", *servers]
    for r in range(rounds):
        for who in order[r % len(order) :] + order[: r % len(order)]:  # who goes first rotates
            t0 = time.perf_counter()
            if who == "client":
                for _ in range(per):
                    control.create(body)
            else:
                c = clients[who]
                for _ in range(per):
                    resp = c.post("/v1/turns", json=body)
                    assert resp.status_code == 201, resp.text
            times[who].append((time.perf_counter() - t0) / per * 1000)
    for c in clients.values():
        c.close()
    out: dict[str, Any] = {"client_ms": times["client"], "per_round": per}
    for name in servers:
        ratios = [h / f for h, f in zip(times[name], times["client"])]
        out[name] = {"ms": times[name], "ratios": ratios, "ratio": statistics.median(ratios)}
    return out


class _SseClient(asyncio.Protocol):
    """One event-stream connection: notes when each ``data:`` line arrives (the events of a burst
    are one per stream, so the first ``data:`` after a burst is written is that burst's)."""

    def __init__(self, request: bytes, ready: asyncio.Future[str], arrived: dict[int, float], index: int):
        self.request, self.ready, self.arrived, self.index = request, ready, arrived, index
        self.head = b""
        self.open = False
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if not self.ready.done():
            self.head += data
            if b"\r\n" in self.head:
                status = self.head.split(b"\r\n", 1)[0].decode(errors="replace")
                self.open = " 200 " in status
                self.ready.set_result(status)
        if b"\ndata: " in data or data.startswith(b"data: "):
            self.arrived.setdefault(self.index, now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        if not self.ready.done():
            self.ready.set_result("closed")


async def bench_fanout(
    srv: Any, control: Any, token: str, k: int, bursts: int = 3, on_bursts: Any = None
) -> dict[str, Any]:
    """One round of the fan-out (module docstring); ``on_bursts(started)``: called with True before
    the first burst and False after the last (a profiler's start and stop)."""
    import orjson
    import redis.asyncio

    from worker.turn.async_reads import AsyncTurnReads

    loop = asyncio.get_running_loop()
    turns = [control.create({"agent_id": "bench", "input": "x"})[0] for _ in range(k)]
    arrived: dict[int, float] = {}
    conns: list[_SseClient] = []
    readies = []
    for i, tid in enumerate(turns):
        request = (
            f"GET /v1/turns/{tid}/events?kinds=model_delta HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        ready: asyncio.Future[str] = loop.create_future()
        _t, proto = await loop.create_connection(
            lambda i=i, request=request, ready=ready: _SseClient(request, ready, arrived, i), "127.0.0.1", srv.port
        )
        conns.append(proto)
        readies.append(ready)
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # no SYN flood of the accept queue
    statuses = await asyncio.wait_for(asyncio.gather(*readies), timeout=120)
    refused = [s for s in statuses if " 200 " not in s]
    await asyncio.sleep(1.0 + k / 500)  # every subscription reached the hub
    r = redis.asyncio.Redis.from_url(srv.redis_url)
    lat: list[float] = []
    received = 0
    if on_bursts is not None:
        on_bursts(True)
    cpu0 = _cpu_s(srv.proc.pid)
    conn = await r.connection_pool.get_connection()  # type: ignore[no-untyped-call]
    for _burst in range(bursts):
        arrived.clear()
        # The burst's XADDs, packed before the clock starts (as each worker packs its own event's
        # XADD), then written to Redis in one write: redis-py packing 2,000 commands one by one
        # took about 20 ms of every burst's latency (bench/README.md, the HTTP edge, round 3).
        at = time.time()
        ev = {"kind": "model_delta", "at": at, "step": 0, "attempt": 0, "type": "text", "delta": "hi"}
        data = orjson.dumps(ev)
        packed = conn.pack_commands([("XADD", AsyncTurnReads.events_key(tid), "*", "e", data) for tid in turns])
        sent = time.time()
        await conn.send_packed_command(packed)
        for _ in turns:
            await conn.read_response()
        deadline = time.monotonic() + 30
        while len(arrived) < k and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        received += len(arrived)
        lat += [t - sent for t in arrived.values()]
        await asyncio.sleep(0.3)
    if on_bursts is not None:
        on_bursts(False)
    cpu = _cpu_s(srv.proc.pid) - cpu0
    if on_bursts is not None:
        on_bursts(False)
    await r.connection_pool.release(conn)
    held = sum(1 for c in conns if c.open)
    rss = _rss_mb(srv.proc.pid)
    for c in conns:
        if c.transport is not None:
            c.transport.close()
    await r.aclose()
    await asyncio.sleep(0.5 + k / 2000)  # the server lets the streams go before the next round
    lat.sort()
    return {
        "streams": k,
        "held": held,
        "received": received,
        "expected": bursts * k,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[max(0, int(len(lat) * 0.99) - 1)] * 1000 if lat else float("nan"),
        "rss_mb": rss,
        "cpu_us": cpu / max(1, received) * 1e6,
        "refused": f"{len(refused)} ({refused[0]})" if refused else "0",
    }


def _fmt(values: list[float], unit: str = "") -> str:
    return ", ".join(f"{v:.2f}{unit}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="", help="git revision of the API to compare with ('' for none)")
    parser.add_argument("--hide", default="httptools", help="packages the earlier API did not depend on")
    parser.add_argument("--enqueues", type=int, default=1600, help="enqueues per path, over all rounds")
    parser.add_argument("--rounds", type=int, default=8, help="alternated rounds (enqueue)")
    parser.add_argument("--fanout-rounds", type=int, default=3, help="alternated rounds per stream count")
    parser.add_argument("--streams", default="1,100,500,1000,2000")
    args = parser.parse_args()
    import resource

    import uvloop

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    from devtools.embedded_redis import EmbeddedRedis

    emb = EmbeddedRedis()
    emb.start()
    os.environ["REDIS_URL"] = emb.url
    os.environ["CONTROL_REDIS_URL"] = emb.control_url
    from control.client import ControlPlane
    from tests.support.api_server import ApiServer

    limits = {"AGENT_API_RATE": "100000", "AGENT_API_BURST": "100000", "AGENT_API_MAX_STREAMS_PER_TOKEN": "100000"}
    servers: dict[str, Any] = {}
    scratch = tempfile.TemporaryDirectory(prefix="bench-api-before-")
    if args.before:
        tree, hiding = export_tree(args.before, Path(scratch.name), [h for h in args.hide.split(",") if h])
        pythonpath = f"{hiding}{os.pathsep}{tree}"
        servers["before"] = ApiServer(emb.control_url, root=tree, PYTHONPATH=pythonpath, **limits)
    servers["after"] = ApiServer(emb.control_url, PYTHONPATH=str(ROOT), **limits)
    try:
        for srv in servers.values():
            srv.start()
        control = ControlPlane(emb.control_url)
        tokens = {name: srv.token(None) for name, srv in servers.items()}
        print(f"load average at start: {_load()}", flush=True)
        e = bench_enqueue(control, servers, tokens, args.enqueues, args.rounds)
        print(f"\nenqueue, {args.rounds} alternated rounds of {e['per_round']} enqueues per path (ms per enqueue):")
        print("| path | every round | median | ratio to the floor, every round | median ratio |")
        print("|---|---|---|---|---|")
        print(
            f"| Python client `ControlPlane.create` (floor) | {_fmt(e['client_ms'])} | {statistics.median(e['client_ms']):.2f} | | |"
        )
        for name in servers:
            d = e[name]
            print(
                f"| `POST /v1/turns`, {name} | {_fmt(d['ms'])} | {statistics.median(d['ms']):.2f} | "
                f"{_fmt(d['ratios'], 'x')} | **{d['ratio']:.2f}x** |",
                flush=True,
            )
        print(f"load average after the enqueues: {_load()}\n", flush=True)
        print(
            "| streams | API | round | held | refused | events received | XADD -> client p50 | p99 | API RSS | API CPU per event |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|")
        summary: list[str] = []
        for k in [int(x) for x in args.streams.split(",")]:
            p99s: dict[str, list[float]] = {name: [] for name in servers}
            p50s: dict[str, list[float]] = {name: [] for name in servers}
            for rnd in range(args.fanout_rounds):
                names = list(servers) if rnd % 2 == 0 else list(reversed(servers))
                for name in names:
                    f = uvloop.run(bench_fanout(servers[name], control, tokens[name], k))
                    p50s[name].append(f["p50_ms"])
                    p99s[name].append(f["p99_ms"])
                    print(
                        f"| {k} | {name} | {rnd + 1} | {f['held']} | {f['refused']} | {f['received']}/{f['expected']} "
                        f"| {f['p50_ms']:.1f} ms | {f['p99_ms']:.1f} ms | {f['rss_mb']:.0f} MB | {f['cpu_us']:.0f} us |",
                        flush=True,
                    )
            for name in servers:
                summary.append(
                    f"| {k} | {name} | {statistics.median(p50s[name]):.1f} ms | {statistics.median(p99s[name]):.1f} ms "
                    f"| {', '.join(f'{v:.0f}' for v in p99s[name])} |"
                )
        print(f"load average after the fan-out: {_load()}\n")
        print("| streams | API | median p50 | median p99 | p99 of every round (ms) |")
        print("|---|---|---|---|---|")
        print("\n".join(summary))
    finally:
        for srv in servers.values():
            srv.stop()
        emb.stop()
        scratch.cleanup()


if __name__ == "__main__":
    main()
