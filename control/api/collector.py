"""When the API process collects garbage: between bursts of events, not in the middle of one.

Each open event stream keeps about 250 objects a collection walks (its connection, its request,
its response, its subscription). CPython collects when an allocation crosses a threshold, wherever
the event loop is then: at 2,000 streams a young collection of the objects of newly opened streams
took 100-130 ms, and one that fell inside a burst of events was the burst's p99. ``pace`` turns
the automatic collector off and runs the same collections itself, from one task: the generation
CPython would collect, once as many allocations are due, but only when the stream hub has
delivered nothing for ``quiet`` seconds, unless the collections already owed reach ``most`` times
the threshold (a process never quiet still collects). A full collection comes every
``threshold1 * threshold2`` young ones (CPython also waits for the long-lived objects to grow by a
quarter; that count is not public).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from typing import Callable

log = logging.getLogger("agent.api.collector")


def due_generation(counts: tuple[int, int, int], thresholds: tuple[int, int, int]) -> int | None:
    """The generation CPython's collector would collect now (``gc.get_count()``,
    ``gc.get_threshold()``), or None when nothing is due."""
    if counts[0] < thresholds[0]:
        return None
    if counts[1] + 1 < thresholds[1]:
        return 0
    return 2 if counts[2] + 1 >= thresholds[2] else 1


async def pace(idle_for: Callable[[], float], *, quiet: float = 0.05, period: float = 0.02, most: int = 4) -> None:
    """Collect garbage from this task only (``gc.disable()``; turned back on when it is
    cancelled): every ``period`` seconds, the generation due (``due_generation``) once
    ``idle_for()`` (seconds since the hub last delivered events) is at least ``quiet``, or at once
    when ``most`` times the young threshold of allocations are owed. Runs until cancelled."""
    gc.disable()
    try:
        while True:
            await asyncio.sleep(period)
            counts, thresholds = gc.get_count(), gc.get_threshold()
            generation = due_generation(counts, thresholds)
            if generation is None:
                continue
            if idle_for() < quiet and counts[0] < most * thresholds[0]:
                continue  # events are going out: later, within the bound
            gc.collect(generation)
    finally:
        gc.enable()
