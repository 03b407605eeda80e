"""The compose deployment that ``make deploy-check`` starts (``devtools.deploy_check``): its
credentials (fresh each run, never printed), the two loop-mounted filesystems (Redis's data and
the agents' homes), ``podman-compose up`` and ``down``, health checks run on demand (podman has
no systemd timer for them here), leftovers of a killed run, and the helpers that run ``podman``
and the control-plane CLIs from the host.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from devtools.podman import DEPLOY_DIR, ROOT, PodmanError
from devtools.podman import env as podman_env
from devtools.ports import free_port

PROJECT = "agent-check"
DISKS = DEPLOY_DIR / "disks"
AGENT_UID, REDIS_UID = 10001, 10002  # the users of the images (Dockerfile, deploy/images/redis.Dockerfile)
PUBLISHED = {"flower": 5555, "prometheus": 9090, "phoenix": 6006}
HEALTH_TIMEOUT = 240.0
TURN_TIMEOUT = 120.0


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says what was expected and what was seen."""


@dataclass
class Deployment:
    """What the check started: credentials (never printed), ports, mounts, the compose project."""

    scale: bool
    redis_password: str = field(default_factory=lambda: secrets.token_hex(24))
    control_password: str = field(default_factory=lambda: secrets.token_hex(24))
    flower_auth: str = field(default_factory=lambda: f"ops:{secrets.token_hex(12)}")
    redis_port: int = 0
    mounts: list[Path] = field(default_factory=list)
    up: bool = False

    @property
    def homes(self) -> Path:
        return DISKS / "homes"

    @property
    def redis_data(self) -> Path:
        return DISKS / "redis"

    @property
    def control_url(self) -> str:
        return f"redis://control:{self.control_password}@127.0.0.1:{self.redis_port}/0"

    def secrets(self) -> list[str]:
        return [self.redis_password, self.control_password, self.flower_auth.split(":", 1)[1]]

    def compose_env(self) -> dict[str, str]:
        from devtools.podman import BASE_IMAGE

        return {
            **os.environ,
            **podman_env(),
            "REDIS_PASSWORD": self.redis_password,
            "REDIS_CONTROL_PASSWORD": self.control_password,
            "FLOWER_BASIC_AUTH": self.flower_auth,
            "REDIS_HOST_PORT": str(self.redis_port),
            "REDIS_DATA_DIR": str(self.redis_data),
            "AGENT_HOMES_DIR": str(self.homes),
            "BASE_IMAGE": BASE_IMAGE,
            # podman lifts the masks under /proc alone (docs/deployment.md, "The tools worker's grants")
            "AGENT_TOOLS_PROC_OPT": "unmask=/proc/*",
            # --scale: two nodes of each (compose.yaml's `scale:`; podman-compose takes one --scale only)
            "AGENT_TURNS_NODES": "2" if self.scale else "1",
            "AGENT_TOOLS_NODES": "2" if self.scale else "1",
        }

    def cli_env(self) -> dict[str, str]:
        """The control plane's environment on the host: only the control user's URL."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "CONTROL_REDIS", "OPENAI"))}
        return {**keep, "CONTROL_REDIS_URL": self.control_url, "REDIS_URL": self.control_url}


# -- output ------------------------------------------------------------------------------------


class Steps:
    """Runs named steps, printing each with the seconds it took; the first failure stops the run."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.results: list[tuple[str, float, bool]] = []

    def run(self, name: str, fn: Callable[[], str | None]) -> None:
        t = time.monotonic()
        try:
            detail = fn()
        except Exception as exc:
            took = time.monotonic() - t
            self.results.append((name, took, False))
            print(f"[{took:6.1f} s] FAIL {name}: {redact(str(exc))}", flush=True)
            raise
        took = time.monotonic() - t
        self.results.append((name, took, True))
        print(f"[{took:6.1f} s] ok   {name}" + (f": {detail}" if detail else ""), flush=True)

    def note(self, text: str) -> None:
        print(f"           {text}", flush=True)


_SECRETS: list[str] = []


def set_secrets(values: list[str]) -> None:
    """The passwords ``redact`` hides from every line the check prints."""
    _SECRETS[:] = values


def redact(text: str) -> str:
    """``text`` without any of the check's passwords."""
    for s in _SECRETS:
        text = text.replace(s, "***")
    return text


# -- processes ---------------------------------------------------------------------------------


