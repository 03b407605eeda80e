"""Tools used by the orchestration tests (configured via AGENT_EXTRA_TOOLSETS=testing=...).

Each tool appends ``[name, call_id, start, end]`` to the Redis list
``test:log:<turn_id>`` so tests can check ordering and barriers.
"""

from __future__ import annotations

import time

import orjson
from pydantic import BaseModel, Field

from worker.tooling.contract import ToolResult, define_worker_tool
from worker.turn.context import TurnContext


class SleepArgs(BaseModel):
    label: str
    ms: int = Field(0, ge=0, le=5000)


class NoArgs(BaseModel):
    pass


class Reason(BaseModel):
    reason: str


def _logged(name: str, fn):
    def execute(params, ctx):
        start = time.time()
        result = fn(params, ctx)
        ctx.services.redis_client().rpush(
            f"test:log:{ctx.turn_id}",
            orjson.dumps([name, ctx.call_id, start, time.time(), getattr(params, "label", "")]),
        )
        return result

    return execute


def _sleep(params: SleepArgs, ctx):
    ctx.abort.wait(params.ms / 1000)
    return ToolResult(content={"label": params.label, "slept_ms": params.ms}, details={"label": params.label})


def _boom(params, ctx):
    raise RuntimeError("disk on fire")


def _finish(params: Reason, ctx):
    return ToolResult(content=f"finished: {params.reason}", terminate=True)


def _big(params, ctx):
    return ToolResult(content="x" * 100_000)


def _crash_once(params, ctx):
    # The first run of each call kills its own process (a pool child dying mid-tool).
    r = ctx.services.redis_client()
    if r.set(f"test:crash:{ctx.turn_id}:{ctx.call_id}", "1", nx=True):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    r.incr(f"test:crash-ran:{ctx.turn_id}:{ctx.call_id}")
    return ToolResult(content="survived")


class Key(BaseModel):
    key: str


def _append_marker(params: SleepArgs, ctx):
    # Needs no Redis: a destructive effect that survives a Redis outage, counted in the home.
    ctx.abort.wait(params.ms / 1000)
    with open(ctx.home / "markers.txt", "a") as fh:
        fh.write(params.label + "\n")
    return ToolResult(content=f"appended {params.label}")


def _lookup(params: Key, ctx):
    return ToolResult(content={"key": params.key, "record": f"archived record {params.key}"})


# No "additionalProperties": a raw schema that says nothing about other keys.
RAW_LABEL_SCHEMA = {
    "type": "object",
    "properties": {"label": {"type": "string", "maxLength": 20}},
    "required": ["label"],
}


def _raw_echo(params, ctx):
    ctx.services.redis_client().rpush(f"test:raw:{ctx.turn_id}", orjson.dumps(params))
    return ToolResult(content={"ran_with": params})


def testing_tools(ctx: TurnContext, *, log_reads: bool = True):
    """The tests' toolset. ``log_reads=False``: ``read_thing`` does no I/O of its own (no test
    log), as the benches' bare-Celery floor's tool (``bench_tools``)."""
    return [
        define_worker_tool(
            name="append_marker",
            description="Append a marker line to markers.txt in the home (sequential, destructive).",
            input_model=SleepArgs,
            execute=_append_marker,
            execution_mode="sequential",
            is_destructive=True,
        ),
        define_worker_tool(
            name="read_thing",
            description="Read a thing (parallel).",
            input_model=SleepArgs,
            execute=_logged("read_thing", _sleep) if log_reads else _sleep,
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=lambda p: f"Reading {p.label}",
            describe_completed_activity=lambda p, r: f"Read {p.label}",
        ),
        define_worker_tool(
            name="write_thing",
            description="Write a thing (sequential).",
            input_model=SleepArgs,
            execute=_logged("write_thing", _sleep),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=lambda p: f"Writing {p.label}",
        ),
        define_worker_tool(
            name="guarded_write",
            description="Write a thing; a person must approve every call (sequential).",
            input_model=SleepArgs,
            execute=_logged("guarded_write", _sleep),
            execution_mode="sequential",
            is_destructive=True,
            needs_approval=True,
            describe_activity=lambda p: f"Overwriting {p.label}",
        ),
        define_worker_tool(
            name="maybe_write",
            description="Write a thing; labels starting with 'danger' need approval (parallel).",
            input_model=SleepArgs,
            execute=_logged("maybe_write", _sleep),
            execution_mode="parallel",
            is_destructive=True,
            needs_approval=lambda p, ctx: p.label.startswith("danger"),
            describe_activity=lambda p: f"Writing {p.label}",
        ),
        define_worker_tool(
            name="boom", description="Always raises.", input_model=NoArgs, execute=_logged("boom", _boom)
        ),
        define_worker_tool(
            name="finish",
            description="Ends the turn.",
            input_model=Reason,
            execute=_logged("finish", _finish),
            execution_mode="sequential",
        ),
        define_worker_tool(
            name="big_output",
            description="Returns 100k characters.",
            input_model=NoArgs,
            execute=_big,
            is_read_only=True,
        ),
        define_worker_tool(
            name="archive_lookup",
            description="Look up an archived record by its key.",
            input_model=Key,
            execute=_lookup,
            is_read_only=True,
            defer_loading=True,
            namespace="archive",
            namespace_description="Tools over the record archive.",
        ),
        define_worker_tool(
            name="crash_read",
            description="Read-only; its process dies on the first run.",
            input_model=NoArgs,
            execute=_crash_once,
            is_read_only=True,
        ),
        define_worker_tool(
            name="crash_write",
            description="Destructive; its process dies on the first run.",
            input_model=NoArgs,
            execute=_crash_once,
            is_destructive=True,
            execution_mode="sequential",
        ),
        define_worker_tool(
            name="guarded_raw",
            description="A raw-schema tool that always asks for approval (an MCP tool's shape).",
            json_schema=RAW_LABEL_SCHEMA,
            execute=_logged("guarded_raw", _raw_echo),
            is_destructive=True,
            needs_approval=True,
        ),
    ]


def bench_tools(ctx: TurnContext):
    """``testing_tools`` whose ``read_thing`` does no I/O of its own (bench/step_chain.py)."""
    return testing_tools(ctx, log_reads=False)
