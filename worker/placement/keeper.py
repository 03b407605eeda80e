"""A node's housekeeping, run by threads of its tools worker's main process (``tasks.node``):

- ``beat``: the node's heartbeat in the placement records, every ``liveness_ttl / 3`` seconds
  (its own thread, so a long snapshot never lets the node pass for dead);
- snapshots: every ``TICK`` seconds, the homes a destructive computer call changed are handed to
  the node's ``FairScheduler`` (``Settings.snapshot_concurrency`` threads sharing the work round
  robin), each at most once per ``interval / 2`` seconds, so each is snapshotted within
  ``interval`` seconds of the call however large another agent's home is (``docs/placement.md``);
- drains: while the node is marked draining, each of its agents is snapshotted and released (after
  its running calls end), through the same scheduler; their next calls go to another node;
- ``snapshot_all``: at a warm shutdown, the homes changed since their last snapshot.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from worker.placement.homes import NodeHomes
from worker.placement.scheduler import Done, FairScheduler
from worker.placement.snapshots import SnapshotError

log = logging.getLogger("agent.placement")

TICK = 0.5


class Keeper:
    """Housekeeping of the node ``homes.node`` (see the module docstring)."""

    def __init__(self, homes: NodeHomes, interval: float, call_wait: float, concurrency: int = 4):
        self.homes = homes
        self.placement = homes.placement
        self.node = homes.node
        self.interval = interval
        # How long a release waits for the agent's running calls (a tool's time limit).
        self.call_wait = call_wait
        self.scheduler = FairScheduler(concurrency, name=f"agent-snapshots-{homes.node}"[:40])
        self._lock = threading.Lock()
        self._outcomes: dict[str, str] = {}
        self._started: dict[str, float] = {}  # agent -> when its last snapshot started (monotonic)
        self._pending: set[str] = set()  # changed agents not handed to the scheduler yet

    def beat(self) -> None:
        """One heartbeat (raises redis errors)."""
        self.placement.beat(self.node, self.homes.describe())

    # ----- submitting ----------------------------------------------------------
    def _done(self, release: bool) -> Done:
        def done(agent_id: str, outcome: str | None, error: BaseException | None) -> None:
            if isinstance(error, SnapshotError):
                log.error("snapshot of %s on %s failed: %s", agent_id, self.node, error)
                outcome = "failed"
            elif error is not None:
                log.error("snapshot of %s on %s failed", agent_id, self.node, exc_info=error)
                outcome = "failed"
            if outcome in ("busy", "failed") and not release:
                try:
                    self.placement.mark_dirty(self.node, agent_id)  # the next round tries again
                except redis.RedisError:
                    with self._lock:
                        self._pending.add(agent_id)
            with self._lock:
                self._outcomes[agent_id] = str(outcome)

        return done

    def _submit(self, agent_id: str, release: bool) -> bool:
        wait = self.call_wait if release else self.interval
        steps = self.homes.snapshot_steps(agent_id, release=release, wait=wait)
        with self._lock:
            self._outcomes.pop(agent_id, None)
        if self.scheduler.submit(agent_id, steps, self._done(release)):
            self._started[agent_id] = time.monotonic()
            return True
        return False

    def _wait_for(self, agents: set[str]) -> dict[str, str]:
        self.scheduler.wait(agents)
        with self._lock:
            return {a: self._outcomes.get(a, "failed") for a in agents}

    def schedule_changed(self) -> set[str]:
        """Hand the homes changed since their last snapshot to the scheduler (not waiting): those
        whose last snapshot started at least ``interval / 2`` s ago and none is in flight; the others
        wait for a later tick. Returns the agents submitted."""
        fresh = self.placement.take_dirty(self.node)
        with self._lock:
            self._pending |= fresh
            pending = set(self._pending)
        if self.homes.store is None:
            with self._lock:
                self._pending.clear()
            return set()
        now = time.monotonic()
        flight = self.scheduler.in_flight()
        submitted = set()
        for agent_id in sorted(pending):
            if agent_id in flight or now - self._started.get(agent_id, -1e9) < self.interval / 2:
                continue
            if self._submit(agent_id, release=False):
                submitted.add(agent_id)
        with self._lock:
            self._pending -= submitted
        return submitted

    # ----- the synchronous forms (tests, shutdown) --------------------------------
    def snapshot_changed(self) -> dict[str, str]:
        """Snapshot every home changed since its last snapshot and wait: ``{agent_id: outcome}``
        (``stored``, ``busy``, ``failed``, ``over bound``, ``not here``; ``no store``). A home that
        could not be snapshotted (busy, store down) is marked changed again for the next round."""
        if self.homes.store is None:
            agents = self.placement.take_dirty(self.node)
            return {a: "no store" for a in agents}
        agents = self.placement.take_dirty(self.node)
        with self._lock:
            agents |= self._pending
            self._pending.clear()
        self.scheduler.wait(agents)  # one in flight from a tick ends first
        for agent_id in agents:
            self._submit(agent_id, release=False)
        return self._wait_for(agents)

    def drain_pass(self, wait: bool = True) -> dict[str, str]:
        """When the node is draining: release each agent it holds (snapshotted first when a store is
        configured); ``{agent_id: outcome}`` (with ``wait``; else the agents submitted, "submitted").
        A store that fails keeps the agent here (a later pass tries again): a drain never drops a
        home it could not save."""
        if not self.placement.draining(self.node):
            return {}
        held = self.placement.agents_on(self.node)
        flight = self.scheduler.in_flight()
        if wait:
            self.scheduler.wait(held & flight)
            flight = set()
        now = time.monotonic()
        due = {a for a in held - flight if wait or now - self._started.get(a, -1e9) >= self.interval / 2}
        submitted = {a for a in sorted(due) if self._submit(a, release=True)}
        if not wait:
            return {a: "submitted" for a in submitted}
        done = self._wait_for(submitted)
        if not self.placement.agents_on(self.node):
            self.placement.r.hsetnx(f"agent:homes:node:{self.node}", "drained_at", str(time.time()))
        if done:
            log.warning("drain of %s: %s", self.node, done)
        return done

    def snapshot_all(self) -> dict[str, str]:
        """At a warm shutdown: the snapshots in flight end (up to ``call_wait`` s; one cut short by the
        stop marks its home changed again, for the node's next start), then what changed is snapshotted."""
        self.scheduler.wait(timeout=self.call_wait)
        return self.snapshot_changed()

    # ----- threads -----------------------------------------------------------
    def run_beats(self, stop: threading.Event, period: float) -> None:
        """Beat every ``period`` s until ``stop``; a Redis outage only skips beats."""
        while True:
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("placement heartbeat of %s not written: %s", self.node, exc)
            if stop.wait(period):
                return

    def run_chores(self, stop: threading.Event, tick: float = TICK) -> None:
        """Every ``tick`` s until ``stop``: changed homes and drains handed to the scheduler."""
        while not stop.wait(tick):
            try:
                self.drain_pass(wait=False)
                if self.placement.draining(self.node) and not self.placement.agents_on(self.node):
                    self.placement.r.hsetnx(f"agent:homes:node:{self.node}", "drained_at", str(time.time()))
                self.schedule_changed()
            except redis.RedisError as exc:
                log.warning("placement chores of %s skipped: %s", self.node, exc)
            except Exception:  # a bug here must not stop the node's snapshots for good
                log.exception("placement chores of %s failed", self.node)
