"""The isolation attacks ``make deploy-check`` runs inside the tools container, with the per-agent
limits on (docs/isolation.md): the sandbox report (uid, network, Redis, secrets, other homes,
setuid, the capabilities the command holds), a write past the home's quota and memory across the
processes of one command."""

from __future__ import annotations

import json
import shutil
from typing import Iterator

from devtools.deploy_stack import COMMAND_MEMORY_BYTES, HOME_QUOTA_MB, CheckFailed, Deployment
from devtools.deploy_turns import home_file, run_turn
from worker.tools.computer.privileges import Privileges, command_held


def _report(text: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in _lines(text):
        key, _, value = line.partition(": ") if ": " in line else line.partition("=")
        found[key.strip()] = value.strip()
    return found


# The lines of the sandbox report (scripts/deploy-sandbox.json), by how each starts.
REPORT_KEYS: tuple[str, ...] = ("uid=", "interfaces:", "redis:", "home file:", "secrets in", "capabilities:")
REPORT_KEYS += ("processes:", "homes visible:", "other home:")


def _lines(text: str) -> Iterator[str]:
    """The report lines of a run_command output (its JSON or plain form)."""
    try:
        data = json.loads(text)
        text = data.get("stdout") or data.get("output") or text if isinstance(data, dict) else text
    except ValueError:
        pass
    for line in text.splitlines():
        line = line.strip()
        if line.startswith((*REPORT_KEYS, "setuid ")):
            yield line


def sandbox_turn(dep: Deployment) -> str:
    """The sandbox report and its attacks, run in the tools container with the per-agent limits on."""
    run_turn(dep, "deploy-b", "deploy-write")  # another agent's file, to be out of reach
    turn, (out,) = run_turn(dep, "deploy-a", "deploy-sandbox", "report on your sandbox")
    report = _report(out)
    uid = report.get("uid", "")
    expected = {
        "interfaces": "lo",
        "redis": "unreachable",
        "secrets in env": "0",
        "secrets in /proc": "0",
        "homes visible": "deploy-a",
        "other home": "unreadable",
        "home file": f"{uid}: written in the sandbox",
        "setuid bits": "755",
        "setuid euid": uid,
    }
    wrong = {k: report.get(k) for k, v in expected.items() if (report.get(k) or "").strip() != v}
    if not uid.isdigit() or int(uid) < 1000:
        wrong["uid"] = uid  # the agent's own host uid, never root's
    # "CapInh:0000000000000000 ... NoNewPrivs:1": every capability set empty, no_new_privs on
    status = "\n".join(report.get("capabilities", "").split())
    if held := command_held(status):
        wrong["capabilities"] = "; ".join(held)
    if wrong:
        raise CheckFailed(f"the sandbox let the command see or do {wrong} (expected {expected})")
    if any(s in out for s in dep.secrets()):
        raise CheckFailed("a password appeared in the command's output")
    if (home_file("deploy-a", "deploy-check.txt") or "").strip() != "written in the sandbox":
        raise CheckFailed("deploy-a's home does not hold what the command wrote")
    return (
        f"turn {turn}: agent uid {uid}, interfaces [lo], Redis and Sentinels unreachable, 0 secrets in env "
        f"and /proc, only its own home (another agent's file unreadable), setuid refused (mode 755, "
        f"euid {uid}), {report.get('processes')} processes visible, file written in the home; "
        f"capabilities: {Privileges.parse(status).line()}"
    )


def disk_fill(dep: Deployment) -> str:
    """An agent writes past its quota: only its own write fails (the home is an image of
    ``HOME_QUOTA_MB``); the homes' disk keeps its room and another agent's turn completes."""
    turn, (out,) = run_turn(dep, "deploy-fill", "deploy-fill", "fill the disk")
    size = next((line.split(":")[1].split()[0] for line in out.splitlines() if line.startswith("home size:")), "")
    if "AGENT_HOME_QUOTA_MB" not in out or not size.isdigit() or int(size) > HOME_QUOTA_MB * 1024:
        raise CheckFailed(f"the write past the quota was not contained: {out[:300]!r}")
    free_mb = shutil.disk_usage(dep.homes).free // 2**20
    if free_mb < 200:
        raise CheckFailed(f"the homes' disk has only {free_mb} MiB free after one agent filled its home")
    after, _ = run_turn(dep, "deploy-a", "deploy-steps", "list your files")
    redis_free = shutil.disk_usage(dep.redis_data).free // 2**20
    return (
        f"turn {turn}: its home ({int(size) // 1024} MiB) full, the output names AGENT_HOME_QUOTA_MB; the homes' disk "
        f"has {free_mb} MiB free; turn {after} completed after it; Redis's disk has {redis_free} MiB free"
    )


def memory_attack(dep: Deployment) -> str:
    """Four processes of one command, each far under RLIMIT_AS, together over the command's memory cgroup."""
    turn, (out,) = run_turn(dep, "deploy-mem", "deploy-memory", "use memory")
    limit = f"memory limit of {COMMAND_MEMORY_BYTES // 2**20} MiB"
    if limit not in out or "all-survived" in out:
        raise CheckFailed(f"four processes of one command were not stopped at {limit}: {out[:300]!r}")
    return f"turn {turn}: 4 x 200 MiB processes killed together at the command's {limit} (a memory cgroup)"
