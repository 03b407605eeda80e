"""Podman configured for this machine by project files, and the images of the deployment.

Why a configuration of our own (docs/deployment.md, "Containers without Docker"): on this kind
of machine there is no Docker daemon and no image registry, but rootful podman with runc runs
real containers. crun (podman's default runtime) refuses the host's cgroup layout ("cgroups in
hybrid mode not supported"); podman's default rlimits cannot be set here ("setrlimit
RLIMIT_NPROC: Operation not permitted"); there is no systemd for cgroups or events. So
``write_config`` writes a ``containers.conf`` and a ``storage.conf`` under ``var/podman`` and
``env`` points ``CONTAINERS_CONF`` / ``CONTAINERS_STORAGE_CONF`` at them: every ``podman`` and
``podman-compose`` started with that environment uses runc, cgroupfs, a file event log, the
rlimits that work, and an image store of the project's own (``var/podman/storage``).

The base images: ``FROM debian:trixie-slim`` or ``debian:bookworm-slim`` cannot be pulled
without a registry, so ``ensure_base_image`` builds a Debian root filesystem of a suite with
``debootstrap`` from Debian's packages (cached as ``var/deploy/debian-<suite>-rootfs.tar``: a
rerun takes seconds) and imports it as ``localhost/agent-debian-base:<suite>``. The project's
image is on trixie (``RUNTIME_SUITE``: its Python, 3.13.5, has the tarfile fixes), Redis,
Prometheus and the trace UI on bookworm (``SUITE``; ``IMAGES`` says which). Every Dockerfile of
the project takes its base as the ``BASE_IMAGE`` build argument (compose.yaml gives the project's
``RUNTIME_BASE_IMAGE``, default ``debian:trixie-slim``, the others ``BASE_IMAGE``, default
``debian:bookworm-slim``), so the same files build on a Docker host with a registry.

Python and npm packages inside a build come from the registries, through this machine's CA
bundle given as a build secret (``--secret id=ca_bundle``): mounted for the ``RUN`` that needs
it, never copied into a layer.

``python -m devtools.podman config|env|base|build`` (``make deploy-images``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
PODMAN_DIR = VAR / "podman"
DEPLOY_DIR = VAR / "deploy"
SUITE = "bookworm"
RUNTIME_SUITE = "trixie"


def rootfs_tar(suite: str) -> Path:
    """The cached root filesystem of a Debian ``suite``."""
    return DEPLOY_DIR / f"debian-{suite}-rootfs.tar"


def base_image(suite: str) -> str:
    """The base image of a Debian ``suite`` in the project's image store."""
    return f"localhost/agent-debian-base:{suite}"


BASE_IMAGE = base_image(SUITE)
RUNTIME_BASE_IMAGE = base_image(RUNTIME_SUITE)
# What the base carries besides minbase: Python for the project's images (and their health checks).
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
CA_BUNDLE = Path(os.environ.get("AGENT_BUILD_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt"))
# The images compose.yaml names, each built from its Dockerfile with its suite's base as a build argument.
IMAGES = {
    "localhost/agent-runtime:latest": ("Dockerfile", ".", RUNTIME_SUITE),
    "localhost/agent-redis:latest": ("deploy/images/redis.Dockerfile", "deploy/images", SUITE),
    "localhost/agent-prometheus:latest": ("deploy/images/prometheus.Dockerfile", "deploy/images", SUITE),
    "localhost/agent-phoenix:latest": ("deploy/images/phoenix.Dockerfile", "deploy/images", SUITE),
}


class PodmanError(RuntimeError):
    """A prerequisite is missing or a podman step failed (the message names which)."""


def storage_driver() -> str:
    """``AGENT_PODMAN_STORAGE_DRIVER``: ``overlay`` (default; native overlayfs works as root on
    ext4/xfs) or ``vfs`` (slower, a full copy per layer, works everywhere)."""
    return os.environ.get("AGENT_PODMAN_STORAGE_DRIVER", "overlay")


def config_text() -> dict[str, str]:
    """``{file name: content}`` of the configuration written under ``var/podman``."""
    containers = f"""# Written by devtools/podman.py: podman as it works on this machine (docs/deployment.md).
[containers]
# podman's default rlimits cannot be set here (setrlimit RLIMIT_NPROC: Operation not permitted)
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
# no systemd: podman has no journal to log to
log_driver = "k8s-file"

[engine]
cgroup_manager = "cgroupfs"   # no systemd to delegate cgroups
events_logger = "file"
runtime = "runc"              # crun refuses this host's hybrid cgroup layout

[network]
network_backend = "netavark"
network_config_dir = "{PODMAN_DIR / "networks"}"
"""
    storage = f"""# Written by devtools/podman.py: the project's own image store.
[storage]
driver = "{storage_driver()}"
graphroot = "{PODMAN_DIR / "storage"}"
runroot = "{PODMAN_DIR / "run"}"
"""
    return {"containers.conf": containers, "storage.conf": storage}


def env() -> dict[str, str]:
    """The variables that make ``podman`` and ``podman-compose`` use the project's configuration."""
    return {
        "CONTAINERS_CONF": str(PODMAN_DIR / "containers.conf"),
        "CONTAINERS_STORAGE_CONF": str(PODMAN_DIR / "storage.conf"),
    }


def write_config() -> dict[str, str]:
    """Write the configuration (and ``var/podman/env``, to source in a shell); returns ``env()``."""
    PODMAN_DIR.mkdir(parents=True, exist_ok=True)
    (PODMAN_DIR / "networks").mkdir(exist_ok=True)
    for name, text in config_text().items():
        path = PODMAN_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    lines = [f"export {k}={v}" for k, v in env().items()]
    (PODMAN_DIR / "env").write_text("\n".join(lines) + "\n")
    return env()


