"""``make deploy-check``: compose.yaml brought up for real, used from the host, torn down.

What it does, each step printed with the seconds it took (docs/deployment.md, "The check"):

1. builds the images (``devtools.podman``: a Debian base from Debian's packages, layers cached);
2. makes two small filesystems (loop-mounted ext4 images under ``var/deploy/disks``): one for
   Redis's data (``REDIS_DATA_DIR``), one for the agents' homes (``AGENT_HOMES_DIR``), as
   docs/deployment.md asks of a host;
3. ``podman-compose up`` with fresh credentials (never printed), optionally ``--scale`` two turn
   nodes and two tools nodes, and waits for every health check;
4. from the host, through what compose publishes (Redis on 127.0.0.1 with the ``control`` user,
   Flower, Prometheus, the trace UI) and with those credentials:
   - a text turn whose ``run_command`` runs in the sandbox of the tools container: no network
     interface but loopback, Redis unreachable, a file written in its home, no secret in its
     environment or in any ``/proc/<pid>/environ`` it can see, no other agent's home;
   - a turn whose destructive command waits for an approval, approved with ``agent-runtime approve``;
   - a workflow task started with ``python -m control.workflow_cli start --wait``;
   - a command that fills the homes' filesystem, then a turn that still completes (Redis's disk
     is another one);
   - Flower (401 without the password, 200 with), the metrics of both pools in Prometheus
     (``agent_model_call_seconds`` from the turns pool, ``agent_tool_call_seconds`` from the
     tools pool) and the turn's trace in the trace UI;
   - with ``--scale``: turns of several steps at once, and which node ran which step of which
     turn (from Flower's task list); then a turn node stopped with SIGTERM while turns run,
     every turn completing on the other;
5. tears everything down (containers, networks, volumes, the two filesystems), also after a
   failure, Ctrl-C or SIGTERM.

``python -m devtools.deploy_check [--scale] [--keep]``; exit 0 when every step passed, 1 when
one failed (its line says which and why), 2 when a prerequisite is missing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Iterator

import httpx

from devtools.deploy_stack import (
    AGENT_UID,
    PROJECT,
    TURN_TIMEOUT,
    CheckFailed,
    Deployment,
    Steps,
    bring_up,
    cli,
    compose_cmd,
    containers,
    podman,
    remove_leftovers,
    set_secrets,
    teardown,
    wait_healthy,
    workflow_cli,
)
from devtools.podman import PodmanError, build_images, require_tools, write_config

# -- the turns ---------------------------------------------------------------------------------


def enqueue(dep: Deployment, text: str, agent: str, model: str, *extra: str) -> str:
    out: str = cli(dep, "enqueue", text, "--agent", agent, "--model", model, *extra).stdout
    return out.strip()


def wait_turn(dep: Deployment, turn_id: str) -> dict[str, Any]:
    run = cli(dep, "wait", turn_id, "--timeout", str(TURN_TIMEOUT), check=False, timeout=TURN_TIMEOUT + 30)
    if run.returncode != 0:
        raise CheckFailed(f"turn {turn_id} did not complete: {(run.stdout or run.stderr).strip()[:400]}")
    status: dict[str, Any] = json.loads(run.stdout)
    return status


def tool_outputs(dep: Deployment, turn_id: str) -> list[str]:
    items = [json.loads(line) for line in cli(dep, "items", turn_id).stdout.splitlines() if line.strip()]
    return [str(i.get("output", "")) for i in items if i.get("type") == "function_call_output"]


def sandbox_turn(dep: Deployment) -> str:
    other = dep.homes / "deploy-other"
    other.mkdir()
    (other / "private.txt").write_text("another agent's file\n")
    os.chown(other, AGENT_UID, AGENT_UID)
    turn = enqueue(dep, "report on your sandbox", "deploy-a", "deploy-sandbox", "--approval", "off")
    wait_turn(dep, turn)
    (out,) = tool_outputs(dep, turn)
    report = dict(line.split(": ", 1) if ": " in line else line.split("=", 1) for line in _lines(out))
    expected = {
        "uid": "1000",
        "interfaces": "lo",
        "redis": "unreachable",
        "secrets in env": "0",
        "secrets in /proc": "0",
        "homes visible": "deploy-a",
    }
    wrong = {k: report.get(k) for k, v in expected.items() if (report.get(k) or "").strip() != v}
    if wrong:
        raise CheckFailed(f"the sandbox let the command see {wrong} (expected {expected})")
    if any(s in out for s in dep.secrets()):
        raise CheckFailed("a password appeared in the command's output")
    written = dep.homes / "deploy-a" / "deploy-check.txt"
    if written.read_text().strip() != "written in the sandbox":
        raise CheckFailed(f"{written} does not hold what the command wrote")
    return (
        f"turn {turn}: uid 1000, interfaces [lo], Redis unreachable, 0 secrets in env and /proc, "
        f"only its own home, {report.get('processes')} processes visible, file written in the home"
    )


def _lines(text: str) -> Iterator[str]:
    """The report lines of a run_command output (its JSON or plain form)."""
    try:
        data = json.loads(text)
        text = data.get("stdout") or data.get("output") or text if isinstance(data, dict) else text
    except ValueError:
        pass
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(
            ("uid=", "interfaces:", "redis:", "home file:", "secrets in", "processes:", "homes visible:")
        ):
            yield line


def approval_turn(dep: Deployment) -> str:
    turn = enqueue(dep, "remove the check file", "deploy-a", "deploy-approval")
    deadline = time.monotonic() + 60
    pending: list[dict[str, Any]] = []
    while not pending and time.monotonic() < deadline:
        pending = [json.loads(x) for x in cli(dep, "approvals", "--turn", turn, "--json").stdout.splitlines() if x]
        time.sleep(0.5)
    if not pending:
        raise CheckFailed(f"turn {turn} never asked for an approval")
    call = pending[0]["call_id"]
    decided = cli(dep, "approve", turn, call, "--by", "deploy-check").stdout.strip()
    wait_turn(dep, turn)
    if (dep.homes / "deploy-a" / "deploy-check.txt").exists():
        raise CheckFailed("the approved command did not remove the file")
    return f"turn {turn} parked for `{pending[0]['activity']}`; agent-runtime approve -> {decided}; ran and completed"


def workflow_task(dep: Deployment) -> str:
    schema = json.dumps(
        {
            "type": "object",
            "properties": {"answer": {"type": "string"}, "checks": {"type": "integer"}},
            "required": ["answer", "checks"],
            "additionalProperties": False,
        }
    )
    run = workflow_cli(
        dep,
        "start",
        "--agent",
        "deploy-a",
        "--title",
        "Deployment check",
        "--instructions",
        "Submit the result of the deployment check.",
        "--schema",
        schema,
        "--model",
        "deploy-workflow-task",
        "--wait",
        "--timeout",
        str(TURN_TIMEOUT),
    )
    task = json.loads(run.stdout)
    if task["status"] != "succeeded" or task.get("result") != {"answer": "deployed", "checks": 3}:
        raise CheckFailed(f"workflow task ended {task['status']} with {task.get('result')}")
    return f"task {task['task_id']} succeeded with {json.dumps(task['result'])}"


def disk_full_turn(dep: Deployment) -> str:
    fill = enqueue(dep, "fill the disk", "deploy-fill", "deploy-fill", "--approval", "off")
    wait_turn(dep, fill)
    usage = shutil.disk_usage(dep.homes)
    if usage.free > 4 * 1024 * 1024:
        raise CheckFailed(f"the homes' filesystem still has {usage.free // 2**20} MiB free after the fill")
    after = enqueue(dep, "list your files", "deploy-a", "deploy-steps", "--approval", "off")
    wait_turn(dep, after)
    redis_free = shutil.disk_usage(dep.redis_data).free // 2**20
    (dep.homes / "deploy-fill" / "fill.bin").unlink(missing_ok=True)
    return f"homes full (0 MiB free); turn {after} completed after it; Redis's disk has {redis_free} MiB free"


def drain_node(dep: Deployment, turns: int = 8) -> str:
    """Upgrades: a turn node stopped (SIGTERM, as ``podman stop`` / ``docker compose stop`` send it)
    while turns run; every turn completes, on the node that stays."""
    nodes = sorted(n for n, c in containers().items() if c["service"] == "worker-turns")
    if len(nodes) < 2:
        return "skipped: one turn node"
    ids = [enqueue(dep, "list your files", f"deploy-d{i}", "deploy-steps", "--approval", "off") for i in range(turns)]
    t = time.monotonic()
    podman("stop", "-t", "60", nodes[-1], timeout=120)
    stopped = time.monotonic() - t
    for turn_id in ids:
        wait_turn(dep, turn_id)
    podman("start", nodes[-1])
    return f"{nodes[-1]} stopped by SIGTERM in {stopped:.1f} s while {turns} turns ran; all {turns} completed"


# -- what operators see ------------------------------------------------------------------------


def flower(dep: Deployment) -> str:
    url = "http://127.0.0.1:5555/api/workers"
    anonymous = httpx.get(url, timeout=10).status_code
    auth = {"Authorization": "Basic " + base64.b64encode(dep.flower_auth.encode()).decode()}
    good = httpx.get(url, headers=auth, timeout=30)
    if anonymous != 401 or good.status_code != 200:
        raise CheckFailed(f"Flower answered {anonymous} without the password and {good.status_code} with it")
    return "GET /api/workers: 401 without the password, 200 with it"


def prometheus_query(query: str) -> list[dict[str, Any]]:
    r = httpx.get("http://127.0.0.1:9090/api/v1/query", params={"query": query}, timeout=10)
    r.raise_for_status()
    result: list[dict[str, Any]] = r.json()["data"]["result"]
    return result


def metrics() -> str:
    wanted = {
        "agent_model_call_seconds_count": "worker-turns",  # the turns pool
        "agent_tool_call_seconds_count": "worker-tools",  # the tools pool
    }
    deadline = time.monotonic() + 60
    seen: dict[str, set[str]] = {}
    while time.monotonic() < deadline:
        seen = {
            m: {r["metric"].get("service", "") for r in prometheus_query(f"sum by (service) ({m})")} for m in wanted
        }
        if all(svc in seen[m] for m, svc in wanted.items()):
            break
        time.sleep(2)
    else:
        raise CheckFailed(f"Prometheus has not scraped both pools' series: {seen}")
    while True:  # every replica of every worker service scraped (DNS discovery)
        targets = httpx.get("http://127.0.0.1:9090/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        up = [t for t in targets if t["health"] == "up"]
        if len(up) == len(targets) or time.monotonic() > deadline:
            break
        time.sleep(2)
    tools = prometheus_query('sum(agent_tool_call_seconds_count{service="worker-tools"})')[0]["value"][1]
    return f"{len(up)}/{len(targets)} worker targets up; agent_tool_call_seconds from worker-tools ({tools} calls), agent_model_call_seconds from worker-turns"


def trace(dep: Deployment, turn_id: str) -> str:
    """The turn's spans in Phoenix (its REST API, as its UI shows them)."""
    from control.client import ControlPlane

    state = ControlPlane(dep.control_url).store.load(turn_id)
    traceparent = (state.traceparent if state else None) or ""
    trace_id = traceparent.split("-")[1] if traceparent.count("-") == 3 else ""
    if not trace_id:
        raise CheckFailed(f"turn {turn_id} has no trace id ({traceparent!r})")
    deadline = time.monotonic() + 60
    names: list[str] = []
    while time.monotonic() < deadline:
        r = httpx.get("http://127.0.0.1:6006/v1/projects/agent-worker/spans", params={"limit": 1000}, timeout=20)
        if r.status_code == 200:
            names = [s["name"] for s in r.json().get("data", []) if s["context"]["trace_id"] == trace_id]
            if any(n.startswith("invoke_agent") for n in names) and any(n.startswith("execute_tool") for n in names):
                break
        time.sleep(2)
    else:
        raise CheckFailed(f"trace {trace_id} of turn {turn_id} is not complete in the trace UI: {names}")
    ui = httpx.get("http://127.0.0.1:6006/", timeout=10).status_code
    return f"trace {trace_id}: {len(names)} spans ({', '.join(sorted(set(n.split()[0] for n in names)))}); UI {ui}"


