"""What a fencing write's WAIT costs (``worker.turn.durability``, docs/failover.md).

On a primary with its replica and three Sentinels (``devtools.embedded_sentinel``), the same
writes with and without ``WAIT 1``: a model reply's memo (``ReplyMemo.save_and_check``, with its
events and usage) and a destructive call's claim (``Claims.claim``, with its ``call_started``
event), each from ``--threads`` threads at once, as a node's finishers and tools processes make
them. Rounds alternate which goes first; each reports microseconds per write, and the ratio of
the fenced write to the same write unfenced (the floor, measured in the same round on the same
servers). Both are one round trip: the WAIT rides in the write's pipeline.

Run: ``.venv/bin/python bench/durability.py [--writes 2000] [--threads 8] [--rounds 6]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.embedded_sentinel import EmbeddedSentinelSet  # noqa: E402
from worker.redis_connection import RedisEndpoint, Sentinels  # noqa: E402
from worker.settings import parse_host_ports  # noqa: E402
from worker.turn.durability import ReplicaAck  # noqa: E402
from worker.turn.store import TurnStore  # noqa: E402


def _memo(store: TurnStore) -> Callable[[int], Any]:
    turn = uuid.uuid4().hex
    reply = {"id": "r", "output": [{"type": "message", "content": [{"type": "output_text", "text": "x" * 400}]}]}
    return lambda i: store.memo.save_and_check(turn, i, reply, {"step": i}, (str(i), b'{"input_tokens": 10}'))


def _claim(store: TurnStore) -> Callable[[int], Any]:
    turn = uuid.uuid4().hex
    return lambda i: store.claims.claim(turn, 0, f"call_{i}", "node:1:1:1", 60, durable=True)


def _run(write: Callable[[int], Any], writes: int, threads: int) -> float:
    """Microseconds per write, ``writes`` of them over ``threads`` threads."""
    per = writes // threads

    def work(t: int) -> None:
        for i in range(t * per, (t + 1) * per):
            write(i)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    started = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return (time.perf_counter() - started) / (per * threads) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    redis_set = EmbeddedSentinelSet()
    redis_set.start()
    try:
        sentinels = Sentinels(parse_host_ports(redis_set.sentinel_addresses), "agent", redis_set.sentinel_password)
        client = RedisEndpoint.parse(redis_set.url, sentinels=sentinels).client(max_connections=64)
        stores = {"unfenced": TurnStore(client), "fenced": TurnStore(client, durability=ReplicaAck(1, 1.0))}
        for store in stores.values():  # the scripts loaded, the pool warm
            _run(_memo(store), 64, 4)
        print(f"fencing writes: {args.writes} per run over {args.threads} threads; primary + replica + 3 Sentinels")
        ratios: dict[str, list[float]] = {"memo": [], "claim": []}
        for r in range(args.rounds):
            for kind, make in (("memo", _memo), ("claim", _claim)):
                order = ("fenced", "unfenced") if r % 2 else ("unfenced", "fenced")
                us = {name: _run(make(stores[name]), args.writes, args.threads) for name in order}
                ratios[kind].append(us["fenced"] / us["unfenced"])
                print(f"round {r + 1} {kind:5} unfenced {us['unfenced']:7.1f} us  fenced (WAIT 1) "
                      f"{us['fenced']:7.1f} us  {ratios[kind][-1]:.2f}x", flush=True)  # fmt: skip
        for kind, values in ratios.items():
            print(f"{kind}: fenced / unfenced, median of {args.rounds} rounds {statistics.median(values):.2f}x "
                  f"(rounds: {', '.join(f'{v:.2f}' for v in values)})")  # fmt: skip
    finally:
        redis_set.stop()


if __name__ == "__main__":
    main()
