"""Machines made of Linux namespaces, for a check that needs several hosts on one computer.

A ``Machine`` has what makes hosts separate where the runtime can tell:

- its own network namespace (``ip netns``): one interface on a bridge with one address, and a
  loopback of its own, so that processes on two machines reach each other only through their
  addresses on the bridge, never over loopback; no route anywhere else;
- its own PID namespace, whose first process (``init``: mounts, then reaps) is the machine:
  SIGKILL to it ends every process of the machine at once, as a power cut would;
- its own mount namespace: a private ``/srv`` and ``/tmp`` (tmpfs) and its own disk, an ext4
  image loop-mounted at ``disk_mount``; when the machine dies the mounts go with it and the loop
  device is released (autoclear), and ``kill`` then deletes the image: the disk is gone;
- its own UTS namespace: its hostname is its name (Celery's ``%h``, the placement node's name).

``/sys`` stays the host's (so does ``/sys/fs/cgroup``: a root tools node makes a memory cgroup per
command there, as on a machine of its own); only the network is seen through the bridge.

``Network`` is the bridge (its first address is the host's own: the operator's machine).
Everything is named with a prefix, so ``Network.remove_leftovers`` finds what a killed run left.
Needs root, ``ip`` (iproute2), ``unshare``/``nsenter`` (util-linux) and ``mkfs.ext4``.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

# The init of a machine: mounts its private filesystems, says "ready", then reaps every process
# left to it until it is killed. argv: hostname, disk image, disk mount point.
_INIT = r"""
import os, subprocess, sys, time
name, image, mount = sys.argv[1:4]
def sh(*a):
    subprocess.run(a, check=True)
