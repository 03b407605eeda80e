"""Per-step cost of tracing: the same turns with tracing off and on, in one run.

Two workers run side by side on one embedded Redis, each on its own database (so each has
its own queues): one with tracing off (no ``OTEL_*`` variables, the default), one with the SDK
on (the JSON-lines file exporter, batch processor: what a development setup uses; OTLP
differs only in the exporter thread). Turns alternate between the two so that drift of the
machine hits both alike; reported: median time per step of each and their ratio.

"Off costs nothing" is measured directly too: the instrumentation a step runs when tracing is
off (no-op spans for the step's model call and one tool call, the turn context around the
next message, the trace id of a new turn) is timed in this process and given as a fraction
of a step.

Run: ``.venv/bin/python bench/tracing_overhead.py [--steps 20 --rounds 5]``.
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


def _worker(url: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        worker_argv(
            "turns,tools,background,workflow", name=f"bench-{uuid.uuid4().hex[:6]}@%h", pool="solo", loglevel="ERROR"
        ),
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": url, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def noop_instrumentation_seconds(n: int = 20_000) -> float:
    """Seconds per step spent in the tracing calls of one step (one model call, one tool call,
    the context around the next message) in a worker with tracing off (no SDK, no propagation)."""
    from worker.turn import telemetry
    from worker.turn.dispatch import PlannedCall
    from worker.turn.state import CallResult

    telemetry.set_propagation(False)  # what tasks.telemetry does at worker_init when tracing is off

    call = PlannedCall("call_1", "read_thing", 0, data={"label": "x"})
    tp = telemetry.new_traceparent()
    usage = {"input_tokens": 1, "output_tokens": 1, "cached_tokens": 0, "reasoning_tokens": 0}
    t0 = time.perf_counter()
    for _ in range(n):
        with telemetry.model_call_span("m", "t", "a", 0) as span:
            telemetry.model_reply(span, "r", "completed", usage, 1)
        telemetry.planned_calls([call], {"call_1": 0})
        with telemetry.tool_call_span(call, "t", "a", 0, 0) as span:
            telemetry.tool_outcome(span, CallResult("x"))
        with telemetry.under_turn(tp):
            pass
    return (time.perf_counter() - t0) / n


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from devtools.embedded_redis import EmbeddedRedis
    from devtools.scripted_gateway import ScriptedGateway

    redis_srv = EmbeddedRedis()
    base = redis_srv.start().rsplit("/", 1)[0]
    off_url, on_url = f"{base}/0", f"{base}/1"
    gw = ScriptedGateway().start()
    spans = Path(tempfile.mkdtemp(prefix="bench-otel-")) / "spans.jsonl"
    os.environ.update(
        {
            "REDIS_URL": off_url,
            "OPENAI_BASE_URL": gw.base_url,
            "OPENAI_MODEL": "x",
            "AGENT_HOMES_ROOT": tempfile.mkdtemp(prefix="bench-homes-"),
            "AGENT_EXTRA_TOOLSETS": "testing=tests.support.toolsets:testing_tools",
            "AGENT_MAX_MODEL_CALLS": str(args.steps + 5),
        }
    )
    workers = [_worker(off_url, {}), _worker(on_url, {"AGENT_OTEL_FILE": str(spans)})]
    try:
        from control.client import ControlPlane
        from tasks.app import app

        deadline = time.monotonic() + 60
        while len(app.control.ping(timeout=0.5) or []) < 1 and time.monotonic() < deadline:
            pass
        planes = {"off": ControlPlane(off_url), "on": ControlPlane(on_url)}

        def run_turn(control: ControlPlane, steps: int) -> float:
            name = f"bench-{uuid.uuid4().hex[:6]}"
            script = [
                {"output": [{"type": "function_call", "name": "read_thing", "arguments": f'{{"label": "s{i}"}}'}]}
                for i in range(steps)
            ]
            gw.add_script(name, script + [{"output": [{"type": "message", "text": "done"}]}])
            t = time.perf_counter()
            tid = control.enqueue({"input": "go", "model": name, "toolset": "testing"})
            view = control.wait(tid, timeout=300)
            assert view.status.value == "completed", view
            return (time.perf_counter() - t) / (steps + 1)

        for control in planes.values():  # warm-up (and wait for the second worker)
            run_turn(control, 1)
        per_step: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for mode, control in planes.items():
                per_step[mode].append(run_turn(control, args.steps))
        off, on = statistics.median(per_step["off"]), statistics.median(per_step["on"])
        noop = noop_instrumentation_seconds()
    finally:
        for w in workers:  # a worker flushes its spans when it stops
            w.terminate()
            w.wait(20)
        gw.stop()
        redis_srv.stop()
    exported = sum(1 for _ in spans.open()) if spans.exists() else 0
    print(f"steps per turn: {args.steps + 1}, rounds: {args.rounds} (turns alternate between the two workers)")
    print(f"tracing off: {off * 1000:8.2f} ms per step")
    print(f"tracing on:  {on * 1000:8.2f} ms per step  = {on / off:5.2f}x off   ({exported} spans exported)")
    print(
        f"instrumentation run per step with tracing off (no-op spans): {noop * 1e6:6.2f} us "
        f"= {noop / off * 100:.3f}% of a step"
    )


if __name__ == "__main__":
    main()
