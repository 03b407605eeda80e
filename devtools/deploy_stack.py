"""The compose deployment that ``make deploy-check`` starts (``devtools.deploy_check``): its
credentials (fresh each run, never printed), the two loop-mounted filesystems (Redis's data and
the agents' homes), ``podman-compose up``, health checks run on demand (podman has no systemd
timer for them here), leftovers of a killed run, the helpers that run ``podman`` and the
control-plane CLIs (inside the ``api`` container: the control plane runs in compose, where it
follows a Redis failover through the Sentinels), and ``down``.

``down`` is ours, not podman-compose's: podman-compose stops only the replicas that the current
``AGENT_*_NODES`` names (a deployment scaled up and brought down without the same variables kept
its extra replicas and networks, and exited 0) and stops every service at once (workers lost
Redis in the middle of their warm shutdown). ``down`` finds every container, network and volume
by the compose project's label, stops them in order (the project's services, then the object
store, the Sentinels and the UIs, then the Redis servers), each with its service's
``stop_grace_period`` from compose.yaml, and reports how each ended (an exit code of 137 is a
SIGKILL: the grace was too short), removes them unforced (``remove_command``) and exits 1 naming
whatever it did not stop or remove. ``python -m devtools.deploy_stack down [-p PROJECT] [-v]``
(``make deploy-down``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from devtools.podman import DEPLOY_DIR, ROOT, PodmanError
from devtools.podman import env as podman_env

PROJECT = "agent-check"
DISKS = DEPLOY_DIR / "disks"
REDIS_UID = 10002  # the image's redis user (deploy/images/redis.Dockerfile)
REDIS_SERVERS = ("redis-1", "redis-2")
SENTINELS = ("sentinel-1", "sentinel-2", "sentinel-3")
PUBLISHED = {"flower": 5555, "prometheus": 9090, "phoenix": 6006, "api": 8700}
HEALTH_TIMEOUT = 300.0
TURN_TIMEOUT = 180.0
# The check's per-agent limits: small homes (16 MB images, allocated whole) on a 1.5 GB homes disk,
# and a command memory limit that four small processes pass together.
HOME_QUOTA_MB = 16
COMMAND_MEMORY_BYTES = 512 * 1024**2


class CheckFailed(RuntimeError):
    """A step of the check failed; the message says what was expected and what was seen."""


@dataclass
class Deployment:
    """What the check started: credentials (never printed), mounts, the compose project."""

    scale: bool
    redis_password: str = field(default_factory=lambda: secrets.token_hex(24))
    control_password: str = field(default_factory=lambda: secrets.token_hex(24))
    replica_password: str = field(default_factory=lambda: secrets.token_hex(24))
    sentinel_user_password: str = field(default_factory=lambda: secrets.token_hex(24))
    sentinel_password: str = field(default_factory=lambda: secrets.token_hex(24))
    flower_auth: str = field(default_factory=lambda: f"ops:{secrets.token_hex(12)}")
    aws_access_key: str = field(default_factory=lambda: f"AK{secrets.token_hex(8).upper()}")
    aws_secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(30))
    snapshot_key: str = field(default_factory=lambda: secrets.token_hex(32))
    mounts: list[Path] = field(default_factory=list)
    up: bool = False

    @property
    def homes(self) -> Path:
        return DISKS / "homes"

    @property
    def redis_data(self) -> Path:
        return DISKS / "redis"

    def secrets(self) -> list[str]:
        return [
            self.redis_password,
            self.control_password,
            self.replica_password,
            self.sentinel_user_password,
            self.sentinel_password,
            self.flower_auth.split(":", 1)[1],
            self.aws_secret_key,
            self.snapshot_key,
        ]

    def compose_env(self) -> dict[str, str]:
        from devtools.podman import BASE_IMAGE, RUNTIME_BASE_IMAGE

        return {
            **os.environ,
            **podman_env(),
            "REDIS_PASSWORD": self.redis_password,
            "REDIS_CONTROL_PASSWORD": self.control_password,
            "REDIS_REPLICA_PASSWORD": self.replica_password,
            "REDIS_SENTINEL_PASSWORD": self.sentinel_user_password,
            "SENTINEL_PASSWORD": self.sentinel_password,
            "FLOWER_BASIC_AUTH": self.flower_auth,
            "AWS_ACCESS_KEY_ID": self.aws_access_key,
            "AWS_SECRET_ACCESS_KEY": self.aws_secret_key,
            "AGENT_SNAPSHOT_KEY": self.snapshot_key,
            "REDIS_DATA_DIR": str(self.redis_data),
            "AGENT_HOMES_DIR": str(self.homes),
            "AGENT_HOME_QUOTA_MB": str(HOME_QUOTA_MB),
            "AGENT_COMMAND_MAX_MEMORY_BYTES": str(COMMAND_MEMORY_BYTES),
            "BASE_IMAGE": BASE_IMAGE,
            "RUNTIME_BASE_IMAGE": RUNTIME_BASE_IMAGE,
            # --scale: two nodes of each (compose.yaml's `scale:`; podman-compose takes one --scale only)
            "AGENT_TURNS_NODES": "2" if self.scale else "1",
            "AGENT_TOOLS_NODES": "2" if self.scale else "1",
        }


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


def container(service: str, index: int = 1) -> str:
    """The name podman-compose gives replica ``index`` of ``service``."""
    return f"{PROJECT}_{service}_{index}"


def in_container(
    service: str, *args: str, timeout: float = 180, check: bool = True, stdin: str | None = None
) -> "subprocess.CompletedProcess[str]":
    """``args`` run inside ``service``'s first container (its environment: the passwords it already
    has reach the command without passing through this process's or podman's argv)."""
    return sh(
        ["podman", "exec", *(["-i"] if stdin is not None else []), container(service), *args],
        env={**os.environ, **podman_env()},
        timeout=timeout,
        check=check,
        input=stdin,
    )


def cli(dep: Deployment, *args: str, timeout: float = 180, check: bool = True) -> "subprocess.CompletedProcess[str]":
    """``agent-runtime args`` as the control plane: inside the ``api`` container, which reaches
    Redis through the Sentinels as the ``control`` user (docs/deployment.md)."""
    return in_container("api", "agent-runtime", *args, timeout=timeout, check=check)


def workflow_cli(dep: Deployment, *args: str, timeout: float = 180) -> "subprocess.CompletedProcess[str]":
    return in_container("api", "python", "-m", "control.workflow_cli", *args, timeout=timeout)


def control_python(code: str, *args: str, timeout: float = 180) -> "subprocess.CompletedProcess[str]":
    """Python ``code`` (given on stdin, with ``args`` as ``sys.argv[1:]``) run in the ``api``
    container: the control plane's Redis clients, through the Sentinels."""
    return in_container("api", "python", "-", *args, timeout=timeout, stdin=code)


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


