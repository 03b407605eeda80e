"""The operator's side of ``make deploy-check-hosts`` (``devtools.hosts_check``): what the check
started and learned (``Run``), its polling, and its own view of the deployment's Redis and Sentinels
from the operator's machine: through the Sentinels, over TLS, as the ``control`` user, as a client
following only ``operator.env`` would. The product's clients are the workers' and the CLI's.
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar
from urllib.parse import quote

from devtools.deploy_stack import CheckFailed, redact
from devtools.machines import Machine, Network
from devtools.redis_configs import REDIS_PORT, SENTINEL_PORT
from worker.redis_connection import RedisEndpoint, Sentinels, TLSFiles
from worker.settings import parse_host_ports

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "hosts-check"
DISKS = WORK / "disks"
LOGS = WORK / "logs"
DEPLOYMENT = WORK / "deployment"
PREFIX = "agh"
BASE = "/srv/agent"
MACHINES = ("m1", "m2", "m3")
VICTIM = "m3"  # holds a Redis replica and a Sentinel: the primary (m1) stays
GATEWAY_PORT = 8089
TURN_TIMEOUT = 120.0
# Each agent's home is an image of this size on its machine's disk (root workers: per-agent quotas on);
# a machine holds its two agents and, after the kill, up to two of m3's.
HOME_QUOTA_MB = 64
DISK_MB = 512
T = TypeVar("T")


@dataclass
class Run:
    """What the check started and learned (secrets stay in the env files, never printed)."""

    network: Network = field(default_factory=lambda: Network(PREFIX))
    machines: dict[str, Machine] = field(default_factory=dict)
    operator: dict[str, str] = field(default_factory=dict)
    agents: dict[str, str] = field(default_factory=dict)  # agent -> node name it was placed on
    written: dict[str, tuple[str, str]] = field(default_factory=dict)  # agent -> (note, sha256)
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> machine

    def address(self, name: str) -> str:
        return self.machines[name].address

    def cli_env(self) -> dict[str, str]:
        """The operator's environment for the control plane: operator.env and nothing else of ours."""
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("REDIS", "CONTROL_REDIS", "AGENT_", "OPENAI"))}
        return {**keep, **self.operator}


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = 60.0, every: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy; ``CheckFailed`` naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as exc:  # a probe of a service still starting: try again
            last = exc
        time.sleep(every)
    raise CheckFailed(f"{what}: not within {timeout:.0f} s" + (f" ({redact(str(last))[:300]})" if last else ""))


def sh(
    argv: list[str], env: dict[str, str] | None = None, timeout: float = 180, **kw: Any
) -> "subprocess.CompletedProcess[str]":
    run = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)
    if run.returncode != 0:
        raise CheckFailed(
            f"`{' '.join(argv[:5])}` exited {run.returncode}: {redact((run.stderr or run.stdout).strip())[-400:]}"
        )
    return run


# -- Redis and Sentinel from the operator -----------------------------------------------------


def _endpoint(url: str, run: Run, ca_file: str | None = None, sentinels: bool = False) -> RedisEndpoint:
    """``url`` as the operator's clients reach it: TLS verified against the deployment's CA (or
    ``ca_file``), through the Sentinels of ``operator.env`` when ``sentinels``."""
    found = None
    if sentinels:
        found = Sentinels(
            parse_host_ports(run.operator["AGENT_REDIS_SENTINELS"]),
            run.operator.get("AGENT_REDIS_SENTINEL_MASTER", "agent"),
            run.operator["AGENT_REDIS_SENTINEL_PASSWORD"],
        )
    tls = TLSFiles(ca_file=ca_file or run.operator["AGENT_REDIS_TLS_CA_FILE"])
    return RedisEndpoint.parse(url, tls=tls, sentinels=found)


def sentinel(run: Run, name: str) -> Any:
    """A client of one machine's Sentinel itself (its password, TLS)."""
    password = quote(run.operator["AGENT_REDIS_SENTINEL_PASSWORD"], safe="")
    url = f"rediss://:{password}@{run.address(name)}:{SENTINEL_PORT}"
    return _endpoint(url, run).client(socket_timeout=3, socket_connect_timeout=3, decode_responses=True)


def control_redis(run: Run) -> Any:
    """The control user's client on the primary, found through the Sentinels."""
    endpoint = _endpoint(run.operator["CONTROL_REDIS_URL"], run, sentinels=True)
    return endpoint.client(socket_timeout=3, socket_connect_timeout=3, decode_responses=True)


def redis_agrees(run: Run) -> str:
    def settled() -> str | None:
        views = [sentinel(run, name).sentinel_master("agent") for name in MACHINES]
        ok = all(v["ip"] == run.address("m1") and v["num-slaves"] == 2 and v["num-other-sentinels"] == 2 for v in views)
        info = control_redis(run).info("replication")
        links = [info.get(f"slave{i}", {}) for i in range(2)]
        synced = info.get("connected_slaves") == 2 and all(link.get("state") == "online" for link in links)
        return (
            f"primary {views[0]['ip']} (m1), 2 replicas online, each Sentinel sees 2 others" if ok and synced else None
        )

    return wait_for("Redis replication and the Sentinels' view", settled, timeout=90)


def tls_and_acl(run: Run) -> str:
    """From the operator: the ports refuse plaintext, an unknown CA and anonymous clients."""
    import redis

    from devtools.certificates import make_ca

    def once(url: str, ca_file: str | None = None) -> Any:
        return _endpoint(url, run, ca_file).client(socket_timeout=3, socket_connect_timeout=3)

    seen = []
    host = run.address("m2")
    try:
        once(f"redis://{host}:{REDIS_PORT}").ping()
        raise CheckFailed("Redis answered a plaintext PING")
    except redis.ConnectionError:
        seen.append("plaintext refused")
    other_ca = WORK / "other-ca.crt"
    other_ca.write_bytes(make_ca("not the deployment's CA")[1])
    try:
        once(f"rediss://{host}:{REDIS_PORT}", str(other_ca)).ping()
        raise CheckFailed("a client trusting another CA connected")
    except redis.ConnectionError as exc:
        if "certificate" not in str(exc).lower():
            raise
        seen.append("unknown CA refused")
    try:
        once(f"rediss://{host}:{REDIS_PORT}").ping()
        raise CheckFailed("an anonymous client ran PING")
    except redis.AuthenticationError:
        seen.append("anonymous NOAUTH")
    try:
        sentinel(run, "m2").execute_command("AUTH", "wrong-password")
        raise CheckFailed("a Sentinel took a wrong password")
    except redis.AuthenticationError:
        seen.append("Sentinel: wrong password refused")
    try:
        control_redis(run).config_get("dir")
        raise CheckFailed("the control user ran CONFIG")
    except redis.ResponseError as exc:
        if "permission" not in str(exc).lower():
            raise
        seen.append("CONFIG refused to the control user")
    return ", ".join(seen)


def nodes_live(run: Run) -> str:
    from worker.placement.records import NODES_KEY

    def live() -> dict[str, str] | None:
        r = control_redis(run)
        now = float(r.time()[0])
        nodes = [n for n, beat in r.zrange(NODES_KEY, 0, -1, withscores=True) if now - beat < 4]
        found = {n: n.rsplit("-", 1)[0] for n in nodes}
        return found if sorted(found.values()) == sorted(MACHINES) else None

    run.nodes = wait_for("a live tools node on each machine", live, timeout=120)
    return ", ".join(f"{node} ({machine})" for node, machine in sorted(run.nodes.items(), key=lambda x: x[1]))
