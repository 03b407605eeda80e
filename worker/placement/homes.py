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

from worker.placement.entries import Chunk
from worker.placement.home_writer import WriteRefused
from worker.placement.records import Located, Placement, SnapshotInfo, node_queue
from worker.placement.restorer import Restorer, Wanted, capacity, empty_home
from worker.placement.scheduler import Steps
from worker.placement.signing import SnapshotKey, SnapshotRefused
from worker.placement.snapshots import SnapshotError, SnapshotStore
from worker.placement.taker import FileState, SnapshotOverBound, Taken, Taker
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


class _Known:
    """What this process knows of an agent's snapshots: the ``object`` last recorded, the ``chunks``
    it references (what the store holds for the agent), the ``files`` states to skip unchanged files,
    and when its chunks were last swept."""

    def __init__(self, obj: str, chunks: set[str], files: dict[str, tuple[FileState, tuple[Chunk, ...]]]):
        self.object = obj
        self.chunks = chunks
        self.files = files
        self.swept_at = 0.0


# Chunks no manifest references are deleted when a snapshot replaces the one that referenced them,
# and swept at most this often per agent (those of snapshots that failed or were refused), once they
# are GC_GRACE old: a chunk another snapshot is still uploading is never that old.
SWEEP_EVERY = 3600.0
GC_GRACE = 3600.0