def redis_usage(dep: Deployment) -> str:
    """What the check's turns cost Redis: memory and the append-only file on its disk (for sizing)."""
    from worker.redis_connection import redis_endpoint

    client = redis_endpoint(url=dep.control_url).client()
    info = client.info("memory")
    keys = client.dbsize()
    client.close()
    aof = sum(p.stat().st_size for p in dep.redis_data.rglob("*") if p.is_file())
    return f"used_memory {info['used_memory_human']}, {keys} keys, {aof / 2**20:.1f} MiB on its disk (AOF)"


def nodes_at_work(dep: Deployment, turns: int = 8) -> str:
    """Several three-step turns at once; which node ran each step and each tool call (Flower's tasks)."""
    ids = [enqueue(dep, "list your files", f"deploy-s{i}", "deploy-steps", "--approval", "off") for i in range(turns)]
    for turn_id in ids:
        wait_turn(dep, turn_id)
    hosts = {c["hostname"]: name for name, c in containers().items()}
    auth = {"Authorization": "Basic " + base64.b64encode(dep.flower_auth.encode()).decode()}
    tasks = httpx.get("http://127.0.0.1:5555/api/tasks", params={"limit": 5000}, headers=auth, timeout=30).json()
    rows: dict[str, list[str]] = {t: [] for t in ids}
    turn_nodes: set[str] = set()
    tool_nodes: set[str] = set()
    for task in sorted(tasks.values(), key=lambda t: t.get("received") or 0):
        label = str(task.get("args") or "")
        turn = next((t for t in ids if t in label), None)
        if turn is None:
            continue
        node = hosts.get(str(task.get("worker") or "").split("@")[-1], task.get("worker") or "?")
        step = label.split("step=")[1].split()[0].strip("'\"),") if "step=" in label else "?"
        if task.get("name", "").endswith("turn_step"):
            turn_nodes.add(node)
            rows[turn].append(f"step {step} on {node}")
        elif task.get("name", "").endswith("tool_call"):
            tool_nodes.add(node)
            rows[turn].append(f"{label.split()[0]} (step {step}) on {node}")
    for turn, row in rows.items():
        print(f"           turn {turn}: " + "; ".join(row), flush=True)
    if dep.scale and (len(turn_nodes) < 2 or len(tool_nodes) < 2):
        raise CheckFailed(f"steps ran on {sorted(turn_nodes)} and tools on {sorted(tool_nodes)}: expected two of each")
    return f"{turns} turns: steps on {sorted(turn_nodes)}, tool calls on {sorted(tool_nodes)}"


