"""A node's housekeeping, run by threads of its tools worker's main process (``tasks.placement``):

- ``beat``: the node's heartbeat in the placement records, every ``liveness_ttl / 3`` seconds
  (its own thread, so a long snapshot never lets the node pass for dead);
- ``snapshot_changed``: every ``Settings.snapshot_interval`` seconds, a snapshot of each home a
  destructive computer call changed since the last one (``docs/placement.md``: the policy);
- ``drain_pass``: while the node is marked draining, each of its agents is snapshotted and
  released (after its running calls end); their next calls are placed on another node;
- ``snapshot_all``: at a warm shutdown, the homes changed since their last snapshot.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from worker.placement.homes import NodeHomes
from worker.placement.snapshots import SnapshotError

log = logging.getLogger("agent.placement")


class Keeper:
    """Housekeeping of the node ``homes.node`` (see the module docstring)."""

    def __init__(self, homes: NodeHomes, interval: float, call_wait: float):
        self.homes = homes
        self.placement = homes.placement
        self.node = homes.node
        self.interval = interval
        # How long a snapshot or a release waits for the agent's running calls (a tool's time limit).
        self.call_wait = call_wait

    def beat(self) -> None:
        """One heartbeat (raises redis errors)."""
        self.placement.beat(self.node, self.homes.describe())

    def snapshot_changed(self) -> dict[str, str]:
        """Snapshot every home changed since its last snapshot; ``{agent_id: outcome}``. A home that
        could not be snapshotted (busy, store down) is marked changed again for the next round."""
        done: dict[str, str] = {}
        agents = self.placement.take_dirty(self.node)
        if self.homes.store is None:
            return {a: "no store" for a in agents}
        for agent_id in sorted(agents):
            try:
                done[agent_id] = self.homes.snapshot(agent_id, wait=self.interval)
            except SnapshotError as exc:
                log.error("snapshot of %s on %s failed: %s", agent_id, self.node, exc)
                done[agent_id] = "failed"
            if done[agent_id] in ("busy", "failed"):
                self.placement.mark_dirty(self.node, agent_id)
        return done

    def drain_pass(self) -> dict[str, str]:
        """When the node is draining: release each agent it holds (snapshotted first when a store is
        configured); ``{agent_id: outcome}``. A store that fails keeps the agent here (its next pass
        tries again): a drain never drops a home it could not save."""
        if not self.placement.draining(self.node):
            return {}
        done: dict[str, str] = {}
        for agent_id in sorted(self.placement.agents_on(self.node)):
            try:
                done[agent_id] = self.homes.snapshot(agent_id, release=True, wait=self.call_wait)
            except SnapshotError as exc:
                log.error("drain of %s on %s: snapshot failed, agent kept here: %s", agent_id, self.node, exc)
                done[agent_id] = "failed"
        if not self.placement.agents_on(self.node):
            self.placement.r.hsetnx(f"agent:homes:node:{self.node}", "drained_at", str(time.time()))
        if done:
            log.warning("drain of %s: %s", self.node, done)
        return done

    def snapshot_all(self) -> dict[str, str]:
        """At a warm shutdown: snapshot what changed (bounded by the snapshot wait)."""
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

    def run_chores(self, stop: threading.Event, tick: float = 0.5) -> None:
        """Drain passes every ``tick`` s and snapshots every ``interval`` s, until ``stop``."""
        next_snapshots = time.monotonic() + self.interval
        while not stop.wait(tick):
            try:
                self.drain_pass()
                if time.monotonic() >= next_snapshots:
                    next_snapshots = time.monotonic() + self.interval
                    self.snapshot_changed()
            except redis.RedisError as exc:
                log.warning("placement chores of %s skipped: %s", self.node, exc)
            except Exception:  # a bug here must not stop the node's snapshots for good
                log.exception("placement chores of %s failed", self.node)
