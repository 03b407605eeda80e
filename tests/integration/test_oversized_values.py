"""Nothing oversized is stored (docs/arguments.md, "Size"): a model's reply with a 20 MB
``write_file`` argument and a 3 MB ``call_id`` costs Redis what the same reply with small values
costs, give or take a few KB; both calls are refused with an output the model reads, nothing
runs, and the next request replays short placeholders with every call answered.

Against real workers, Redis and the scripted gateway: whole answers on a stack of its own (its
Redis's memory is the measure), and streamed on the suite's worker.
"""

from __future__ import annotations

import time
import uuid

import orjson
import pytest

from tests.support.scripts import fc, msg, output_texts
from worker.turn.keys import key
from worker.turn.request import TurnStatus

BIG_ARGUMENTS = 20 * 1024 * 1024
BIG_CALL_ID = 3 * 1024 * 1024
FEW_KB = 8 * 1024
# Server-wide ``used_memory`` also moves with things no turn owns: a keyspace dict that doubles its
# buckets, a client's query buffer, heartbeats of a loaded machine (one full-suite run saw +23 KB).
# The fault this guards against kept 49 MB, so 256 KB still catches any copy of the 23 MB.
SERVER_SLACK = 256 * 1024


def _turn_keys_bytes(r, turn_id: str) -> dict[str, int]:
    """``MEMORY USAGE`` of each of the turn's keys (``turn:{id}`` and ``turn:{id}:*``)."""
    return {k.decode(): int(r.memory_usage(k, samples=0) or 0) for k in r.scan_iter(match=key(turn_id) + "*")}


def _used_memory(r) -> int:
    """Redis's ``used_memory`` once it settles (heartbeats and sweeps write a little all the time)."""
    time.sleep(1.0)
    return min(int(r.info("memory")["used_memory"]) for _ in range(3) if time.sleep(0.2) is None)


@pytest.fixture(scope="module")
def unstreamed():
    """A stack of its own (a fresh Redis: its memory is this test's alone) whose worker asks for
    whole answers: streamed, a 20 MB argument and a 3 MB ``call_id`` come back about three times
    each (deltas, the item's end, the response) and pass ``AGENT_MODEL_MAX_REPLY_BYTES`` (64 MiB);
    whole, they are 23 MB, what the runtime must then refuse without keeping."""
    from tests.support.private_stack import PrivateStack

    stack = PrivateStack(AGENT_MODEL_STREAM="0")
    try:
        stack.start_worker(pool="solo", concurrency=1)
        yield stack
    finally:
        stack.close()


def _run(control, gateway, script_name: str, arguments: dict, call_id: str, **step) -> tuple[str, int]:
    """One turn whose reply makes the two calls; ``(turn id, growth of used_memory)``. The turn's agent
    is named after the turn (``big-<turn id>``)."""
    gateway.add_script(
        script_name,
        [
            {"output": [fc("write_file", arguments), fc("read_file", {"path": "notes.md"}, call_id=call_id)], **step},
            {"output": [msg("done")]},
        ],
    )
    r = control.redis
    before = _used_memory(r)
    turn_id = uuid.uuid4().hex
    control.enqueue({"agent_id": f"big-{turn_id}", "input": "go", "model": script_name}, turn_id=turn_id)
    assert control.wait(turn_id, timeout=180).status == TurnStatus.completed
    return turn_id, _used_memory(r) - before


def _refused_and_nothing_ran(control, turn_id: str, homes_root, arguments_size: int, call_id_size: int) -> None:
    """The model reads why each call did not run; nothing ran."""
    arguments_out, call_id_out = output_texts(control, turn_id)
    assert f"{arguments_size:,} bytes" in arguments_out and "AGENT_MAX_ARGUMENTS_BYTES" in arguments_out
    assert len(arguments_out) < 2_000
    assert f"{call_id_size:,} characters" in call_id_out and "did not run" in call_id_out
    events = control.events(turn_id)
    assert not [e for e in events if e["kind"] == "call_started"]
    assert not (homes_root / f"big-{turn_id}" / "big.txt").exists()
    assert [e["error"] for e in events if e["kind"] == "call_planned"] == ["invalid_arguments", "oversized_call_id"]


def _replayed_short(gateway, script_name: str, arguments_size: int) -> None:
    """The next request replays placeholders, every function_call answered, nothing big sent back."""
    request = [b for b in gateway.requests if b["model"] == script_name][-1]
    assert len(orjson.dumps(request)) < 64 * 1024
    items = request["input"]
    calls = [i for i in items if i.get("type") == "function_call"]
    answered = {i["call_id"] for i in items if i.get("type") == "function_call_output"}
    assert len(calls) == 2 and {c["call_id"] for c in calls} == answered
    assert calls[0]["arguments"].startswith(f"[arguments not kept: {arguments_size:,} bytes")
    assert calls[1]["call_id"].startswith("call_cut_")


