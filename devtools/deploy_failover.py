"""The Redis failover step of ``make deploy-check --scale``: the primary killed while turns run,
Sentinel's promotion timed, every node back on the new primary, and what the kills cost counted
(lost and stuck turns, duplicated destructive calls, re-paid model calls; docs/failover.md)."""

from __future__ import annotations

import base64
import calendar
import json
import re
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from devtools.deploy_stack import (
    REDIS_SERVERS,
    SENTINELS,
    TURN_TIMEOUT,
    CheckFailed,
    Deployment,
    cli,
    container,
    containers,
    control_python,
    in_container,
    podman,
)
from devtools.deploy_turns import enqueue, home_file


def sentinel(*args: str) -> str:
    """A Sentinel command, asked of each Sentinel in turn until one answers within 10 s (with its
    password from its own environment); ``""`` when none did."""
    for name in SENTINELS:
        try:
            run = in_container(
                name,
                "bash",
                "-c",
                'REDISCLI_AUTH="$SENTINEL_PASSWORD" exec redis-cli --no-auth-warning -p 26379 "$@"',
                "redis-cli",
                *args,
                check=False,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            print(f"           {name} did not answer {' '.join(args)} within 10 s", flush=True)
            continue
        if run.returncode == 0 and run.stdout.strip():
            return run.stdout
    return ""


def primary() -> str:
    """The address of the primary the Sentinels name now (``""`` if none answered)."""
    return (sentinel("sentinel", "get-master-addr-by-name", "agent").split() or [""])[0]


def server_addresses() -> dict[str, str]:
    """``{address on backend: service}`` of the Redis servers: the Sentinels know the servers by
    their fixed addresses (compose.yaml), the runtime's commands by their containers."""
    found: dict[str, str] = {}
    for server in REDIS_SERVERS:
        info = json.loads(podman("inspect", container(server)).stdout)[0]
        for net in (info.get("NetworkSettings", {}).get("Networks") or {}).values():
            if net.get("IPAddress"):
                found[net["IPAddress"]] = server
    return found


_SWITCH = re.compile(r"(\d{1,2} \w{3} \d{4} \d{2}:\d{2}:\d{2}\.\d{3}) # \+switch-master agent (\S+) ")


def switched_at(old: str, since: float) -> float | None:
    """When the first Sentinel announced the promotion away from ``old`` after ``since`` (``+switch-master``
    log line: Sentinel's own clock, to the millisecond; the containers share the host's UTC clock);
    None when no log says so. Polling the Sentinels through ``podman exec`` lags by a second or two."""
    found: list[float] = []
    for name in SENTINELS:
        log = podman("logs", "--since", "2m", container(name), check=False).stdout
        for stamp, master in _SWITCH.findall(log):
            if master == old:
                found.append(calendar.timegm(time.strptime(stamp[:-4], "%d %b %Y %H:%M:%S")) + float(stamp[-4:]))
    found = [t for t in found if t > since]
    return min(found) if found else None


def replica_in_sync(server: str) -> bool:
    out = sentinel("sentinel", "replicas", "agent").split()
    entries: list[dict[str, str]] = []
    for i, word in enumerate(out):
        if word == "name":
            entries.append({})
        if entries and i + 1 < len(out) and i % 2 == 0:
            entries[-1][word] = out[i + 1]
    for e in entries:
        if e.get("ip") == server:
            return e.get("flags") == "slave" and e.get("master-link-status") == "ok"
    return False


def gateway_requests() -> int:
    run = in_container(
        "worker-turns",
        "python",
        "-c",
        "import json, urllib.request; print(json.load(urllib.request.urlopen('http://gateway:8089/stats', timeout=10))['requests'])",
    )
    return int(run.stdout.strip())


@dataclass
class FailoverReport:
    kills: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    completed: int = 0
    failed: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    repaid: int = 0


def _first_step_after(t0: float, ids: list[str]) -> float | None:
    """Seconds from ``t0`` to the first turn progress the control plane reads (through the Sentinels)."""
    run = control_python(
        "import json, sys, time\n"
        "from control.client import ControlPlane\n"
        "t0, ids = float(sys.argv[1]), sys.argv[2:]\n"
        "control = None\n"
        "deadline = time.time() + 120\n"
        "while time.time() < deadline:\n"
        "    try:\n"
        "        control = control or ControlPlane()\n"
        "        views = [control.status(t) for t in ids]\n"
        "    except Exception:\n"
        "        time.sleep(0.1)\n"
        "        continue\n"
        "    after = [v.updated_at for v in views if v.updated_at > t0]\n"
        "    if after:\n"
        "        print(min(after) - t0)\n"
        "        sys.exit(0)\n"
        "    time.sleep(0.1)\n"
        "print('none')\n",
        str(t0),
        *ids,
        timeout=180,
    )
    value = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else "none"
    return None if value == "none" else float(value)


def nodes_reconnected(dep: Deployment) -> str:
    """Every node back on the new primary: each tools node's heartbeat fresh, and every worker
    answering Flower's ping (a broadcast through the broker, so through the Sentinels both ways)."""
    deadline = time.monotonic() + 60
    auth = {"Authorization": "Basic " + base64.b64encode(dep.flower_auth.encode()).decode()}
    workers = {n for n, c in containers().items() if c["service"].startswith("worker-") and c["state"] == "running"}
    while True:
        nodes = json.loads(cli(dep, "nodes", "--json").stdout)
        live = [n for n, v in nodes.items() if v["live"]]
        online = httpx.get(
            "http://127.0.0.1:5555/api/workers", params={"refresh": "true", "status": "true"}, headers=auth, timeout=30
        ).json()
        answering = [w for w, up in online.items() if up]
        if (len(live) >= 2 and len(answering) >= len(workers)) or time.monotonic() > deadline:
            break
        time.sleep(2)
    if len(live) < 2 or len(answering) < len(workers):
        raise CheckFailed(
            f"after the failovers: tools nodes live {live}; workers answering {answering} of {len(workers)}"
        )
    return f"{len(live)} tools nodes beating, {len(answering)}/{len(workers)} workers answering Flower's ping"


def failover(dep: Deployment, kills: int = 3, turns: int = 6) -> str:
    """The Redis primary killed (SIGKILL) ``kills`` times while ``turns`` two-call turns run each
    time; after each, the old primary is started again and waits as a replica in sync."""
    report = FailoverReport()
    paid_before = gateway_requests()
    agents: list[tuple[str, str]] = []
    servers = server_addresses()
    for k in range(kills):
        old = primary()
        if old not in servers:
            raise CheckFailed(f"the Sentinels name {old!r} as the primary, not one of {servers}")
        ids = []
        for i in range(turns):
            agent = f"deploy-f{k}-{i}"
            ids.append(enqueue(dep, "log twice", agent, "deploy-failover", "--approval", "off"))
            agents.append((agent, ids[-1]))
        time.sleep(1.5)  # turns in flight: model calls, commands, records
        # SIGKILL at once (no grace: Redis saves nothing), and marked stopped so that the restart policy
        # does not bring it back as a primary before the Sentinels agree it is down (`podman kill` did).
        podman("stop", "-t", "0", container(servers[old]))
        t0 = time.time()  # dead from here: a step written after this is on the new primary
        promoted_after = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            now = primary()
            if now and now != old:
                promoted_after = time.time() - t0
                break
            time.sleep(0.2)
        if promoted_after is None:
            raise CheckFailed(f"no Sentinel promoted a replica within 60 s of killing {old}")
        announced = switched_at(old, t0 - 1)
        if announced is not None and announced < t0 + promoted_after:
            promoted_after = announced - t0  # the Sentinels' own moment, not when our poll saw it
        first_step = _first_step_after(t0, ids)
        for turn_id in ids:
            run = cli(dep, "wait", turn_id, "--timeout", str(TURN_TIMEOUT), check=False, timeout=TURN_TIMEOUT + 30)
            report.turns += 1
            if run.returncode == 0:
                view = json.loads(run.stdout)
                if view.get("status") == "completed":
                    report.completed += 1
                else:
                    report.failed.append(f"{turn_id} {view.get('status')}: {str(view.get('error'))[:120]}")
            else:
                report.stuck.append(turn_id)
        podman("start", container(servers[old]))
        deadline = time.monotonic() + 90
        while not replica_in_sync(old):
            if time.monotonic() > deadline:
                raise CheckFailed(f"{old} did not come back as a replica in sync within 90 s")
            time.sleep(1)
        report.kills.append(
            {
                "killed": servers[old],
                "promoted": servers.get(now, now),
                "promoted_after": promoted_after,
                "first_step_after": first_step,
            }
        )
        print(
            f"           kill {k + 1}: {servers[old]} ({old}) SIGKILLed; {servers.get(now, now)} promoted after "
            f"{promoted_after:.1f} s; first step on it {'never' if first_step is None else f'after {first_step:.1f} s'}; "
            f"{turns} turns ended; {servers[old]} back as a replica in sync",
            flush=True,
        )
    for agent, _turn in agents:
        log = home_file(agent, "log.txt") or ""
        lines = [x for x in log.splitlines() if x.strip()]
        if len(lines) > len(set(lines)):
            report.duplicated.append(f"{agent}: {lines}")
    report.repaid = max(0, gateway_requests() - paid_before - 3 * report.turns)
    reconnected = nodes_reconnected(dep)
    summary = (
        f"{kills} kills, {report.turns} turns: {report.completed} completed, lost {len(report.failed)}, "
        f"stuck {len(report.stuck)}, duplicated destructive calls {len(report.duplicated)}, re-paid model calls "
        f"{report.repaid}; kill -> promoted "
        + ", ".join(f"{k['promoted_after']:.1f}" for k in report.kills)
        + " s; kill -> first step on the new primary "
        + ", ".join("never" if k["first_step_after"] is None else f"{k['first_step_after']:.1f}" for k in report.kills)
        + f" s; after the kills: {reconnected}"
    )
    if report.failed or report.stuck or report.duplicated or any(k["first_step_after"] is None for k in report.kills):
        raise CheckFailed(f"{summary}; {report.failed + report.stuck + report.duplicated}")
    return summary
