"""The API process collects garbage from its own task, between bursts of events
(``control.api.collector``): the generation CPython would collect, once due, when the stream hub
has been quiet, or at once past a bound when it never is."""

from __future__ import annotations

import asyncio
import gc

from control.api.collector import due_generation, pace


def test_the_generation_due_is_the_one_cpython_would_collect():
    t = (100, 3, 2)
    assert due_generation((99, 0, 0), t) is None
    assert due_generation((100, 0, 0), t) == 0
    assert due_generation((100, 1, 0), t) == 0
    assert due_generation((100, 2, 0), t) == 1  # the third young collection is a generation-1 one
    assert due_generation((100, 2, 1), t) == 2


class _Cycle:
    __slots__ = ("me",)  # one tracked object each (no instance dict)

    def __init__(self) -> None:
        self.me = self


def _collections() -> int:
    return sum(s["collections"] for s in gc.get_stats())


def test_collections_wait_for_a_quiet_hub_within_a_bound_and_the_collector_comes_back_on():
    thresholds = gc.get_threshold()

    async def run() -> None:
        idle = {"for": 0.0}  # the hub has just delivered events
        task = asyncio.create_task(pace(lambda: idle["for"], quiet=0.05, period=0.005, most=4))
        await asyncio.sleep(0.02)
        assert not gc.isenabled()
        before = _collections()
        keep = [_Cycle() for _ in range(200)]  # due: 2x the young threshold, under the bound
        await asyncio.sleep(0.05)
        assert _collections() == before  # busy: nothing collected yet
        idle["for"] = 1.0
        await asyncio.sleep(0.05)
        assert _collections() > before  # quiet: collected
        idle["for"] = 0.0
        before = _collections()
        keep += [_Cycle() for _ in range(600)]  # past 4x the young threshold: collected though busy
        await asyncio.sleep(0.05)
        assert _collections() > before
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert gc.isenabled()
        del keep

    gc.set_threshold(100, 10, 10)
    try:
        asyncio.run(run())
    finally:
        gc.set_threshold(*thresholds)
        gc.enable()
