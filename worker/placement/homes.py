"""A node's side of placement: which homes this node holds, for which epoch, and the admission of
each computer call (``worker.turn.interfaces.Computers``).

A node is a homes root. Its name is ``Settings.node_name``, else the one kept in
``<homes_root>/.placement/node`` (made on the first start as ``<hostname>-<random>``), so every
tools worker that shares a homes root (one machine, or one volume) is the same node, and a node
whose disk was replaced is a new one.

Per agent, in ``<homes_root>/.placement/`` (never inside a home, so no agent can change them):

- ``<agent_id>.lock``: a calling process holds it shared for the length of a call; a snapshot, a
  drain or a restore holds it exclusively, so each sees a home no call is changing (commands never
  outlive their call) and no call runs in a home being replaced;
- ``<agent_id>.epoch``: the placement epoch the home on this disk belongs to. A call placed here at
  another epoch first materializes the home: restored from the last snapshot, or emptied ("reset")
  when there is none, and the model is told which, before the call's output. A first placement
  (``reason == "new"``) keeps whatever the home already holds here (a home made before placement).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from worker.placement.records import Located, Placement, SnapshotInfo, node_queue
from worker.placement.snapshots import SnapshotError, SnapshotStore, clear_dir
from worker.settings import Settings
from worker.turn.interfaces import HomeAdmission

log = logging.getLogger("agent.placement")

META_DIR = ".placement"


def node_name(settings: Settings) -> str:
    """This node's name: ``Settings.node_name``, else the one stored in the homes root (made now
    if missing; two workers starting at once agree: the file is created exclusively)."""
    if settings.node_name:
        return settings.node_name
    meta = meta_dir(settings)
    path = meta / "node"
    host = "".join(c if c.isalnum() or c in "_.-" else "-" for c in socket.gethostname())[:40] or "node"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # the creator writes right after creating
            name = path.read_text().strip()
            if name:
                return name
            time.sleep(0.02)
        raise RuntimeError(f"{path} is empty: delete it, or set AGENT_NODE_NAME") from None
    name = f"{host}-{secrets.token_hex(3)}"
    with os.fdopen(fd, "w") as f:
        f.write(name + "\n")
    return name


def meta_dir(settings: Settings) -> Path:
    """``<homes_root>/.placement`` (mode 0700), made if missing."""
    path = Path(settings.homes_root).resolve() / META_DIR
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _why(loc: Located) -> str:
    if loc.reason == "drained":
        return f"its previous node ({loc.prev}) was drained"
    return f"the node that held it ({loc.prev or 'unknown'}) stopped"


def restored_notice(loc: Located, snap: SnapshotInfo, moved_at: float) -> str:
    """What the model is told when its home was restored from a snapshot."""
    lag = max(0, round(moved_at - snap.taken_at))
    return (
        f"[computer moved] Your computer was moved to another node because {_why(loc)}. Your home was "
        f"restored from its last snapshot, taken at {_utc(snap.taken_at)} ({lag} s before the move): "
        "changes made after that are lost, and no process or /tmp file survived. Check the state of "
        "files you changed recently before relying on them."
    )


def reset_notice(loc: Located, why_empty: str) -> str:
    """What the model is told when its home had to start empty on the new node."""
    return (
        f"[computer reset] Your computer was reset because {_why(loc)} and {why_empty}. Your home "
        "directory is now empty: files you wrote before are gone, and nothing from before survived."
    )


class _Lock:
    """An ``flock`` on ``<meta>/<agent>.lock``; shared for a call, exclusive to replace or snapshot."""

    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def shared(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_SH)

    def exclusive(self, timeout: float | None = None) -> bool:
        """Take it exclusively: at once when ``timeout`` is None... or within ``timeout`` s (False if not)."""
        if timeout is None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)
            return True
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)

    def close(self) -> None:
        os.close(self.fd)  # releases the lock


class NodeHomes:
    """The homes of node ``node`` (its homes root is ``settings.homes_root``), against the placement
    records ``placement`` and the snapshot ``store`` (None: no snapshots, a moved home starts empty).

    ``prepare(home)`` makes a home's file system ready before it is emptied or restored (the
    quota image mounted: ``worker.tools.computer.homes.provision``, given by the Celery edge; raises
    ``RuntimeError``/``OSError``); ``retire(home)`` undoes it once a drain let the agent go."""

    def __init__(
        self,
        placement: Placement,
        settings: Settings,
        node: str,
        store: SnapshotStore | None,
        prepare: Callable[[Path], None] | None = None,
        retire: Callable[[Path], None] | None = None,
    ):
        self.placement = placement
        self.settings = settings
        self.node = node
        self.store = store
        self.prepare = prepare
        self.retire = retire
        self.root = Path(settings.homes_root).resolve()
        self.meta = meta_dir(settings)
        # (agent, epoch) whose home this process saw materialized: the epoch file is then not read
        # again (a new placement always has a new epoch).
        self._ready: set[tuple[str, int]] = set()
        self._ready_lock = threading.Lock()

    def home(self, agent_id: str) -> Path:
        """``<homes_root>/<agent_id>``."""
        return self.root / agent_id

    def lock(self, agent_id: str) -> _Lock:
        """The agent's lock (open; ``close()`` it)."""
        return _Lock(self.meta / f"{agent_id}.lock")

    def epoch(self, agent_id: str) -> int | None:
        """The epoch the home on this disk belongs to (None: none recorded)."""
        try:
            return int((self.meta / f"{agent_id}.epoch").read_text())
        except (FileNotFoundError, ValueError):
            return None

    def _set_epoch(self, agent_id: str, epoch: int) -> None:
        tmp = self.meta / f"{agent_id}.epoch.tmp"
        tmp.write_text(str(epoch))
        os.replace(tmp, self.meta / f"{agent_id}.epoch")

    # ----- a call ------------------------------------------------------------
    def admit(self, agent_id: str, destructive: bool) -> HomeAdmission:
        """``Computers.admit``: forward the call when another node holds the home, refuse it when no
        node can take it, else hold the home (shared) for the call, materializing it first when it
        was just placed here. Raises redis errors (the call is then retried like any other)."""
        loc = self.placement.locate(agent_id, asking=self.node, changed=destructive)
        if not loc.node:
            return HomeAdmission(
                error=(
                    "Error: no node can hold this agent's computer right now (every tools node is "
                    "draining or down); nothing ran. Try again later."
                )
            )
        if loc.node != self.node:
            return HomeAdmission(forward_to=node_queue(loc.node))
        lock = self.lock(agent_id)
        try:
            lock.shared()
            notice = None
            if (agent_id, loc.epoch) not in self._ready and self.epoch(agent_id) != loc.epoch:
                lock.exclusive()
                try:
                    if self.epoch(agent_id) != loc.epoch:  # another process may have done it meanwhile
                        notice = self._materialize(agent_id, loc)
                finally:
                    lock.shared()
            with self._ready_lock:
                self._ready.add((agent_id, loc.epoch))
        except SnapshotError as exc:
            lock.close()
            log.error("home of %s not restored on %s: %s", agent_id, self.node, exc)
            return HomeAdmission(
                error=(
                    "Error: your computer was moved to another node and its home could not be restored "
                    "from its snapshot yet (the snapshot store did not answer); nothing ran. Try again shortly."
                )
            )
        except (RuntimeError, OSError) as exc:  # the home's file system could not be made ready
            lock.close()
            log.error("home of %s not made ready on %s: %s", agent_id, self.node, exc)
            return HomeAdmission(error=f"Error: your computer was moved to another node and {exc}; nothing ran.")
        except BaseException:
            lock.close()
            raise
        return HomeAdmission(notice=notice, release=lock.close)

    def _materialize(self, agent_id: str, loc: Located) -> str | None:
        """Make the home on this disk the one of epoch ``loc.epoch`` (caller holds the lock
        exclusively). Returns what to tell the model, or None. Raises ``SnapshotError``."""
        home = self.home(agent_id)
        home.mkdir(parents=True, exist_ok=True)
        if loc.reason == "new":  # a first placement: whatever is here is the agent's only home
            self._set_epoch(agent_id, loc.epoch)
            return None
        moved_at = time.time()
        if self.prepare is not None:  # e.g. a quota image from an older epoch: mounted, then replaced
            self.prepare(home)
        snap = self.placement.snapshot(agent_id) if self.store is not None else None
        if self.store is not None and snap is not None:
            self.store.restore(snap.object, home, self.meta)
            notice = restored_notice(loc, snap, moved_at)
        else:
            clear_dir(home)
            why = (
                "no snapshot store is configured (AGENT_SNAPSHOT_STORE)"
                if self.store is None
                else "no snapshot of its home had been taken yet"
            )
            notice = reset_notice(loc, why)
        self._set_epoch(agent_id, loc.epoch)
        log.warning("home of %s placed on %s at epoch %s: %s", agent_id, self.node, loc.epoch, notice)
        return notice

    # ----- housekeeping (worker.placement.keeper) -----------------------------
    def snapshot(self, agent_id: str, release: bool = False, wait: float = 60.0) -> str:
        """Snapshot the agent's home if this node holds it (and with ``release``, let it go: a
        drain). Waits up to ``wait`` s for its running calls to end. Returns what happened:
        ``"stored"``, ``"released"``, ``"not here"``, ``"busy"``. Raises ``SnapshotError``."""
        record = self.placement.record(agent_id)
        if record.get("node") != self.node:
            return "not here"
        epoch = int(record.get("epoch", "0"))
        lock = self.lock(agent_id)
        try:
            if not lock.exclusive(timeout=wait):
                return "busy"
            obj, size = "", 0
            if self.store is not None and self.epoch(agent_id) == epoch and self.home(agent_id).is_dir():
                obj, size = self.store.put(self.home(agent_id), agent_id, epoch, self.meta)
            accepted, old = self.placement.commit(agent_id, self.node, epoch, obj, size, release=release)
            if not accepted:  # re-placed meanwhile: this node's copy is stale
                if obj:
                    self.store.delete(obj)  # type: ignore[union-attr]
                return "not here"
            if old and self.store is not None:
                self.store.delete(old)
            if release:
                with self._ready_lock:
                    self._ready.discard((agent_id, epoch))
                if self.retire is not None:
                    try:
                        self.retire(self.home(agent_id))
                    except (RuntimeError, OSError) as exc:  # its copy is stale now anyway
                        log.warning("home of %s not retired on %s: %s", agent_id, self.node, exc)
            return "released" if release else "stored"
        finally:
            lock.close()

    def describe(self) -> dict[str, Any]:
        """What this node tells operators (``Placement.beat``'s info)."""
        return {"root": str(self.root), "store": self.store.url if self.store else ""}
