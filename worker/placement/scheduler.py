"""A fair share of a node's snapshot work between its agents (``docs/placement.md``, "Several at once").

A snapshot is a generator (``worker.placement.homes.NodeHomes.snapshot_steps``) that does a small,
bounded piece of work per step (a chunk read, hashed and uploaded; a few files) and yields. The
scheduler runs the steps of every snapshot in flight on ``workers`` threads, round robin: a job
whose step is done goes to the back of the line. So one agent's huge first snapshot takes one
step in turn with everyone else's, and a small home's snapshot waits for a few steps, never for the
huge one to finish. A step that yields a number asks to be resumed after that many seconds (a lock
the agent's running call holds) and takes no thread meanwhile.

One job per key (an agent) at a time: ``submit`` refuses a key already in flight.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Generator

log = logging.getLogger("agent.placement")

Steps = Generator[float | None, None, str]
"""A snapshot's steps: each yields ``None`` (more to do) or seconds to wait; it returns its outcome."""
Done = Callable[[str, str | None, BaseException | None], None]
"""``done(key, outcome, error)``: the outcome is ``None`` when the steps raised or never ended."""


@dataclass
class _Job:
    key: str
    steps: Steps
    done: Done


class FairScheduler:
    """Round-robin over jobs on ``workers`` threads named ``name-N`` (module docstring)."""

    def __init__(self, workers: int, name: str = "agent-snapshots"):
        self._ready: deque[_Job] = deque()
        self._sleeping: list[tuple[float, int, _Job]] = []
        self._seq = itertools.count()
        self._keys: set[str] = set()
        self._cond = threading.Condition()
        self._stopped = False
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True) for i in range(max(1, workers))
        ]
        for t in self._threads:
            t.start()

    def submit(self, key: str, steps: Steps, done: Done) -> bool:
        """Run ``steps`` under ``key``; ``done(key, result, error)`` is called from a worker thread when
        it ends. False (and ``steps`` closed) when ``key`` is in flight or the scheduler stopped."""
        with self._cond:
            if key in self._keys or self._stopped:
                steps.close()
                return False
            self._keys.add(key)
            self._ready.append(_Job(key, steps, done))
            self._cond.notify()
        return True

    def in_flight(self) -> set[str]:
        """The keys of the jobs not finished."""
        with self._cond:
            return set(self._keys)

    def wait(self, keys: set[str] | None = None, timeout: float | None = None) -> bool:
        """Wait until the jobs of ``keys`` (all when None) have finished. False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._keys & keys if keys is not None else self._keys:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left if left is None else min(left, 0.5))
        return True

    def stop(self) -> None:
        """Close every job not finished (its ``finally`` blocks run: locks released; ``done`` is told
        ``RuntimeError``) and end the threads (a step under way ends first)."""
        with self._cond:
            self._stopped = True
            jobs = list(self._ready) + [j for _, _, j in self._sleeping]
            self._ready.clear()
            self._sleeping.clear()
            self._cond.notify_all()
        for job in jobs:
            self._finish(job, None, RuntimeError("the node is stopping"), close=True)
        for t in self._threads:  # a step under way ends, then its job is closed the same way
            if t is not threading.current_thread():
                t.join(timeout=60)

    def _next(self) -> _Job | None:
        with self._cond:
            while not self._stopped:
                now = time.monotonic()
                while self._sleeping and self._sleeping[0][0] <= now:
                    self._ready.append(heapq.heappop(self._sleeping)[2])
                if self._ready:
                    return self._ready.popleft()
                timeout = self._sleeping[0][0] - now if self._sleeping else None
                self._cond.wait(timeout)
            return None

    def _run(self) -> None:
        while True:
            job = self._next()
            if job is None:
                return
            try:
                pause = next(job.steps)
            except StopIteration as stop:
                self._finish(job, stop.value, None)
                continue
            except BaseException as exc:  # the job's own error: reported, the thread goes on
                self._finish(job, None, exc)
                continue
            with self._cond:
                if self._stopped:
                    pass
                elif pause:
                    heapq.heappush(self._sleeping, (time.monotonic() + pause, next(self._seq), job))
                    self._cond.notify()
                    continue
                else:
                    self._ready.append(job)  # the back of the line: everyone else's step comes first
                    self._cond.notify()
                    continue
            self._finish(job, None, RuntimeError("the node is stopping"), close=True)

    def _finish(self, job: _Job, result: str | None, error: BaseException | None, close: bool = False) -> None:
        if close:
            try:
                job.steps.close()
            except Exception:  # its cleanup failed: logged, the others still end
                log.exception("snapshot job %s did not close cleanly", job.key)
        try:
            job.done(job.key, result, error)
        except Exception:
            log.exception("snapshot job %s: its completion failed", job.key)
        finally:
            with self._cond:
                self._keys.discard(job.key)
                self._cond.notify_all()
