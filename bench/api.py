"""The HTTP control plane's costs (``control/api``), against floors measured in the same run.

1. Enqueue overhead: ``POST /v1/turns`` (one keep-alive httpx client, token lookup, rate limit,
   validation, the turn's creation and its first step's publish) against the Python client's
   ``ControlPlane.create`` on the same Redis, sequentially. No worker consumes: the steps stay
   queued, so only enqueueing is measured.
2. Event-stream fan-out: K concurrent SSE clients (raw asyncio sockets, light on the client
   side), each following its own queued turn through one API process; then one ``model_delta``
   event is written to every turn's Redis Stream (one pipeline) and each client notes when it
   arrives. Reported: whether all K streams held, the API process's memory, and the latency
   from the ``XADD`` to the client (p50/p99), against K=1 as the floor.

``python bench/api.py [--enqueues N] [--streams 1,100,500,1000]``; prints a table for
bench/README.md. Everything runs on this machine: an embedded Redis and one API process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def bench_enqueue(control, srv, token: str, n: int) -> dict:
    import httpx

    agent = "bench"
    body = {"agent_id": agent, "input": "hello"}
    for _ in range(20):  # warm both paths
        control.create(body)
    client = httpx.Client(base_url=srv.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    for _ in range(20):
        client.post("/v1/turns", json=body).raise_for_status()
    rounds = {"client": [], "http": []}
    for r in range(4):  # alternate who goes first
        order = ["client", "http"] if r % 2 == 0 else ["http", "client"]
        for who in order:
            t0 = time.perf_counter()
            for _ in range(n // 4):
                if who == "client":
                    control.create(body)
                else:
                    resp = client.post("/v1/turns", json=body)
                    assert resp.status_code == 201, resp.text
            rounds[who].append((time.perf_counter() - t0) / (n // 4))
    c, h = statistics.median(rounds["client"]), statistics.median(rounds["http"])
    return {"client_ms": c * 1000, "http_ms": h * 1000, "ratio": h / c, "overhead_ms": (h - c) * 1000}


async def _sse_client(port: int, token: str, turn_id: str, ready: asyncio.Event, got: dict, key: str) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    writer.write(
        (
            f"GET /v1/turns/{turn_id}/events?kinds=model_delta HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    status = await reader.readline()
    if b" 200 " not in status:
        got.setdefault("refused", []).append(status.decode().strip())
        ready.set()
        return
    ready.set()
    try:
        while True:
            line = await reader.readline()
            if not line:
                return
            if line.startswith(b"data: "):
                got[key] = time.time()
                ev = orjson.loads(line[6:])
                got[key + ":sent"] = ev["sent"]
    finally:
        writer.close()


async def bench_fanout(srv, control, token: str, k: int) -> dict:
    import redis.asyncio

    from worker.turn.async_reads import AsyncTurnReads

    turns = [control.create({"agent_id": "bench", "input": "x"})[0] for _ in range(k)]
    got: dict = {}
    readies = [asyncio.Event() for _ in turns]
    tasks = []
    for i, tid in enumerate(turns):
        tasks.append(asyncio.create_task(_sse_client(srv.port, token, tid, readies[i], got, tid)))
        if i % 50 == 49:
            await asyncio.sleep(0.05)  # no SYN flood of the accept queue
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in readies)), timeout=120)
    await asyncio.sleep(1.0 + k / 500)  # every subscription reached the hub
    r = redis.asyncio.Redis.from_url(srv.redis_url)
    lat: list[float] = []
    for _round in range(3):
        got.clear()
        async with r.pipeline(transaction=False) as p:
            sent = time.time()
            for tid in turns:
                ev = {
                    "kind": "model_delta",
                    "at": sent,
                    "sent": sent,
                    "step": 0,
                    "attempt": 0,
                    "type": "text",
                    "delta": "hi",
                }
                p.xadd(AsyncTurnReads.events_key(tid), {"e": orjson.dumps(ev)})
            await p.execute()
        deadline = time.monotonic() + 30
        while sum(1 for t in turns if t in got) < k and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        lat += [got[t] - got[t + ":sent"] for t in turns if t in got and t + ":sent" in got]
        await asyncio.sleep(0.3)
    held = sum(1 for t in tasks if not t.done())
    refused = got.get("refused", [])
    rss = _rss_mb(srv.proc.pid)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await r.aclose()
    lat.sort()
    return {
        "streams": k,
        "held": held,
        "received": len(lat),
        "expected": 3 * k,
        "p50_ms": lat[len(lat) // 2] * 1000 if lat else float("nan"),
        "p99_ms": lat[int(len(lat) * 0.99) - 1 if len(lat) > 1 else 0] * 1000 if lat else float("nan"),
        "rss_mb": rss,
        "refused": f"{len(refused)} ({refused[0]})" if refused else "0",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--enqueues", type=int, default=800)
    parser.add_argument("--streams", default="1,100,500,1000")
    args = parser.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    from devtools.embedded_redis import EmbeddedRedis

    emb = EmbeddedRedis()
    emb.start()
    os.environ["REDIS_URL"] = emb.url
    os.environ["CONTROL_REDIS_URL"] = emb.control_url
    from control.client import ControlPlane
    from tests.support.api_server import ApiServer

    srv = ApiServer(
        emb.control_url, AGENT_API_RATE="100000", AGENT_API_BURST="100000", AGENT_API_MAX_STREAMS_PER_TOKEN="100000"
    )
    try:
        srv.start()
        control = ControlPlane(emb.control_url)
        token = srv.token(None)
        e = bench_enqueue(control, srv, token, args.enqueues)
        print(
            f"enqueue: Python client {e['client_ms']:.2f} ms, HTTP API {e['http_ms']:.2f} ms "
            f"(x{e['ratio']:.2f}, +{e['overhead_ms']:.2f} ms per enqueue)",
            flush=True,
        )
        print("| streams | held | refused | events received | delta -> client p50 | p99 | API RSS |")
        print("|---|---|---|---|---|---|---|")
        for k in [int(x) for x in args.streams.split(",")]:
            f = asyncio.run(bench_fanout(srv, control, token, k))
            print(
                f"| {f['streams']} | {f['held']} | {f['refused']} | {f['received']}/{f['expected']} | {f['p50_ms']:.1f} ms | "
                f"{f['p99_ms']:.1f} ms | {f['rss_mb']:.0f} MB |",
                flush=True,
            )
    finally:
        srv.stop()
        emb.stop()


if __name__ == "__main__":
    main()
