"""A node's supervisor reports its worker's death at once, instead of letting the heartbeat expire.

Without it a killed worker main process is noticed when its heartbeat key expires
(``liveness_ttl``), a full TTL of grace has passed (a Redis restart pauses heartbeats without
killing anyone) and a sweep has run on a live worker: 7-18 s measured by ``make soak``. The
supervisor (``devtools.workers.Supervisor``) knows sooner and for sure: ``waitpid`` returned. So
``NodeRecovery`` (its ``on_exit``), for a worker process:

1. kills what is left of the node (its process group: prefork pool children orphaned by the kill),
   so that the node is dead as a whole and no orphan finishes a call it no longer owns;
2. re-drives the turns the node held (``tasks.watchdog.recover_node``: its heartbeat is dropped,
   its held tasks taken, each turn re-driven once: fenced, so safe if anything was still queued);
3. ``RESTORE_AFTER`` seconds later, gives back to their queues the turn messages fetched before
   the death that no live worker holds (``tasks.watchdog.restore_orphans``): a message the dying
   process had fetched but not yet recorded as held;
4. ``RECONCILE_AFTER`` seconds after the death, re-drives the active turns that no message names
   and no node holds (``tasks.watchdog.unnamed_turns_redriven``): a message the dying process had
   popped from its queue but not yet recorded as fetched is nowhere else, and its turn would
   wait for its progress deadline.

All of it runs in a thread of the supervisor (its watch loop never blocks) and retries while
Redis does not answer, up to ``GIVE_UP`` seconds; the heartbeat path stays as the fallback.
The runtime is imported in the background when ``NodeRecovery`` is built, so that the first
death is not slowed by imports.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Callable, TypeVar

import redis

from worker.turn.liveness import HOST

if TYPE_CHECKING:  # imported in the background (module docstring)
    from worker.turn.engine import TurnEngine

log = logging.getLogger("agent.supervisor")
_T = TypeVar("_T")

RESTORE_AFTER = 1.5  # seconds: live workers write what they hold every 0.5 s (tasks.liveness)
# Seconds: a turn that progressed within ``tasks.watchdog.QUIET_FOR`` (3 s) is not judged; after
# this, the turns the death left without a message have been quiet that long.
RECONCILE_AFTER = 3.5
GIVE_UP = 60.0


class NodeRecovery:
    """``on_exit(name, pid, returncode)`` for ``Supervisor``: acts for the process names in ``nodes``."""

    def __init__(self, nodes: set[str]):
        self.nodes = set(nodes)
        self.recovered: list[tuple[str, float, dict[str, str]]] = []  # (node, seconds after exit, actions)
        self._ready = threading.Event()
        self._engine: TurnEngine | None = None
        threading.Thread(target=self._load, name="node-recovery-import", daemon=True).start()

    def _load(self) -> None:
        try:
            from tasks.runtime import get_engine

            self._engine = get_engine()
        finally:
            self._ready.set()

    def __call__(self, name: str, pid: int, returncode: int | None) -> None:
        if name not in self.nodes:
            return
        try:
            os.killpg(pid, signal.SIGKILL)  # started in a session of its own: its group is the node
        except (ProcessLookupError, PermissionError):
            pass
        threading.Thread(
            target=self._recover, args=(f"{HOST}:{pid}", time.time()), name=f"recover-{pid}", daemon=True
        ).start()

    def _recover(self, node: str, died_at: float) -> None:
        from tasks.watchdog import NODE_DEATH_REASON, recover_node, restore_orphans, unnamed_turns_redriven

        self._ready.wait(GIVE_UP)
        engine = self._engine
        if engine is None:
            log.error("cannot recover %s: the runtime did not load", node)
            return
        taken: set[str] = set()  # its held tasks: re-driven, so not given back as well
        actions = self._retry(lambda: recover_node(engine, node, known_dead=True, taken=taken), f"re-drive of {node}")
        if actions is not None:
            self.recovered.append((node, time.time() - died_at, actions))
            log.warning("worker %s exited: %d turn(s) re-driven", node, len(actions))
        time.sleep(max(0.0, died_at + RESTORE_AFTER - time.time()))
        restored = self._retry(lambda: restore_orphans(engine, before=died_at, skip=taken), f"orphans of {node}")
        if restored:
            log.warning("worker %s exited: %d fetched message(s) given back to their queues", node, restored)
        time.sleep(max(0.0, died_at + RECONCILE_AFTER - time.time()))
        reason = NODE_DEATH_REASON.format(node)
        found = self._retry(lambda: unnamed_turns_redriven(engine, reason), f"turns without a message after {node}")
        if found:
            log.warning("worker %s exited: %d turn(s) without any message re-driven", node, len(found))

    @staticmethod
    def _retry(run: Callable[[], _T], what: str) -> _T | None:
        deadline = time.monotonic() + GIVE_UP
        delay = 0.2
        while True:
            try:
                return run()
            except redis.RedisError as exc:
                if time.monotonic() + delay > deadline:
                    log.error("%s: Redis did not answer (%s); the heartbeat path will recover it", what, exc)
                    return None
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            except Exception:
                log.exception("%s failed; the heartbeat path will recover it", what)
                return None