def stop_phase(service: str) -> int:
    """The order of a planned stop: the project's services first (0: a stopping tools node still
    writes its last snapshots and records), then what they used (1: the object store, the Sentinels,
    the UIs), then the Redis servers (2: after the Sentinels, so that stopping the primary starts
    no failover)."""
    if service in REDIS_SERVERS:
        return 2
    return 1 if service in {"objectstore", "prometheus", "phoenix", *SENTINELS} else 0


def stop_graces(compose_file: Path = ROOT / "compose.yaml") -> dict[str, float]:
    """``{service: seconds}``: each service's ``stop_grace_period`` in compose.yaml (default 10 s)."""
    services = yaml.safe_load(compose_file.read_text())["services"]
    return {name: _seconds(str(svc.get("stop_grace_period", "10s"))) for name, svc in services.items()}


def _seconds(text: str) -> float:
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", text)
    if not parts:
        return float(text)
    scale = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


@dataclass
class Stopped:
    """How one container ended in ``down``: its exit code (137: SIGKILLed), the seconds its stop took,
    the last lines of its log and its state after it (``exited`` unless the stop failed)."""

    name: str
    service: str
    exit_code: int
    seconds: float
    log_tail: str = ""
    state: str = "exited"


@dataclass
class Down:
    """What ``down`` stopped, and what it could not remove (``{name: podman's error}``)."""

    stopped: list[Stopped]
    not_removed: dict[str, str] = field(default_factory=dict)


