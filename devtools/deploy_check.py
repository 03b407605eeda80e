"""``make deploy-check``: compose.yaml brought up for real, used as an operator would, failed over, torn down.

What it does, each step printed with the seconds it took (docs/deployment.md, "The check"):

1. builds the images (``devtools.podman``: a Debian base from Debian's packages, layers cached);
2. makes two small filesystems (loop-mounted ext4 images under ``var/deploy/disks``): one for
   Redis's data (``REDIS_DATA_DIR``: ``redis-1/``, ``redis-2/``), one for the agents' homes
   (``AGENT_HOMES_DIR``), as docs/deployment.md asks of a host;
3. ``podman-compose up`` with fresh credentials (never printed), optionally ``--scale`` two turn
   nodes and two tools nodes, and waits for every health check; the tools container's Python has
   the tarfile fixes (3.11.13, 3.12.11, 3.13.4 or later);
4. as the control plane (the CLIs inside the ``api`` container, which reaches Redis through the
   Sentinels; Flower, Prometheus and the trace UI through what compose publishes):
   - a text turn whose ``run_command`` runs in the sandbox of the tools container, with the
     per-agent limits on, and attacks it: its own host uid (not root), no network interface but
     loopback, Redis and the Sentinels unreachable, no secret in its environment or in any
     ``/proc/<pid>/environ`` it can see, no other agent's home, no setuid bit (seccomp) and no
     root from a copied shell, no capability in any set and ``no_new_privs`` (its own
     ``/proc/self/status``); the file it wrote is its uid's, in its home;
   - a turn whose destructive command waits for an approval, approved with ``agent-runtime approve``;
   - a workflow task started with ``python -m control.workflow_cli start --wait``;
   - a command that writes past its home's quota (a loop-mounted image): it fails naming
     ``AGENT_HOME_QUOTA_MB``, the homes' disk keeps its room, the next turn completes;
   - four processes of one command, each under the memory limit, together over it: killed;
   - with ``--scale``: which node ran which step; ``agent-runtime nodes`` lists each tools replica
     as a node; a turn node stopped with SIGTERM while turns run, every turn completing on the
     other; the tools replica that holds an agent's home killed, and the agent's next turn told
     ``[computer moved]`` with its file restored from the object store; then the Redis primary
     killed three times while turns run: Sentinel promotes the replica, every node reconnects,
     every turn ends; lost / stuck turns, duplicated destructive calls and re-paid model calls
     are counted, with the time from each kill to the first step on the new primary;
   - Flower (401 without the password, 200 with), the metrics of both pools in Prometheus and the
     turn's trace in the trace UI;
5. a planned ``down`` (``devtools.deploy_stack.down``: every container by the project's label,
   each with its stop grace): no container SIGKILLed (exit code 137), each Redis server's log ends
   with "ready to exit"; then the two filesystems. Also after a failure, Ctrl-C or SIGTERM.

``python -m devtools.deploy_check [--scale] [--keep]``; exit 0 when every step passed, 1 when
one failed (its line says which and why), 2 when a prerequisite is missing.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from devtools.deploy_attacks import disk_fill, memory_attack, sandbox_turn
from devtools.deploy_failover import failover
from devtools.deploy_stack import (
    PROJECT,
    REDIS_SERVERS,
    TURN_TIMEOUT,
    CheckFailed,
    Deployment,
    Steps,
    bring_up,
    cli,
    compose_cmd,
    containers,
    control_python,
    down,
    podman,
    remove_leftovers,
    save_logs,
    set_secrets,
    teardown,
    wait_healthy,
    workflow_cli,
)
from devtools.deploy_turns import enqueue, home_file, run_turn, tools_containers, wait_turn
from devtools.podman import PodmanError, build_images, require_tools, write_config


def tools_python() -> str:
    """The tools containers' Python has the tarfile fixes (``os.path.ALLOW_MISSING`` came with
    them): a second wall behind the snapshot restore's own checks (docs/isolation.md)."""
    probe = "import sys; from worker.placement.restorer import python_has_tarfile_fixes as f; print(sys.version.split()[0], f())"
    seen = {name: podman("exec", name, "python", "-c", probe).stdout.split() for name in tools_containers()}
    if not seen or any(v[-1:] != ["True"] for v in seen.values()):
        raise CheckFailed(f"a tools container's Python lacks the tarfile fixes (3.11.13, 3.12.11, 3.13.4+): {seen}")
    versions = sorted({v[0] for v in seen.values()})
    return f"Python {', '.join(versions)} in {len(seen)} tools container(s): the tarfile fixes (os.path.ALLOW_MISSING)"


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
    if home_file("deploy-a", "deploy-check.txt") is not None:
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


