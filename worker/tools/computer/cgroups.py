"""Per-command pids cgroups, where the host offers a writable cgroup (v1 ``pids`` or v2 delegation).

Used when the worker runs as root: the kernel never applies RLIMIT_NPROC to
uid 0, so a fork bomb in a sandbox of a root worker is bounded by the
cgroup's ``pids.max`` instead. Everything here is best effort and reports
``None`` when the host offers nothing writable (the caller says so in a log).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import time
import uuid
from pathlib import Path

log = logging.getLogger(__name__)

PARENT_NAME = "agent-sandbox"


def _own_cgroup_paths() -> dict[str, str]:
    """``{controller or "": path}`` from ``/proc/self/cgroup`` ("" is the v2 unified hierarchy)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for name in parts[1].split(",") if parts[1] else [""]:
            out[name] = parts[2]
    return out


def _mounts() -> list[tuple[str, str, str, str]]:
    """``(root, mount point, fstype, super options)`` of cgroup mounts, from ``/proc/self/mountinfo``."""
    found: list[tuple[str, str, str, str]] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        found.append((fields[3], fields[4], tail[0], tail[2]))
    return found


def _try_parent(directory: Path) -> Path | None:
    parent = directory / PARENT_NAME
    try:
        parent.mkdir(exist_ok=True)
    except OSError:
        return None
    if not (parent / "pids.max").exists():
        return None
    return parent


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> Path | None:
    """The directory under which per-command pids cgroups are created, or ``None``.

    v1: the ``pids`` hierarchy at the worker's own cgroup. v2: the worker's
    cgroup when ``pids`` is (or can be) enabled in its ``cgroup.subtree_control``.
    """
    own = _own_cgroup_paths()
    for root, mount, fstype, opts in _mounts():
        if fstype == "cgroup" and "pids" in opts.split(",") and "pids" in own:
            rel = os.path.relpath(own["pids"], root) if own["pids"].startswith(root) else "."
            found = _try_parent(Path(mount) / rel)
            if found:
                return found
    for root, mount, fstype, _ in _mounts():
        if fstype != "cgroup2" or "" not in own:
            continue
        rel = os.path.relpath(own[""], root) if own[""].startswith(root) else "."
        directory = Path(mount) / rel
        try:
            if "pids" not in (directory / "cgroup.controllers").read_text().split():
                continue
            control = directory / "cgroup.subtree_control"
            if "pids" not in control.read_text().split():
                control.write_text("+pids")
        except OSError:
            continue
        found = _try_parent(directory)
        if found:
            return found
    return None


class PidsCgroup:
    """One command's cgroup: ``pids.max`` set at creation; ``procs_file`` is what the
    command's first process writes its pid to; ``remove()`` deletes it once empty."""

    def __init__(self, parent: Path, max_pids: int):
        self.path = parent / f"cmd-{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.path.mkdir()
        (self.path / "pids.max").write_text(str(max_pids))
        self.procs_file = self.path / "cgroup.procs"

    def remove(self, wait: float = 2.0) -> None:
        """Kill what is left in the cgroup and remove it (retries while the kernel reaps)."""
        end = time.monotonic() + wait
        while True:
            try:
                for pid in self.procs_file.read_text().split():
                    try:
                        os.kill(int(pid), 9)
                    except (OSError, ValueError):
                        pass
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() > end:
                    log.warning("could not remove cgroup %s: %s", self.path, exc)
                    return
                time.sleep(0.02)