@pytest.mark.slow
def test_a_20_mb_argument_and_a_3_mb_call_id_cost_what_small_ones_cost(unstreamed, gateway, homes_root):
    control, r = unstreamed.control, unstreamed.control.redis
    small_script, big_script = f"small-{uuid.uuid4().hex[:6]}", f"big-{uuid.uuid4().hex[:6]}"
    small = ({"path": "big.txt", "content": "x"}, "c" * 32)
    _run(control, gateway, f"warm-{small_script}", *small)  # the first turn loads scripts, makes records...
    small_id, grew_small = _run(control, gateway, small_script, *small)
    peak_before = int(r.info("memory")["used_memory_peak"])
    big = {"path": "big.txt", "content": "x" * BIG_ARGUMENTS}
    big_id, grew_big = _run(control, gateway, big_script, big, "c" * BIG_CALL_ID)
    peak_after = int(r.info("memory")["used_memory_peak"])
    small_keys, big_keys = _turn_keys_bytes(r, small_id), _turn_keys_bytes(r, big_id)
    print(
        f"\nRedis used_memory grew {grew_small:,} B for the small turn, {grew_big:,} B for the oversized one; "
        f"peak {peak_before:,} B before it, {peak_after:,} B after; the turn's keys "
        f"{sum(small_keys.values()):,} B (small) and {sum(big_keys.values()):,} B (oversized)"
    )
    # The oversized turn's records are the small one's, plus its placeholders and refusals.
    assert sum(big_keys.values()) <= sum(small_keys.values()) + FEW_KB, big_keys
    assert grew_big <= grew_small + SERVER_SLACK, (grew_small, grew_big)
    assert peak_after - peak_before < 1024 * 1024  # the 23 MB never reached Redis, not even in passing
    size = len(orjson.dumps(big))
    _refused_and_nothing_ran(control, big_id, homes_root, size, BIG_CALL_ID)
    _replayed_short(gateway, big_script, size)


@pytest.mark.slow
def test_a_streamed_oversized_call_streams_a_preview_of_its_arguments(control, gateway, script_name, homes_root):
    """Streamed (the session's worker), a 5 MB argument and a 1 MB ``call_id``: their deltas are a
    preview (``STREAMED_ARGUMENTS_CHARS``), under the call's short id; the rest as unstreamed."""
    from worker.model.streaming import STREAMED_ARGUMENTS_CHARS

    big = {"path": "big.txt", "content": "x" * (5 * 1024 * 1024)}
    turn_id, _ = _run(control, gateway, script_name, big, "c" * (1024 * 1024), stream_chunk=1 << 20)
    deltas = [e for e in control.events(turn_id) if e["kind"] == "model_delta" and e["type"] == "arguments"]
    assert deltas and sum(len(e["delta"]) for e in deltas) <= 2 * STREAMED_ARGUMENTS_CHARS
    assert [e.get("cut") for e in deltas if e["output_index"] == 0][-1] is True
    assert all(len(e["call_id"]) < 100 for e in deltas)
    assert max(_turn_keys_bytes(control.redis, turn_id).values()) < 32 * 1024
    size = len(orjson.dumps(big))
    _refused_and_nothing_ran(control, turn_id, homes_root, size, 1024 * 1024)
    _replayed_short(gateway, script_name, size)


# ----- the caps and placeholders themselves (no service) --------------------------------------


def test_a_reply_within_every_cap_is_not_copied():
    from worker.tooling.oversized import compact_output

    items = [fc("write_file", {"path": "a", "content": "x" * 1000}, call_id="call_1"), {"type": "message", "id": "m"}]
    assert compact_output(items, 1_048_576) is None


def test_placeholders_are_short_the_same_every_time_and_read_back():
    from worker.tooling.oversized import compact_output, cut_call_id_length, held_arguments

    raw = '{"content": "' + "é" * 600_000 + '"}'  # 1.2 MB in UTF-8, 600 k characters
    item = {**fc("write_file", raw, call_id="c" * 5000), "name": "n" * 100, "id": "i" * 300}
    once, again = compact_output([item], 1_048_576), compact_output([dict(item)], 1_048_576)
    assert once == again and once is not None
    [kept] = once
    assert held_arguments(kept["arguments"]) == (len(raw.encode()), 1_048_576) and len(kept["arguments"]) < 200
    assert cut_call_id_length(kept["call_id"]) == 5000 and cut_call_id_length(kept["call_id"] + "~2") == 5000
    assert kept["name"].endswith("~cut") and len(kept["name"]) <= 64 and "id" not in kept
    assert held_arguments("[arguments not kept: 1 bytes]") is None and cut_call_id_length("call_cut_x_1") is None


def test_a_placeholder_is_refused_as_the_arguments_it_stands_for():
    """Planning the memoized reply again (a redelivery) refuses the call with the same words."""
    from pydantic import BaseModel

    from worker.api import ToolResult, define_worker_tool, validate_tool_arguments
    from worker.tooling.oversized import compact_output

    class WriteFile(BaseModel):
        path: str
        content: str

    tool = define_worker_tool(
        name="write_file", description="d", execute=lambda p, c: ToolResult("ok"), input_model=WriteFile
    )
    raw = orjson.dumps({"path": "a", "content": "x" * 2_000_000}).decode()
    whole = validate_tool_arguments(tool, raw)
    [kept] = compact_output([fc("write_file", raw)], 1_048_576)
    held = validate_tool_arguments(tool, kept["arguments"])
    assert whole.error_kind == held.error_kind == "too_large"
    assert whole.error.split("\nYour arguments were")[0] == held.error.split("\nYour arguments were")[0]


def test_the_stream_previews_a_call_and_names_it_as_the_reply_keeps_it():
    from worker.model.interface import Delta
    from worker.model.streaming import STREAMED_ARGUMENTS_CHARS, DeltaBatcher
    from worker.tooling.oversized import cut_call_id

    published: list = []
    batcher = DeltaBatcher(published.extend, step=0, interval=0.0)
    long_id = "c" * 10_000
    for _ in range(50):
        batcher.add(Delta("arguments", 1, "y" * 1000, call_id=long_id, name="write_file"))
        batcher.add(Delta("text", 0, "hello "))
    batcher.close()
    args = [f for kind, f in published if f["type"] == "arguments"]
    assert sum(len(f["delta"]) for f in args) == STREAMED_ARGUMENTS_CHARS and args[-1]["cut"] is True
    assert {f["call_id"] for f in args} == {cut_call_id(long_id)}
    assert "".join(f["delta"] for _, f in published if f["type"] == "text") == "hello " * 50