# -- the run -----------------------------------------------------------------------------------


def run_check(scale: bool, keep: bool) -> bool:
    """Run every step (see the module docstring); True when all passed. Tears down unless ``keep``."""
    steps = Steps()
    dep = Deployment(scale=scale)
    set_secrets(dep.secrets())
    title = "scaled: 2 turn nodes, 2 tools nodes" if scale else "one node of each service"
    print(f"deploy-check ({title}), compose project {PROJECT!r}", flush=True)
    ok = False
    try:
        steps.run("build images", lambda: ", ".join(f"{n.split('/')[-1]} {s:.0f} s" for n, s in build_images().items()))
        steps.run("leftovers of an earlier run", remove_leftovers)
        steps.run("compose up", lambda: bring_up(dep))
        steps.run("health checks", wait_healthy)
        sandbox: dict[str, str] = {}

        def _sandbox() -> str:
            out = sandbox_turn(dep)
            sandbox["turn"] = out.split()[1].rstrip(":")
            return out

        steps.run("text turn: run_command in the tools container's sandbox", _sandbox)
        steps.run("approval approved through agent-runtime approve", lambda: approval_turn(dep))
        steps.run("workflow task (control.workflow_cli start --wait)", lambda: workflow_task(dep))
        steps.run("homes' disk full: Redis and turns unaffected", lambda: disk_full_turn(dep))
        steps.run("nodes: which node ran which step", lambda: nodes_at_work(dep, 8 if scale else 2))
        if scale:
            steps.run("drain a turn node (SIGTERM) while turns run", lambda: drain_node(dep))
        steps.run("Flower: auth required", lambda: flower(dep))
        steps.run("metrics of both pools in Prometheus", metrics)
        steps.run("Redis after the check's turns", lambda: redis_usage(dep))
        steps.run("trace in the trace UI (Phoenix)", lambda: trace(dep, sandbox["turn"]))
        ok = True
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except (CheckFailed, PodmanError, subprocess.TimeoutExpired, httpx.HTTPError):
        pass  # printed by Steps.run
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # nothing cuts the teardown short
        if keep and dep.up:
            print(f"kept up (--keep): `{' '.join(compose_cmd())} down -v` removes it", flush=True)
        else:
            steps.run("teardown", lambda: teardown(dep))
    total = time.monotonic() - steps.t0
    print(f"deploy-check ({title}): {'PASSED' if ok else 'FAILED'} in {total:.0f} s", flush=True)
    return ok


def main() -> None:
    """``python -m devtools.deploy_check [--scale] [--keep]`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--scale", action="store_true", help="two turn nodes and two tools nodes")
    parser.add_argument("--keep", action="store_true", help="leave the deployment up (no teardown)")
    args = parser.parse_args()

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        if os.geteuid() != 0:
            raise PodmanError("the check runs rootful podman and mounts two filesystems: run it as root")
        require_tools("podman", "runc", "mkfs.ext4")
        write_config()
        compose_cmd()
    except PodmanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    raise SystemExit(0 if run_check(args.scale, args.keep) else 1)


if __name__ == "__main__":
    main()