class NodeHomes:
    """The homes of node ``node`` (its homes root is ``settings.homes_root``), against the placement
    records ``placement`` and the snapshot ``store`` (None: no snapshots, a moved home starts empty).
    A store needs the nodes' key, ``settings.snapshot_key`` (``ValueError`` without it).

    ``prepare(home)`` makes a home's file system ready before it is emptied or restored (the
    quota image mounted: ``worker.tools.computer.homes.provision``, given by the Celery edge; raises
    ``RuntimeError``/``OSError``) and returns the agent's ``(uid, gid)`` (None: the worker's own), as
    which a restore writes; ``retire(home)`` undoes it once a drain let the agent go."""

    def __init__(
        self,
        placement: Placement,
        settings: Settings,
        node: str,
        store: SnapshotStore | None,
        prepare: Callable[[Path], tuple[int, int] | None] | None = None,
        retire: Callable[[Path], None] | None = None,
    ):
        self.placement = placement
        self.settings = settings
        self.node = node
        self.prepare = prepare
        self.retire = retire
        self.root = Path(settings.homes_root).resolve()
        self.meta = meta_dir(settings)
        self.store = store
        # (agent, epoch) whose home this process saw materialized: the epoch file is then not read
        # again (a new placement always has a new epoch).
        self._ready: set[tuple[str, int]] = set()
        self._ready_lock = threading.Lock()
        self._known: dict[str, _Known] = {}
        # The last snapshot failure on this node, for operators (``describe``).
        self.last_failure: dict[str, str] = {}

    @property
    def store(self) -> SnapshotStore | None:
        """The snapshot store (None: none)."""
        return self._store

    @store.setter
    def store(self, store: SnapshotStore | None) -> None:
        self._store = store
        self.taker: Taker | None = None
        self.restorer: Restorer | None = None
        if store is not None:
            if self.settings.snapshot_key is None:
                raise ValueError("a snapshot store needs AGENT_SNAPSHOT_KEY (the key every tools node holds)")
            key = SnapshotKey(self.settings.snapshot_key.get_secret_value())
            self.taker, self.restorer = Taker(store, key), Restorer(store, key)

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

    def _fail(self, agent_id: str, reason: str) -> None:
        """Record a failed or refused snapshot for operators (the agent's record, the node's info, the log)."""
        log.error("snapshot of %s on %s: %s", agent_id, self.node, reason)
        self.last_failure = {"agent": agent_id, "reason": reason, "at": f"{time.time():.0f}"}
        try:
            self.placement.record_failure(agent_id, self.node, reason)
        except Exception:  # Redis down: the log line stays
            log.exception("snapshot failure of %s not recorded", agent_id)

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
        except (RuntimeError, OSError, WriteRefused) as exc:  # the home's file system could not be made ready
            lock.close()
            log.error("home of %s not made ready on %s: %s", agent_id, self.node, exc)
            return HomeAdmission(error=f"Error: your computer was moved to another node and {exc}; nothing ran.")
        except BaseException:
            lock.close()
            raise
        return HomeAdmission(notice=notice, release=lock.close)

    def _materialize(self, agent_id: str, loc: Located) -> str | None:
        """Make the home on this disk the one of epoch ``loc.epoch`` (caller holds the lock
        exclusively). Returns what to tell the model, or None. Raises ``SnapshotError`` (the store
        did not answer: try again), ``WriteRefused``."""
        home = self.home(agent_id)
        home.mkdir(parents=True, exist_ok=True)
        if loc.reason == "new":  # a first placement: whatever is here is the agent's only home
            self._set_epoch(agent_id, loc.epoch)
            return None
        moved_at = time.time()
        owner = self.prepare(home) if self.prepare is not None else None  # e.g. a quota image, mounted
        snap = self.placement.snapshot(agent_id) if self.store is not None else None
        if self.restorer is not None and snap is not None:
            try:
                wanted = Wanted(agent_id, snap.object, snap.epoch, snap.format)
                self.restorer.restore(wanted, home, owner, capacity(home))
                notice = restored_notice(loc, snap, moved_at)
            except SnapshotRefused as exc:
                self._fail(agent_id, f"restore refused: {exc.reason}")
                empty_home(home, owner)
                notice = reset_notice(loc, f"the snapshot was refused: {exc.reason}")
        else:
            empty_home(home, owner)
            why = (
                "no snapshot store is configured (AGENT_SNAPSHOT_STORE)"
                if self.store is None
                else "no snapshot of its home had been taken yet"
            )
            notice = reset_notice(loc, why)
        self._forget(agent_id)
        self._set_epoch(agent_id, loc.epoch)
        log.warning("home of %s placed on %s at epoch %s: %s", agent_id, self.node, loc.epoch, notice)
        return notice

    # ----- housekeeping (worker.placement.keeper) -----------------------------
    def snapshot(self, agent_id: str, release: bool = False, wait: float = 60.0) -> str:
        """``snapshot_steps`` run to its end in this thread (tests, a shutdown). Raises ``SnapshotError``."""
        steps = self.snapshot_steps(agent_id, release, wait)
        try:
            while True:
                pause = next(steps)
                if pause:
                    time.sleep(pause)
        except StopIteration as done:
            return str(done.value)

    def snapshot_steps(self, agent_id: str, release: bool = False, wait: float = 60.0) -> Steps:
        """Snapshot the agent's home if this node holds it (and with ``release``, let it go: a
        drain), as steps for the node's scheduler (``worker.placement.scheduler``): it yields after
        each bounded piece of work, or a number of seconds to wait for the agent's running calls
        (``wait`` s at most). Returns what happened: ``"stored"``, ``"released"``, ``"not here"``,
        ``"busy"``, ``"over bound"`` (the home exceeds its bound: recorded, not stored). Raises
        ``SnapshotError`` (the store did not answer)."""
        record = self.placement.record(agent_id)
        if record.get("node") != self.node:
            return "not here"
        epoch = int(record.get("epoch", "0"))
        lock = self.lock(agent_id)
        try:
            deadline = time.monotonic() + wait
            while not lock.exclusive(timeout=0):
                if time.monotonic() >= deadline:
                    return "busy"
                yield 0.05
            taken: Taken | None = None
            known: _Known | None = None
            if self.taker is not None and self.epoch(agent_id) == epoch and self.home(agent_id).is_dir():
                known = self._known_for(agent_id)
                try:
                    taken = yield from self.taker.take(
                        self.home(agent_id),
                        agent_id,
                        epoch,
                        self.node,
                        known=set(known.chunks),
                        files=known.files,
                        bound=self.settings.home_quota_mb * 1024**2 or None,
                    )
                except SnapshotOverBound as exc:
                    self._fail(agent_id, exc.reason)
                    return "over bound"
            obj, size, sent = (taken.object, taken.data, taken.uploaded) if taken else ("", 0, 0)
            accepted, old = self.placement.commit(agent_id, self.node, epoch, obj, size, release, sent)
            if not accepted:  # re-placed meanwhile: this node's copy is stale (its chunks: the sweep's)
                if taken is not None and self.store is not None:
                    self.store.delete(taken.object)
                self._forget(agent_id)
                return "not here"
            if taken is not None and known is not None:
                self._collect(agent_id, known, taken)
            if old and self.store is not None:
                self.store.delete(old)
            if release:
                self._forget(agent_id)
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

    def _known_for(self, agent_id: str) -> _Known:
        """What the store holds for the agent, as of its last recorded snapshot: this process's
        memory, else that snapshot's manifest read back (verified); nothing when it cannot be read."""
        snap = self.placement.snapshot(agent_id)
        obj = snap.object if snap is not None else ""
        known = self._known.get(agent_id)
        if known is not None and known.object == obj:
            return known
        chunks: set[str] = set()
        if snap is not None and snap.format == "manifest" and self.restorer is not None:
            try:
                chunks = self.restorer.chunks_of(Wanted(agent_id, snap.object, snap.epoch, snap.format))
            except (SnapshotRefused, SnapshotError) as exc:  # uploaded again: same names, same bytes
                log.warning("last snapshot of %s not read back (%s): its chunks are uploaded again", agent_id, exc)
        known = self._known[agent_id] = _Known(obj, chunks, {})
        return known

    def _collect(self, agent_id: str, known: _Known, taken: Taken) -> None:
        """After ``taken`` was recorded: delete the chunks only the snapshot it replaced referenced,
        and now and then sweep chunks no snapshot references (failed or refused ones')."""
        assert self.store is not None
        dropped = known.chunks - taken.chunks
        self.store.delete_many(self.store.chunk_key(agent_id, c) for c in dropped)
        known.object, known.chunks, known.files = taken.object, set(taken.chunks), taken.files
        now = time.time()
        if now - known.swept_at < SWEEP_EVERY:
            return
        known.swept_at = now
        try:
            stored = self.store.chunks_of(agent_id)
        except SnapshotError as exc:
            log.warning("chunks of %s not swept: %s", agent_id, exc)
            return
        stale = [c for c, at in stored.items() if c not in taken.chunks and at < now - GC_GRACE]
        if stale:
            self.store.delete_many(self.store.chunk_key(agent_id, c) for c in stale)
            log.info("swept %d unreferenced chunks of %s", len(stale), agent_id)

    def _forget(self, agent_id: str) -> None:
        self._known.pop(agent_id, None)

    def describe(self) -> dict[str, Any]:
        """What this node tells operators (``Placement.beat``'s info): its root, its store, and its
        last snapshot failure (``snapshot_failure``: agent, reason)."""
        info: dict[str, Any] = {"root": str(self.root), "store": self.store.url if self.store else ""}
        if self.last_failure:
            info["snapshot_failure"] = (
                f"{self.last_failure['agent']}: {self.last_failure['reason']} (at {self.last_failure['at']})"
            )
        return info