sh("hostname", name)
sh("mount", "-t", "tmpfs", "-o", "mode=0755,size=1g", "tmpfs", "/srv")
os.makedirs(mount, exist_ok=True)
sh("mount", "-o", "loop", image, mount)
sh("mount", "-t", "tmpfs", "-o", "mode=1777,size=1g", "tmpfs", "/tmp")  # last: the image may be under /tmp
print("ready", flush=True)
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 1)
os.dup2(devnull, 2)
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(1)
"""


class MachineError(RuntimeError):
    """A namespace, interface or disk could not be made (the message holds the command's error)."""


def sh(*argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise ``MachineError`` with its output."""
    run = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if check and run.returncode != 0:
        raise MachineError(f"{' '.join(argv)}: {(run.stderr or run.stdout).strip()}")
    return run


def require_tools() -> None:
    """Raise ``MachineError`` unless this runs as root with ip, unshare, nsenter, losetup and mkfs.ext4."""
    if os.geteuid() != 0:
        raise MachineError("machines of namespaces need root")
    missing = [t for t in ("ip", "unshare", "nsenter", "losetup", "mkfs.ext4") if not shutil.which(t)]
    if missing:
        raise MachineError(f"missing: {', '.join(missing)} (Debian: iproute2, util-linux, mount, e2fsprogs)")


@dataclass
class Network:
    """A bridge ``<prefix>-br`` with the first address of ``subnet`` (the operator's side)."""

    prefix: str
    subnet: str = "198.18.0.0/24"  # RFC 2544's range for testing networks: nothing routes there

    @property
    def bridge(self) -> str:
        return f"{self.prefix}-br"

    @property
    def net(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(self.subnet)

    @property
    def gateway(self) -> str:
        return str(self.net.network_address + 1)

    def address(self, n: int) -> str:
        """The ``n``-th address of the subnet."""
        return str(self.net.network_address + n)

    def create(self) -> None:
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.gateway}/{self.net.prefixlen}", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def remove_leftovers(self, disks: Path) -> list[str]:
        """Kill and remove every namespace, interface and disk image a run with this prefix left."""
        removed = []
        for line in sh("ip", "netns", "list", check=False).stdout.splitlines():
            name = line.split()[0] if line.strip() else ""
            if name.startswith(f"{self.prefix}-"):
                for pid in sh("ip", "netns", "pids", name, check=False).stdout.split():
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                sh("ip", "netns", "del", name, check=False)
                removed.append(name)
        # A machine's host-side veth outlives its namespace until the kernel tears the namespace
        # down (after its last process died): a run started right after the last one found it.
        for line in sh("ip", "-o", "link", "show", check=False).stdout.splitlines():
            name = line.split(":", 2)[1].strip().split("@")[0] if line.count(":") >= 2 else ""
            if name.startswith(f"{self.prefix}-") and name != self.bridge:
                sh("ip", "link", "del", name, check=False)
                removed.append(name)
        if sh("ip", "link", "show", self.bridge, check=False).returncode == 0:
            sh("ip", "link", "del", self.bridge, check=False)
            removed.append(self.bridge)
        for image in sorted(disks.glob("*.img")) if disks.is_dir() else []:
            _wait_released(image, 10)
            image.unlink(missing_ok=True)
            removed.append(str(image))
        return removed

    def remove(self) -> None:
        sh("ip", "link", "del", self.bridge, check=False)


def _loop_devices(image: Path) -> list[str]:
    out = sh("losetup", "-j", str(image), check=False).stdout
    return [line.split(":")[0] for line in out.splitlines() if line.strip()]


def _wait_released(image: Path, timeout: float) -> bool:
    """Wait until no loop device holds ``image`` (its mount gone with its namespace)."""
    deadline = time.monotonic() + timeout
    while _loop_devices(image):
        if time.monotonic() > deadline:
            for dev in _loop_devices(image):
                sh("losetup", "-d", dev, check=False)
            return False
        time.sleep(0.1)
    return True


@dataclass
class Machine:
    """One machine (module docstring) named ``name`` at ``address`` on ``network``."""

    name: str
    address: str
    network: Network
    disk_image: Path
    disk_mount: str
    disk_mb: int = 256
    init: subprocess.Popen[str] | None = None
    init_pid: int = 0
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def netns(self) -> str:
        return f"{self.network.prefix}-{self.name}"

    @property
    def alive(self) -> bool:
        return self.init is not None and self.init.poll() is None

    def create(self) -> None:
        """Make the network namespace, its interface on the bridge, the disk and the init."""
        ns, veth = self.netns, f"{self.network.prefix}-{self.name}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", self.network.bridge, "up")
        sh("ip", "-n", ns, "addr", "add", f"{self.address}/{self.network.net.prefixlen}", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        self.disk_image.parent.mkdir(parents=True, exist_ok=True)
        with open(self.disk_image, "wb") as f:
            f.truncate(self.disk_mb * 2**20)
        sh("mkfs.ext4", "-q", "-F", "-m", "0", str(self.disk_image))
        self.init = subprocess.Popen(
            [
                *("unshare", "--pid", "--fork", "--mount", "--uts", "--propagation", "private", "--mount-proc"),
                *("nsenter", f"--net=/run/netns/{ns}", "--"),
                *(sys.executable, "-c", _INIT, self.name, str(self.disk_image), self.disk_mount),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.init.stdout is not None
        line = self.init.stdout.readline().strip()
        if line != "ready":
            err = self.init.stderr.read() if self.init.stderr else ""
            raise MachineError(f"machine {self.name} did not start: {line} {err.strip()[-400:]}")
        self.init_pid = self._child_of(self.init.pid)

    @staticmethod
    def _child_of(pid: int) -> int:
        """The one child of ``pid`` (unshare's: the machine's init, PID 1 inside)."""
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if len(children) != 1:
            raise MachineError(f"unshare {pid} has children {children}, expected the init alone")
        return int(children[0])

    def enter(self, argv: list[str], cwd: str | None = None) -> list[str]:
        """argv that runs ``argv`` inside the machine (every namespace of its init), in ``cwd``."""
        if not self.alive:
            raise MachineError(f"machine {self.name} is not running")
        wd = [f"--wd={cwd}"] if cwd else []
        return ["nsenter", "-t", str(self.init_pid), "-m", "-u", "-n", "-p", *wd, "--", *argv]

    def run(
        self, argv: list[str], cwd: str | None = None, timeout: float = 120, **kw: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in the machine and wait (output captured, as text, unless ``kw`` says otherwise)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.enter(argv, cwd), timeout=timeout, **kw)

    def start(
        self, argv: list[str], log: IO[bytes], cwd: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` in the machine in the background, its output to ``log``."""
        proc = subprocess.Popen(
            self.enter(argv, cwd), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        self.started.append(proc)
        return proc

    def kill(self) -> float:
        """Kill the machine whole: SIGKILL to its init ends every process in it; its mounts go with
        its mount namespace; its disk image is released and deleted; its interface removed.
        Returns the seconds until the disk was released."""
        t = time.monotonic()
        if self.init_pid:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.init is not None:
            try:
                self.init.wait(10)
            except subprocess.TimeoutExpired:
                self.init.kill()
        for proc in self.started:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        released = _wait_released(self.disk_image, 10)
        took = time.monotonic() - t
        self.disk_image.unlink(missing_ok=True)
        for pid in sh("ip", "netns", "pids", self.netns, check=False).stdout.split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        sh("ip", "netns", "del", self.netns, check=False)
        if not released:
            raise MachineError(f"the disk of {self.name} was still held 10 s after its processes died")
        return took