def require_tools(*names: str) -> None:
    """Raise ``PodmanError`` naming every missing program and the make target that installs it."""
    missing = [n for n in names if shutil.which(n) is None and not Path(f"/usr/sbin/{n}").exists()]
    if missing:
        raise PodmanError(f"missing {', '.join(missing)}: run `make deploy-install` (Debian's packages, as root)")


def podman(*args: str, check: bool = True, capture: bool = False, **kw: Any) -> "subprocess.CompletedProcess[str]":
    """Run ``podman args`` with the project's configuration."""
    proc = subprocess.run(["podman", *args], env={**os.environ, **env()}, text=True, capture_output=capture, **kw)
    if check and proc.returncode != 0:
        detail = (proc.stderr or "").strip().splitlines()[-1:] if capture else []
        raise PodmanError(f"podman {' '.join(args[:3])} failed ({proc.returncode}) {' '.join(detail)}".strip())
    return proc


def image_exists(name: str) -> bool:
    """True when ``name`` is in the project's image store."""
    return podman("image", "exists", name, check=False).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (``AGENT_DEBIAN_MIRROR`` overrides)."""
    if os.environ.get("AGENT_DEBIAN_MIRROR"):
        return os.environ["AGENT_DEBIAN_MIRROR"]
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for line in path.read_text().splitlines():
            if line.startswith("URIs:") and "security" not in line:
                return line.split()[1]
    return "http://deb.debian.org/debian"


def build_rootfs_tar(suite: str = SUITE) -> Path:
    """debootstrap a minbase Debian ``suite`` with ``BASE_PACKAGES`` and pack it as ``rootfs_tar(suite)``
    (about 2 minutes)."""
    require_tools("debootstrap")
    DEPLOY_DIR.mkdir(parents=True, exist_ok=True)
    work = DEPLOY_DIR / f"rootfs-{suite}.partial"
    if work.exists():
        shutil.rmtree(work)
    mirror = debian_mirror()
    log = DEPLOY_DIR / f"debootstrap-{suite}.log"
    with log.open("w") as out:
        proc = subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", suite, str(work), mirror],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0:
        raise PodmanError(f"debootstrap failed ({proc.returncode}); see {log}")
    # apt inside builds sees updates and security fixes too; no package cache or lists in the image
    security = mirror.rstrip("/").removesuffix("/debian") + "/debian-security"
    (work / "etc/apt/sources.list").write_text(
        f"deb {mirror} {suite} main\ndeb {mirror} {suite}-updates main\ndeb {security} {suite}-security main\n"
    )
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for item in (work / sub).glob("*"):
            if item.is_file():
                item.unlink()
    tar = rootfs_tar(suite)
    partial = tar.with_suffix(".partial")
    subprocess.run(["tar", "--numeric-owner", "-C", str(work), "-cf", str(partial), "."], check=True)
    partial.rename(tar)
    shutil.rmtree(work)
    return tar


def ensure_base_image(suite: str = SUITE) -> str:
    """The base image of ``suite``, imported from its cached root filesystem (built first when absent)."""
    require_tools("podman")
    write_config()
    image = base_image(suite)
    if image_exists(image):
        return image
    if not rootfs_tar(suite).exists():
        build_rootfs_tar(suite)
    podman("import", "--quiet", str(rootfs_tar(suite)), image, capture=True)
    return image


def build_images(names: list[str] | None = None, *, quiet: bool = True) -> dict[str, float]:
    """Build the deployment's images on their bases (layers cached); returns seconds per image."""
    secret = ["--secret", f"id=ca_bundle,src={CA_BUNDLE}"] if CA_BUNDLE.is_file() else []
    took: dict[str, float] = {}
    for name in names or list(IMAGES):
        dockerfile, context, suite = IMAGES[name]
        base = ensure_base_image(suite)
        t0 = time.monotonic()
        # --network host: build steps (the project's own Dockerfiles) reach the registries as the
        # host does; through the NAT'd build network, name resolution failed now and then here.
        logfile = DEPLOY_DIR / f"build-{name.split('/')[-1].split(':')[0]}.log"
        with logfile.open("w") as out:
            proc = subprocess.run(
                [
                    "podman",
                    "build",
                    "--network",
                    "host",
                    "--build-arg",
                    f"BASE_IMAGE={base}",
                    *secret,
                    "-f",
                    dockerfile,
                    "-t",
                    name,
                    context,
                ],
                cwd=ROOT,
                env={**os.environ, **env()},
                stdout=out if quiet else None,
                stderr=subprocess.STDOUT if quiet else None,
            )
        if proc.returncode != 0:
            raise PodmanError(f"building {name} failed; see {logfile}")
        took[name] = time.monotonic() - t0
    return took


def main() -> None:
    """``python -m devtools.podman config|env|base|build [IMAGE...]``."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("what", choices=["config", "env", "base", "build"])
    parser.add_argument("images", nargs="*")
    args = parser.parse_args()
    try:
        if args.what == "config":
            write_config()
            print(f"podman configured for this machine: . {PODMAN_DIR / 'env'}")
        elif args.what == "env":
            write_config()
            print((PODMAN_DIR / "env").read_text(), end="")
        elif args.what == "base":
            for suite in sorted({suite for _, _, suite in IMAGES.values()}):
                print(ensure_base_image(suite))
        else:
            for name, seconds in build_images(args.images or None).items():
                print(f"built {name} in {seconds:.1f} s")
    except PodmanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
