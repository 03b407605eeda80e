"""Streaming figures (docs/control-plane.md, "Streaming"), measured in one run against a floor from the same run.

- **first token -> Redis**: wall time from the moment the scripted gateway writes a response's
  first ``response.output_text.delta`` to the moment a reader blocked on the turn's event stream
  (``XREAD BLOCK``, as ``transcript --follow`` does) receives its ``model_delta`` event; median.
- **per-step overhead**: one model step ending the turn (model call over HTTP, memoized reply,
  the turn's end), streamed vs not streamed, in alternating pairs (this VM's speed drifts);
  the ratio is the median of the paired ratios; the floor is the non-streamed step.

In-process engine, real embedded Redis, scripted gateway over HTTP on loopback; the answer is
``--chars`` characters in ``--chunk``-character deltas. Run: ``.venv/bin/python bench/streaming.py``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class NullDispatcher:
    def enqueue_step(self, *a, **k):
        pass

    def step_message(self, *a, **k):
        return None

    def batch_message(self, *a, **k):
        return None

    def dispatch_batch(self, *a, **k):
        pass

    def services(self, request):
        from worker.tooling.contract import ToolServices

        return ToolServices()

    def turn_finished(self, turn_id):
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=30, help="turns for the first-token figure")
    parser.add_argument("--pairs", type=int, default=30, help="streamed/plain step pairs")
    parser.add_argument("--chars", type=int, default=600)
    parser.add_argument("--chunk", type=int, default=12)
    args = parser.parse_args()

    import redis

    from devtools.embedded_redis import EmbeddedRedis
    from devtools.scripted_gateway import ScriptedGateway
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.turn.engine import TurnEngine
    from worker.turn.request import TurnRequest
    from worker.turn.store import TurnStore

    srv = EmbeddedRedis()
    url = srv.start()
    gw = ScriptedGateway().start()
    os.environ["AGENT_HOMES_ROOT"] = tempfile.mkdtemp(prefix="bench-homes-")
    text = ("streamed words " * (args.chars // 15 + 1))[: args.chars]
    r = redis.Redis.from_url(url)
    store = TurnStore(r, progress_timeout=600)
    client = SyncModelClient(RESPONSES, gw.base_url)
    reader = TurnStore(redis.Redis.from_url(url))

    def engine(stream: bool) -> TurnEngine:
        settings = Settings(redis_url=url, model_stream=stream, homes_root=os.environ["AGENT_HOMES_ROOT"])
        return TurnEngine(store, settings, NullDispatcher(), lambda name: lambda ctx: [], client, redis=r)

    def new_turn(eng: TurnEngine, delay_ms: float = 0) -> tuple[str, str]:
        model = f"bench-{uuid.uuid4().hex[:8]}"
        gw.add_script(model, [{"output": [{"type": "message", "text": text}], "stream_chunk": args.chunk,
                               "stream_delay_ms": delay_ms}])  # fmt: skip
        turn_id = uuid.uuid4().hex
        eng.create_turn(TurnRequest(input="go", model=model, toolset="text"), turn_id)
        return turn_id, model

    streamed, plain = engine(True), engine(False)
    for _ in range(3):  # warm up connections and caches
        streamed.run_step(new_turn(streamed)[0], 0)
        plain.run_step(new_turn(plain)[0], 0)

    # First token at the gateway -> its event seen by a blocked reader.
    latencies = []
    for _ in range(args.turns):
        turn_id, _ = new_turn(streamed, delay_ms=2)
        seen: dict[str, float] = {}

        def watch(tid: str = turn_id, out: dict = seen) -> None:
            last = "0-0"
            while "t" not in out:
                for eid, event in reader.events(tid, after=last, block_ms=2000):
                    last = eid
                    if event.get("kind") == "model_delta":
                        out["t"] = time.time()

        gw.first_delta_at.clear()
        t = threading.Thread(target=watch, daemon=True)
        t.start()
        time.sleep(0.01)  # the reader is blocked before the model call starts
        streamed.run_step(turn_id, 0)
        t.join(5)
        first = next(iter(gw.first_delta_at.values()), None)
        if first and "t" in seen:
            latencies.append((seen["t"] - first) * 1000)

    # Per-step cost, streamed vs plain, in alternating pairs.
    ratios, s_times, p_times = [], [], []
    for _ in range(args.pairs):
        tid_s, _ = new_turn(streamed)
        tid_p, _ = new_turn(plain)
        t0 = time.perf_counter()
        streamed.run_step(tid_s, 0)
        t1 = time.perf_counter()
        plain.run_step(tid_p, 0)
        t2 = time.perf_counter()
        s_times.append((t1 - t0) * 1000)
        p_times.append((t2 - t1) * 1000)
        ratios.append((t1 - t0) / (t2 - t1))
    deltas = -(-args.chars // args.chunk)
    print(f"answer: {args.chars} chars in {deltas} deltas of {args.chunk}")
    print(
        f"first token -> event seen in Redis: median {statistics.median(latencies):.2f} ms "
        f"(p90 {sorted(latencies)[int(len(latencies) * 0.9) - 1]:.2f} ms, n={len(latencies)})"
    )
    print(f"floor, non-streamed step: median {statistics.median(p_times):.2f} ms")
    print(f"streamed step: median {statistics.median(s_times):.2f} ms")
    print(f"streamed / non-streamed (median of {args.pairs} paired ratios): {statistics.median(ratios):.2f}x")
    gw.stop()
    srv.stop()


if __name__ == "__main__":
    main()
