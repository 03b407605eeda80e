"""Benchmark of argument validation (docs/arguments.md).

1. Valid calls per second through ``validate_tool_arguments`` for a pydantic
   tool, against a floor measured in the same run: ``TypeAdapter(Model).validate_json``
   on the same inputs. Target: within 1.25x of the floor.
2. Valid calls per second for a raw-schema tool (the same model's JSON Schema, with ``$defs``:
   orjson + the compiled ``jsonschema-rs`` validator), against the same floor, timed in
   alternation with it. Target: within 1.25x of the floor. Then the same tool defined again
   for every call (a new tool object with the same schema, as the runtime's category creators
   do; the definitions are made before the clock starts): what a call costs when nothing is
   cached per tool object.
3. The repair path on truncated inputs of 1 KB, 100 KB and 1 MB (an array cut
   after a complete item, so the ladder closes the delimiters): time per call,
   and per KB, to show linear growth.
4. Assembling the definitions of 50 tools for a turn (cached).

Run: ``.venv/bin/python bench/arguments.py``
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pydantic import BaseModel, Field, TypeAdapter

from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.repair import repair_arguments
from worker.tooling.schemas import collect_tool_definitions, validation_info


class Todo(BaseModel):
    content: str
    status: str = Field(pattern="^(pending|in_progress|done)$")
    priority: int = Field(1, ge=1, le=5)


class WriteTodos(BaseModel):
    todos: list[Todo]
    note: str | None = None


def best_of(fn, repeat=5):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    inputs = [
        json.dumps(
            {
                "todos": [
                    {"content": f"task {i} {j}", "status": "pending", "priority": (j % 5) + 1} for j in range(i % 6 + 1)
                ],
                "note": None if i % 2 else "n",
            }
        )
        for i in range(200)
    ]
    tool = define_worker_tool(
        name="write_todos", description="d", execute=lambda p, c: ToolResult("ok"), input_model=WriteTodos
    )
    adapter = TypeAdapter(WriteTodos)
    rounds = 50
    n = len(inputs) * rounds

    def floor():
        for _ in range(rounds):
            for raw in inputs:
                adapter.validate_json(raw)

    def ours():
        for _ in range(rounds):
            for raw in inputs:
                out = validate_tool_arguments(tool, raw)
                assert out.ok

    # Interleaved: the machine's speed drifts between samples, so floor and ours are timed in
    # alternation; the ratio reported is the median of the 21 paired ratios.
    pairs = []
    for _ in range(21):
        pairs.append((best_of(floor, 1), best_of(ours, 1)))
    t_floor = min(f for f, _ in pairs)
    t_ours = min(o for _, o in pairs)
    ratio = statistics.median(o / f for f, o in pairs)
    print("## valid calls, pydantic tool")
    print(f"floor TypeAdapter.validate_json : {n / t_floor:>10,.0f} calls/s ({t_floor / n * 1e6:.2f} us/call)")
    print(f"validate_tool_arguments         : {n / t_ours:>10,.0f} calls/s ({t_ours / n * 1e6:.2f} us/call)")
    print(f"ratio ours/floor                : {ratio:.2f}x median of paired samples (target <= 1.25x)")

    raw_tool = define_worker_tool(
        name="write_todos_raw",
        description="d",
        execute=lambda p, c: ToolResult("ok"),
        json_schema=WriteTodos.model_json_schema(),
    )

    def raw_path():
        for _ in range(rounds):
            for raw in inputs:
                assert validate_tool_arguments(raw_tool, raw).ok

    raw_pairs = []
    for _ in range(21):
        raw_pairs.append((best_of(floor, 1), best_of(raw_path, 1)))
    t_floor2 = min(f for f, _ in raw_pairs)
    t_raw = min(o for _, o in raw_pairs)
    raw_ratio = statistics.median(o / f for f, o in raw_pairs)
    print(f"\n## valid calls, raw-schema tool ({validation_info(raw_tool).engine}, orjson + compiled validator)")
    print(f"floor TypeAdapter.validate_json : {n / t_floor2:>10,.0f} calls/s ({t_floor2 / n * 1e6:.2f} us/call)")
    print(f"validate_tool_arguments         : {n / t_raw:>10,.0f} calls/s ({t_raw / n * 1e6:.2f} us/call)")
    print(f"ratio ours/floor                : {raw_ratio:.2f}x median of paired samples (target <= 1.25x)")

    # The same schema, a new tool object per call (the definitions made outside the clock).
    schema = WriteTodos.model_json_schema()
    fresh_rounds = 3

    def fresh_tools():
        return [
            define_worker_tool(name="write_todos_raw", description="d", execute=lambda p, c: ToolResult("ok"),
                               json_schema=schema)
            for _ in range(len(inputs) * fresh_rounds)
        ]  # fmt: skip

    fresh_pairs = []
    for _ in range(5):
        tools_now = fresh_tools()
        t0 = time.perf_counter()
        for k in range(fresh_rounds):
            for j, raw in enumerate(inputs):
                assert validate_tool_arguments(tools_now[k * len(inputs) + j], raw).ok
        t_fresh = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(fresh_rounds):
            for raw in inputs:
                adapter.validate_json(raw)
        fresh_pairs.append((time.perf_counter() - t0, t_fresh))
    m = len(inputs) * fresh_rounds
    print(
        f"a new tool object per call       : {min(o for _, o in fresh_pairs) / m * 1e6:.2f} us/call, "
        f"{statistics.median(o / f for f, o in fresh_pairs):.2f}x the floor (median of 5 paired samples)"
    )

    print("\n## repair path, truncated inputs (closed_delimiters)")
    item = '{"content": "a task to do", "status": "pending", "priority": 2}'
    for label, size in (("1 KB", 1_000), ("100 KB", 100_000), ("1 MB", 1_000_000)):
        count = max(1, (size - 20) // (len(item) + 2))
        raw = '{"todos": [' + ", ".join([item] * count)
        raw = raw[:size] if len(raw) > size else raw
        # cut after a complete item so the repair applies
        raw = raw[: raw.rfind("}") + 1]
        out = repair_arguments(raw)
        assert out.ok and out.repairs == ["closed_delimiters"], out.error
        t = best_of(lambda raw=raw: repair_arguments(raw), 3 if size > 100_000 else 5)
        full = validate_tool_arguments(tool, raw)
        assert full.ok
        print(
            f"{label:>6}: {len(raw):>9,} chars  {t * 1e3:9.3f} ms  "
            f"({t / (len(raw) / 1000) * 1e6:.1f} us per 1000 chars)"
        )

    print("\n## assembling 50 tools for a turn (cached definitions)")
    tools = [
        define_worker_tool(
            name=f"tool_{i}",
            description="d",
            execute=lambda p, c: ToolResult("ok"),
            json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
            namespace="ns" if i % 5 == 0 else None,
        )
        for i in range(50)
    ]
    collect_tool_definitions(tools)
    reps = 2000
    t = best_of(lambda: [collect_tool_definitions(tools) for _ in range(reps)], 3)
    print(f"collect_tool_definitions(50)    : {t / reps * 1e6:.1f} us per turn")


if __name__ == "__main__":
    main()