def drain_node(dep: Deployment, turns: int = 8) -> str:
    """Upgrades: a turn node stopped (SIGTERM, as ``podman stop`` / ``docker compose stop`` send it)
    while turns run; every turn completes, on the node that stays."""
    nodes = sorted(n for n, c in containers().items() if c["service"] == "worker-turns")
    if len(nodes) < 2:
        return "skipped: one turn node"
    ids = [enqueue(dep, "list your files", f"deploy-d{i}", "deploy-steps", "--approval", "off") for i in range(turns)]
    t = time.monotonic()
    podman("stop", "-t", "210", nodes[-1], timeout=300)
    stopped = time.monotonic() - t
    code = json.loads(podman("inspect", nodes[-1]).stdout)[0]["State"]["ExitCode"]
    for turn_id in ids:
        wait_turn(dep, turn_id)
    podman("start", nodes[-1])
    return f"{nodes[-1]} stopped by SIGTERM in {stopped:.1f} s (exit {code}) while {turns} turns ran; all {turns} completed"


# -- nodes of homes ----------------------------------------------------------------------------


def tools_nodes(dep: Deployment) -> str:
    """``agent-runtime nodes``: each tools replica is a node of its own (its own homes)."""
    nodes = json.loads(cli(dep, "nodes", "--json").stdout)
    live = sorted(n for n, v in nodes.items() if v["live"])
    want = 2 if dep.scale else 1
    if len(live) != want:
        raise CheckFailed(f"agent-runtime nodes lists {len(live)} live node(s) ({live}), expected {want}")
    roots = sorted({nodes[n]["root"] for n in live})
    if len(roots) != len(live):
        raise CheckFailed(f"the tools replicas share a homes root: {roots}")
    return f"{len(live)} live node(s): " + ", ".join(
        f"{n} ({nodes[n]['root']}, {nodes[n]['agents']} agents)" for n in live
    )


def node_container(dep: Deployment, node: str) -> str:
    """The tools container that serves ``node``: the one whose worker's ``AGENT_HOMES_ROOT`` (its
    homes slot, set by deploy/tools-node; the image's own ``/homes`` is the init's) is the node's
    root in ``agent-runtime nodes``."""
    root = json.loads(cli(dep, "nodes", "--json").stdout).get(node, {}).get("root")
    find = 'for p in /proc/[0-9]*; do tr "\\0" "\\n" < "$p/environ" 2>/dev/null | grep "^AGENT_HOMES_ROOT=/homes/node-" && exit; done'
    for name in tools_containers():
        run = podman("exec", name, "sh", "-c", find, check=False)
        if root and run.stdout.strip() == f"AGENT_HOMES_ROOT={root}":
            return name
    raise CheckFailed(f"no running tools container serves node {node} (root {root})")


def kill_home_node(dep: Deployment) -> str:
    """The tools replica that holds an agent's home is killed (SIGKILL, no restart); the agent's
    next turn runs on the other node, is told ``[computer moved]``, and reads its file restored from
    the object store."""
    agent = "deploy-move"
    run_turn(dep, agent, "deploy-write")
    record = json.loads(
        control_python(
            "import json, sys; from control.client import ControlPlane\n"
            "print(json.dumps(ControlPlane().placement_of(sys.argv[1])))",
            agent,
        ).stdout
    )
    node = record.get("node", "")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # a snapshot within AGENT_SNAPSHOT_INTERVAL (5 s) of the write
        snap = control_python(
            "import sys; from control.client import ControlPlane\n"
            "print(ControlPlane().redis.exists('agent:snapshot:' + sys.argv[1]))",
            agent,
            timeout=60,
        ).stdout.strip()
        if snap == "1":
            break
        time.sleep(1)
    else:
        raise CheckFailed(f"no snapshot of {agent}'s home was recorded after its write")
    victim = node_container(dep, node)
    podman("kill", victim)
    podman("stop", "-t", "0", victim, check=False)  # no restart: the node stays dead
    time.sleep(6)  # its heartbeat expires (AGENT_LIVENESS_TTL, 4 s)
    turn, outs = run_turn(dep, agent, "deploy-read")
    out = outs[0] if outs else ""
    podman("start", victim)
    if "[computer moved]" not in out or "kept across nodes: 7f3a9c" not in out:
        raise CheckFailed(f"after its node died, {agent}'s next call said {out[:400]!r}")
    moved = json.loads(
        control_python(
            "import json, sys; from control.client import ControlPlane\n"
            "print(json.dumps(ControlPlane().placement_of(sys.argv[1])))",
            agent,
        ).stdout
    )
    return (
        f"{victim} (node {node}) killed; turn {turn}: [computer moved] to {moved.get('node')} "
        f"(epoch {moved.get('epoch')}, {moved.get('reason')}), kept.txt restored from the object store"
    )


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
    traceparent = control_python(
        "import sys; from control.client import ControlPlane\n"
        "state = ControlPlane().store.load(sys.argv[1])\n"
        "print((state.traceparent if state else None) or '')",
        turn_id,
    ).stdout.strip()
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
    """What the check's turns cost Redis: memory and the append-only files on its disk (for sizing)."""
    out = control_python(
        "from control.client import ControlPlane\n"
        "r = ControlPlane().redis\n"
        "print(r.info('memory')['used_memory_human'], r.dbsize())"
    ).stdout.split()
    aof = sum(p.stat().st_size for p in dep.redis_data.rglob("*") if p.is_file())
    return f"used_memory {out[0]}, {out[1]} keys, {aof / 2**20:.1f} MiB on its disk (both servers' AOF and RDB)"


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