def sh(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 600, check: bool = True, **kw: Any
) -> "subprocess.CompletedProcess[str]":
    """Run ``cmd`` (captured); raise ``CheckFailed`` naming it and the end of its output when it fails."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT, **kw)
    if check and proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise CheckFailed(f"`{' '.join(cmd[:4])} ...` exited {proc.returncode}: {tail[:400]}")
    return proc


def compose_cmd() -> list[str]:
    exe = shutil.which("podman-compose") or str(Path(sys.executable).parent / "podman-compose")
    if not Path(exe).exists():
        raise PodmanError("podman-compose is missing: run `make deploy-install`")
    return [exe, "-p", PROJECT, "-f", str(ROOT / "compose.yaml")]


def podman(*args: str, check: bool = True, timeout: float = 120) -> "subprocess.CompletedProcess[str]":
    return sh(["podman", *args], env={**os.environ, **podman_env()}, check=check, timeout=timeout)


def cli(dep: Deployment, *args: str, timeout: float = 180, check: bool = True) -> "subprocess.CompletedProcess[str]":
    """``agent-runtime args`` from the host, as the control plane."""
    return sh([sys.executable, "-m", "control.cli", *args], env=dep.cli_env(), timeout=timeout, check=check)


def workflow_cli(dep: Deployment, *args: str, timeout: float = 180) -> "subprocess.CompletedProcess[str]":
    return sh([sys.executable, "-m", "control.workflow_cli", *args], env=dep.cli_env(), timeout=timeout)


def containers() -> dict[str, dict[str, str]]:
    """``{container name: {"service", "hostname", "health"}}`` of the project."""
    out = podman("ps", "-a", "--filter", f"label=io.podman.compose.project={PROJECT}", "--format", "json").stdout
    found: dict[str, dict[str, str]] = {}
    for c in json.loads(out or "[]"):
        name = c["Names"][0]
        info = json.loads(podman("inspect", name).stdout)[0]
        found[name] = {
            "service": c.get("Labels", {}).get("com.docker.compose.service", ""),
            "hostname": info["Config"].get("Hostname", ""),
            "state": info["State"]["Status"],
            "health": (info["State"].get("Health") or info["State"].get("Healthcheck") or {}).get("Status", ""),
        }
    return found


# -- set-up and tear-down ----------------------------------------------------------------------


def free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def make_disk(name: str, size_mb: int, owner: int) -> Path:
    """A loop-mounted ext4 filesystem of ``size_mb`` at ``DISKS/name``, its root owned by ``owner``."""
    DISKS.mkdir(parents=True, exist_ok=True)
    image, mnt = DISKS / f"{name}.img", DISKS / name
    if mnt.is_mount():
        sh(["umount", str(mnt)])
    image.unlink(missing_ok=True)
    with image.open("wb") as f:
        f.truncate(size_mb * 1024 * 1024)
    sh(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)])
    mnt.mkdir(exist_ok=True)
    sh(["mount", "-o", "loop,nosuid,nodev", str(image), str(mnt)])
    os.chown(mnt, owner, owner)
    os.chmod(mnt, 0o750)
    (mnt / "lost+found").rmdir()
    return mnt


def teardown(dep: Deployment) -> str:
    """Stop and remove everything the check started; returns what was removed."""
    done = []
    if dep.up:
        sh([*compose_cmd(), "down", "-v", "-t", "10"], env=dep.compose_env(), check=False, timeout=300)
        done.append("containers, networks and volumes")
        dep.up = False
        if remove_leftovers() != "none":  # whatever `down` missed
            done.append("leftovers")
    for mnt in dep.mounts:
        if mnt.is_mount():
            sh(["umount", str(mnt)], check=False)
        (mnt.parent / f"{mnt.name}.img").unlink(missing_ok=True)
        done.append(f"{mnt.name} disk")
    dep.mounts.clear()
    return ", ".join(done) or "nothing to remove"


def remove_leftovers() -> str:
    """Remove what an earlier run left (killed before its teardown): the project's containers,
    networks and volumes, and the check's mounted disks."""
    label = f"label=io.podman.compose.project={PROJECT}"
    gone = []
    for kind, listing in (("container", ["ps", "-a"]), ("network", ["network", "ls"]), ("volume", ["volume", "ls"])):
        ids = podman(*listing, "--filter", label, "--quiet", check=False).stdout.split()
        if ids:
            podman(kind, "rm", "-f", *(["-t", "2"] if kind == "container" else []), *ids, check=False, timeout=300)
            gone.append(f"{len(ids)} {kind}s")
    for name in ("redis", "homes"):
        mnt = DISKS / name
        if mnt.is_mount():
            sh(["umount", str(mnt)], check=False)
            gone.append(f"{name} disk")
        (DISKS / f"{name}.img").unlink(missing_ok=True)
    return "removed " + ", ".join(gone) if gone else "none"


def bring_up(dep: Deployment) -> str:
    busy = [f"{svc} ({port})" for svc, port in PUBLISHED.items() if not free(port)]
    if busy:
        raise CheckFailed(f"ports compose publishes are taken on 127.0.0.1: {', '.join(busy)}")
    dep.redis_port = free_port()
    dep.mounts.append(make_disk("redis", 256, REDIS_UID))
    dep.mounts.append(make_disk("homes", 192, AGENT_UID))
    cmd = [*compose_cmd(), "up", "-d", "--no-build"]
    dep.up = True
    sh(cmd, env=dep.compose_env(), timeout=600)
    running = containers()
    return f"{len(running)} containers; Redis for the control plane on 127.0.0.1:{dep.redis_port}"


def wait_healthy() -> str:
    """Run every container's health check until all pass (podman has no systemd timer here to run them)."""
    deadline = time.monotonic() + HEALTH_TIMEOUT
    healthy: dict[str, float] = {}
    t0 = time.monotonic()
    while True:
        found = containers()
        for name, c in found.items():
            if name in healthy:
                continue
            if c["state"] != "running":
                continue
            if podman("healthcheck", "run", name, check=False, timeout=60).returncode == 0:
                healthy[name] = time.monotonic() - t0
        if found and len(healthy) == len(found):
            slowest = max(healthy, key=lambda n: healthy[n])
            return f"{len(healthy)} healthy (last: {slowest} after {healthy[slowest]:.0f} s)"
        if time.monotonic() > deadline:
            sick = sorted(set(found) - set(healthy))
            states = ", ".join(f"{n} ({found[n]['state']})" for n in sick)
            raise CheckFailed(f"not healthy after {HEALTH_TIMEOUT:.0f} s: {states}; see `podman logs <name>`")
        time.sleep(3)
