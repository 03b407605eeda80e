"""The model calls' event loop (``worker.model.call_loop``) is uvloop's, and runs what it is given."""

from __future__ import annotations

import asyncio

import uvloop

from worker.model.call_loop import CallLoop


def test_the_loop_is_uvloops_and_runs_coroutines_from_other_threads():
    loop = CallLoop(name="test-call-loop")
    try:
        assert isinstance(loop.loop, uvloop.Loop)

        async def answer() -> int:
            await asyncio.sleep(0.01)
            return 42

        assert loop.submit(answer()).result(timeout=5) == 42
    finally:
        loop.stop()
    assert not loop.running