def remove_command(kind: str, *names: str) -> list[str]:
    """``podman`` arguments removing ``names`` (``kind``: container, network, volume), never ``-f``:
    podman 4's forced removal SIGTERMs the host PID it recorded for each exec session it thinks is
    running, stale once the container stopped (a ``podman exec`` killed by a timeout leaves one)
    and, PIDs wrapping at 32768 here, maybe any process's, this one's included: the likely cause of
    the 143 ``make deploy-down`` was seen to exit with. A plain ``rm`` drops records whose PID is
    gone and refuses when one is alive; ``network``/``volume rm -f`` would force containers out."""
    return [*(["rm", "--depend"] if kind == "container" else [kind, "rm"]), *names]


def down_problems(result: Down) -> list[str]:
    """Why ``down`` did not stop and remove everything, one line each; ``[]`` when it did."""
    stopped = result.stopped
    problems = [f"{s.name}: SIGKILLed (exit 137): stop_grace_period too short" for s in stopped if s.exit_code == 137]
    problems += [f"{s.name}: still {s.state} after its stop" for s in stopped if s.state not in ("exited", "stopped")]
    return problems + [f"{name}: not removed: {error}" for name, error in result.not_removed.items()]


def down(project: str = PROJECT, *, volumes: bool = True) -> Down:
    """Stop and remove every container of ``project`` (found by label, whatever the scale), in
    ``stop_phase`` order, each with its service's grace; then its networks and (``volumes``) volumes.
    Removal is never forced (``remove_command``); what is left is in ``Down.not_removed``."""
    label = f"label=io.podman.compose.project={project}"
    graces = stop_graces()
    listed = json.loads(podman("ps", "-a", "--filter", label, "--format", "json").stdout or "[]")
    byname = {c["Names"][0]: c.get("Labels", {}).get("com.docker.compose.service", "") for c in listed}
    running = {c["Names"][0] for c in listed if c.get("State") == "running"}
    done: list[Stopped] = []
    left = dict(byname)
    for phase in (0, 1, 2):
        batch = {n: svc for n, svc in left.items() if stop_phase(svc) <= phase}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        t0 = time.monotonic()
        for name, svc in batch.items():
            if name in running:
                grace = int(graces.get(svc, 10))
                procs[name] = subprocess.Popen(
                    ["podman", "stop", "-t", str(grace), name],
                    env={**os.environ, **podman_env()},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
        took: dict[str, float] = {}
        deadline = t0 + max(graces.values()) + 60
        while len(took) < len(procs) and time.monotonic() < deadline:  # each stop's own duration
            for name, proc in procs.items():
                if name not in took and proc.poll() is not None:
                    took[name] = time.monotonic() - t0
            time.sleep(0.1)
        for name, svc in batch.items():
            state = json.loads(podman("inspect", name, check=False).stdout or "[{}]")[0].get("State", {})
            if name in running:
                tail = podman("logs", "--tail", "5", name, check=False).stdout
                code, status = int(state.get("ExitCode", -1)), str(state.get("Status", "unknown"))
                done.append(Stopped(name, svc, code, took.get(name, 0.0), tail, status))
            left.pop(name)
    failed: dict[str, str] = {}
    for name in byname:  # one at a time: `rm --depend a b` stops at b when removing a took b too
        rm = podman(*remove_command("container", name), check=False, timeout=120)
        if rm.returncode != 0 and podman("container", "exists", name, check=False).returncode == 0:
            failed[name] = (rm.stderr.strip().splitlines() or [f"exit {rm.returncode}"])[-1]
    for kind in ("network", "volume") if volumes else ("network",):
        ids = podman(kind, "ls", "--filter", label, "--quiet", check=False).stdout.split()
        if ids and (rm := podman(*remove_command(kind, *ids), check=False)).returncode != 0:
            failed[f"{kind} {' '.join(ids)}"] = (rm.stderr.strip().splitlines() or [f"exit {rm.returncode}"])[-1]
    return Down(done, failed)


def teardown(dep: Deployment) -> str:
    """Stop and remove everything the check started (``down``); returns what was removed."""
    done = []
    if dep.up:
        stopped = down().stopped
        dep.up = False
        done.append(f"{len(stopped)} containers, networks and volumes")
        if remove_leftovers() != "none":  # whatever `down` missed
            done.append("leftovers")
    for mnt in dep.mounts:
        if mnt.is_mount():
            sh(["umount", str(mnt)], check=False)
        (mnt.parent / f"{mnt.name}.img").unlink(missing_ok=True)
        done.append(f"{mnt.name} disk")
    dep.mounts.clear()
    return ", ".join(done) or "nothing to remove"


def save_logs() -> str:
    """Every container's log (redacted) to ``var/deploy/logs/<container>.log`` before a teardown
    removes them; prints the last lines of each container that is not running, with its exit code."""
    logs = DEPLOY_DIR / "logs"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    for name, c in containers().items():
        run = podman("logs", "--timestamps", name, check=False, timeout=60)
        (logs / f"{name}.log").write_text(redact(run.stdout + run.stderr))
        if c["state"] != "running":
            code = json.loads(podman("inspect", name).stdout)[0]["State"].get("ExitCode")
            tail = redact(run.stdout + run.stderr).strip().splitlines()[-15:]
            print(f"           {name} is {c['state']} (exit {code}); the end of its log:", flush=True)
            for line in tail:
                print(f"             {line[:300]}", flush=True)
    return f"logs of every container in {logs}"


def remove_leftovers() -> str:
    """Remove what an earlier run left (killed before its teardown): the project's containers,
    networks and volumes, and the check's mounted disks."""
    label = f"label=io.podman.compose.project={PROJECT}"
    gone = []
    for kind, listing in (("container", ["ps", "-a"]), ("network", ["network", "ls"]), ("volume", ["volume", "ls"])):
        ids = podman(*listing, "--filter", label, "--quiet", check=False).stdout.split()
        if ids:
            if kind == "container":  # stopped first: removal is never forced (remove_command)
                podman("stop", "-t", "2", *ids, check=False, timeout=300)
            podman(*remove_command(kind, *ids), check=False, timeout=300)
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
    redis = make_disk("redis", 256, REDIS_UID)
    dep.mounts.append(redis)
    for server in REDIS_SERVERS:  # one data directory per server, as compose.yaml mounts them
        (redis / server).mkdir()
        os.chown(redis / server, REDIS_UID, REDIS_UID)
    dep.mounts.append(make_disk("homes", 1536, 0))
    cmd = [*compose_cmd(), "up", "-d", "--no-build"]
    dep.up = True
    sh(cmd, env=dep.compose_env(), timeout=600)
    running = containers()
    return f"{len(running)} containers"


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


def main() -> None:
    """``python -m devtools.deploy_stack down [-p PROJECT] [-v]``: stop and remove every container,
    network (and with ``-v`` volume) of a compose project, whatever its scale (see the module
    docstring); prints how each container ended. Exits 0 when every container stopped within its
    grace and everything was removed, else 1 with one ``error:`` line per problem on stderr."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("what", choices=["down"])
    parser.add_argument("-p", "--project", default=ROOT.name, help="the compose project (default: the folder's name)")
    parser.add_argument("-v", "--volumes", action="store_true", help="also remove the project's named volumes")
    args = parser.parse_args()
    result = down(args.project, volumes=args.volumes)
    for s in result.stopped:
        print(f"{s.name}: exit {s.exit_code} after {s.seconds:.1f} s{' (SIGKILLed)' if s.exit_code == 137 else ''}")
    if problems := down_problems(result):
        print("".join(f"error: {line}\n" for line in problems), end="", file=sys.stderr)
        raise SystemExit(f"{args.project}: down incomplete, {len(problems)} error(s) above")
    print(f"{args.project}: {len(result.stopped)} containers stopped and removed")


if __name__ == "__main__":
    main()
