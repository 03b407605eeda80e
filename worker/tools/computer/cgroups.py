"""Per-command cgroups, where the host offers a writable cgroup (v1 hierarchies or v2 delegation).

- pids: the whole command tree's processes and threads (``pids.max``), beside
  RLIMIT_NPROC;
- memory (four processes of one command once reached 4.36 GiB while the
  limit was RLIMIT_AS per process): the whole command tree's memory, killed
  as one when it passes the limit (``MemoryCgroup``).

The ``*_root`` functions report ``None`` when the host offers nothing
writable; the caller decides (``launch``: no memory cgroup refuses commands
unless ``AGENT_COMMAND_MEMORY_CGROUP`` is off). Per-command cgroups live in
``agent-sandbox/`` under the worker's own cgroup and are removed after each
command.
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


def _try_parent(directory: Path, probe_file: str) -> Path | None:
    parent = directory / PARENT_NAME
    try:
        parent.mkdir(exist_ok=True)
    except OSError:
        return None
    if not (parent / probe_file).exists():
        if "memory" in probe_file:
            try:  # v2: the controller must be enabled for the children of agent-sandbox too
                (parent / "cgroup.subtree_control").write_text("+memory")
            except OSError:
                pass
        return None
    return parent


def _controller_root(controller: str, probe_file: str) -> Path | None:
    own = _own_cgroup_paths()
    for root, mount, fstype, opts in _mounts():
        if fstype == "cgroup" and controller in opts.split(",") and controller in own:
            rel = os.path.relpath(own[controller], root) if own[controller].startswith(root) else "."
            found = _try_parent(Path(mount) / rel, probe_file)
            if found:
                return found
    for root, mount, fstype, _ in _mounts():
        if fstype != "cgroup2" or "" not in own:
            continue
        rel = os.path.relpath(own[""], root) if own[""].startswith(root) else "."
        directory = Path(mount) / rel
        try:
            if controller not in (directory / "cgroup.controllers").read_text().split():
                continue
            control = directory / "cgroup.subtree_control"
            if controller not in control.read_text().split():
                control.write_text(f"+{controller}")
            parent = directory / PARENT_NAME
            parent.mkdir(exist_ok=True)
            control = parent / "cgroup.subtree_control"
            if controller not in control.read_text().split():
                control.write_text(f"+{controller}")
        except OSError:
            continue
        found = _try_parent(directory, probe_file)
        if found:
            return found
    return None


@functools.lru_cache(maxsize=1)
def pids_cgroup_root() -> Path | None:
    """The directory under which per-command pids cgroups are created, or ``None``.

    v1: the ``pids`` hierarchy at the worker's own cgroup. v2: the worker's
    cgroup when ``pids`` is (or can be) enabled in its ``cgroup.subtree_control``.
    """
    return _controller_root("pids", "pids.max")


@functools.lru_cache(maxsize=1)
def memory_cgroup_root() -> Path | None:
    """The directory under which per-command memory cgroups are created, or ``None`` (as
    ``pids_cgroup_root``: v1 ``memory`` hierarchy, or v2 with the ``memory`` controller)."""
    return _controller_root("memory", "memory.limit_in_bytes") or _controller_root("memory", "memory.max")


def _new_child(parent: Path) -> Path:
    path = parent / f"cmd-{os.getpid()}-{uuid.uuid4().hex[:10]}"
    path.mkdir()
    return path


def _remove(path: Path, wait: float) -> None:
    """Kill what is left in the cgroup ``path`` and remove it (retries while the kernel reaps)."""
    end = time.monotonic() + wait
    procs = path / "cgroup.procs"
    while True:
        try:
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > end:
                log.warning("could not remove cgroup %s: %s", path, exc)
                return
            time.sleep(0.02)


class PidsCgroup:
    """One command's cgroup: ``pids.max`` set at creation; ``procs_file`` is what the
    command's first process writes its pid to; ``remove()`` deletes it once empty."""

    def __init__(self, parent: Path, max_pids: int):
        self.path = _new_child(parent)
        (self.path / "pids.max").write_text(str(max_pids))
        self.procs_file = self.path / "cgroup.procs"

    def remove(self, wait: float = 2.0) -> None:
        """Kill what is left in the cgroup and remove it."""
        _remove(self.path, wait)


class MemoryCgroup:
    """One command's memory cgroup: every process of the command is charged to it (page cache
    and its ``/tmp`` tmpfs included), and the kernel's OOM killer acts when they together pass
    ``limit_bytes``. v1: ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``: no
    swap beyond it); v2: ``memory.max``, ``memory.swap.max`` 0, ``memory.oom.group`` 1 (the
    whole group dies at once; on v1 the caller kills the rest when ``oom_killed``)."""

    def __init__(self, parent: Path, limit_bytes: int):
        self.path = _new_child(parent)
        self.limit_bytes = limit_bytes
        self.v1 = (self.path / "memory.limit_in_bytes").exists()
        try:
            if self.v1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                swap = self.path / "memory.memsw.limit_in_bytes"
                if swap.exists():
                    swap.write_text(str(limit_bytes))
                self._events = self.path / "memory.oom_control"
            else:
                (self.path / "memory.max").write_text(str(limit_bytes))
                for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                    if (self.path / name).exists():
                        (self.path / name).write_text(value)
                self._events = self.path / "memory.events"
        except BaseException:
            _remove(self.path, 0.5)
            raise
        self.procs_file = self.path / "cgroup.procs"

    def oom_killed(self) -> bool:
        """True once the kernel killed a process of the command for passing the limit."""
        try:
            for line in self._events.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill" and int(value or 0) > 0:
                    return True
        except (OSError, ValueError):
            pass
        return False

    def kill(self) -> None:
        """SIGKILL every process still in the cgroup."""
        try:
            for pid in self.procs_file.read_text().split():
                try:
                    os.kill(int(pid), 9)
                except (OSError, ValueError):
                    pass
        except OSError:
            pass

    def remove(self, wait: float = 2.0) -> None:
        """Kill what is left in the cgroup and remove it."""
        _remove(self.path, wait)