# -- the planned stop --------------------------------------------------------------------------


def planned_down(dep: Deployment) -> str:
    """``down`` as an operator runs it: no container SIGKILLed, each Redis server saved and exited."""
    result = down()
    stopped = result.stopped
    dep.up = False
    killed = [f"{s.name} ({s.exit_code})" for s in stopped if s.exit_code == 137]
    if killed:
        raise CheckFailed(f"SIGKILLed at down: {killed}")
    if result.not_removed:
        raise CheckFailed(f"not removed at down: {result.not_removed}")
    unsaved = [s.name for s in stopped if s.service in REDIS_SERVERS and "ready to exit" not in s.log_tail]
    if unsaved:
        raise CheckFailed(f"{unsaved}: no 'ready to exit' at the end of the log at down")
    codes = ", ".join(f"{s.service} {s.exit_code}" for s in sorted(stopped, key=lambda s: s.service))
    slowest = max(stopped, key=lambda s: s.seconds)
    return (
        f"{len(stopped)} containers stopped by SIGTERM, none SIGKILLed (exit codes: {codes}); both Redis servers "
        f"'ready to exit'; slowest {slowest.name} {slowest.seconds:.1f} s"
    )


# -- the run -----------------------------------------------------------------------------------


def run_check(scale: bool, keep: bool) -> bool:
    """Run every step (see the module docstring); True when all passed. Tears down unless ``keep``."""
    steps = Steps()
    dep = Deployment(scale=scale)
    set_secrets(dep.secrets())
    title = "scaled: 2 turn nodes, 2 tools nodes, Redis failover" if scale else "one node of each service"
    print(f"deploy-check ({title}), compose project {PROJECT!r}", flush=True)
    ok = False
    try:
        steps.run("build images", lambda: ", ".join(f"{n.split('/')[-1]} {s:.0f} s" for n, s in build_images().items()))
        steps.run("leftovers of an earlier run", remove_leftovers)
        steps.run("compose up", lambda: bring_up(dep))
        steps.run("health checks", wait_healthy)
        steps.run("the tools container's Python: the tarfile fixes", tools_python)
        sandbox: dict[str, str] = {}

        def _sandbox() -> str:
            out = sandbox_turn(dep)
            sandbox["turn"] = out.split()[1].rstrip(":")
            return out

        steps.run("text turn: run_command in the tools container's sandbox, its attacks contained", _sandbox)
        steps.run("approval approved through agent-runtime approve", lambda: approval_turn(dep))
        steps.run("workflow task (control.workflow_cli start --wait)", lambda: workflow_task(dep))
        steps.run("disk fill past the home's quota: contained", lambda: disk_fill(dep))
        steps.run("memory across the processes of one command: contained", lambda: memory_attack(dep))
        steps.run("nodes: which node ran which step", lambda: nodes_at_work(dep, 8 if scale else 2))
        steps.run("agent-runtime nodes: each tools replica a node", lambda: tools_nodes(dep))
        if scale:
            steps.run("drain a turn node (SIGTERM) while turns run", lambda: drain_node(dep))
            steps.run("kill the tools node that holds a home: [computer moved]", lambda: kill_home_node(dep))
            steps.run("Redis primary killed 3 times while turns run", lambda: failover(dep))
        steps.run("Flower: auth required", lambda: flower(dep))
        steps.run("metrics of both pools in Prometheus", metrics)
        steps.run("Redis after the check's turns", lambda: redis_usage(dep))
        steps.run("trace in the trace UI (Phoenix)", lambda: trace(dep, sandbox["turn"]))
        if not keep:
            steps.run("planned down: no SIGKILL, Redis saved", lambda: planned_down(dep))
        ok = True
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except (CheckFailed, PodmanError, subprocess.TimeoutExpired, httpx.HTTPError):
        pass  # printed by Steps.run
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # nothing cuts the teardown short
        if keep and dep.up:
            print(f"kept up (--keep): `{sys.executable} -m devtools.deploy_stack down -p {PROJECT} -v` removes it")
        else:
            if not ok and dep.up:
                try:
                    steps.run("logs", save_logs)
                except Exception:  # printed by Steps.run; the teardown runs whatever happened
                    pass
            steps.run("teardown", lambda: teardown(dep))
    total = time.monotonic() - steps.t0
    print(f"deploy-check ({title}): {'PASSED' if ok else 'FAILED'} in {total:.0f} s", flush=True)
    return ok


def main() -> None:
    """``python -m devtools.deploy_check [--scale] [--keep]`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--scale", action="store_true", help="two turn nodes and two tools nodes, and the failover")
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
