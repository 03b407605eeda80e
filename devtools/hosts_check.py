"""``make deploy-check-hosts``: docs/deployment.md "Several hosts", run on three machines made of
namespaces (``devtools.machines``), one of them then killed whole.

Each step is printed with the seconds it took:

1. four machines on one bridge (198.18.0.0/24): ``m1``, ``m2``, ``m3`` (the deployment) and
   ``provider`` (stands in for the model API, the scripted gateway, and the S3 store); each with
   its own network, PID, mount and UTS namespaces and its own loop-mounted disk at
   ``/srv/agent/homes``; the operator is this host, on the bridge's first address;
2. the procedure of the docs, command for command: ``python -m devtools.hosts_config`` on the
   operator's side (a CA, certificates, ACL passwords, every machine's folder), each folder copied
   to its machine's ``/srv/agent/config`` (through a pipe, as ``scp`` would), and
   ``python -m devtools.host`` started on each machine;
3. Redis (primary on m1, replicas on m2 and m3, TLS only) and the three Sentinels agree; TLS and
   the ACL seen from the operator (plaintext refused, an unknown CA refused, anonymous refused);
   three tools nodes live;
4. turns across the hosts: agents chosen so that each machine's tools node holds two of them,
   each writing a random note and a 1 MiB random file; which machine ran each step and tool call
   (Flower's task list); every home snapshotted to the object store; both pools of every machine
   up in Prometheus; a turn through the HTTP API, from the operator;
5. m3 killed whole: every process (its PID namespace's init killed), its disk unmounted, released
   and deleted, its interface gone;
6. the next turns of m3's agents run on m1 and m2, and read back the note and the file's SHA-256
   as written before the kill (restored from the object store; the model told "[computer moved]");
   Prometheus sees m3's targets down;
7. everything torn down (namespaces, bridge, disks, the deployment's folder with its secrets),
   also after a failure, Ctrl-C or SIGTERM.

``python -m devtools.hosts_check [--keep]``; exit 0 when every step passed, 1 when one failed,
2 when a prerequisite is missing. Runs as root (namespaces, loop devices).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from devtools.deploy_stack import CheckFailed, Steps, set_secrets
from devtools.host import read_env
from devtools.hosts_operator import (
    BASE,
    DEPLOYMENT,
    DISK_MB,
    DISKS,
    GATEWAY_PORT,
    HOME_QUOTA_MB,
    LOGS,
    MACHINES,
    ROOT,
    TURN_TIMEOUT,
    VICTIM,
    Run,
    control_redis,
    nodes_live,
    redis_agrees,
    sh,
    tls_and_acl,
    wait_for,
)
from devtools.machines import Machine, MachineError, require_tools

# -- machines and the procedure ----------------------------------------------------------------


def make_machines(run: Run) -> str:
    run.network.create()
    names = [*MACHINES, "provider"]
    for n, name in enumerate(names):
        address = run.network.address(11 + n if name != "provider" else 20)
        m = Machine(name, address, run.network, DISKS / f"{name}.img", f"{BASE}/homes", DISK_MB)
        m.create()
        run.machines[name] = m
    return ", ".join(f"{m.name} {m.address}" for m in run.machines.values()) + f"; operator {run.network.gateway}"


def configure(run: Run) -> str:
    """The docs' first command, on the operator's machine."""
    shutil.rmtree(DEPLOYMENT, ignore_errors=True)
    argv = [sys.executable, "-m", "devtools.hosts_config", "--out", str(DEPLOYMENT)]
    for name in MACHINES:
        argv += ["--machine", f"{name}={run.address(name)}"]
    argv += ["--objectstore", f"provider={run.address('provider')}"]
    argv += ["--model-url", f"http://{run.address('provider')}:{GATEWAY_PORT}/v1", "--model", "hosts-write"]
    argv += ["--home-quota-mb", str(HOME_QUOTA_MB)]
    out = sh(argv, env={**run.cli_env(), "OPENAI_API_KEY": "sk-scripted-gateway"}).stdout
    run.operator = read_env(DEPLOYMENT / "operator.env")
    secrets = [v for f in DEPLOYMENT.glob("machines/*/host.env") for k, v in read_env(f).items() if _secret(k, v)]
    set_secrets(sorted(set(secrets + [v for k, v in run.operator.items() if _secret(k, v)]), key=len, reverse=True))
    return f"{len(out.splitlines()) - 1} machines' folders in {DEPLOYMENT.relative_to(ROOT)}"


def _secret(key: str, value: str) -> bool:
    if key.endswith("_URL") and "@" in value:
        return False  # its password is listed on its own
    return bool(re.search(r"PASSWORD|SECRET|_KEY$|AUTH", key)) and len(value) >= 8


def copy_folders(run: Run) -> str:
    """Each machine's folder to its ``/srv/agent/config``, through a pipe (what ``scp -r`` does)."""
    for name in [*MACHINES, "provider"]:
        tar = subprocess.run(
            ["tar", "-C", str(DEPLOYMENT / "machines" / name), "-c", "."], capture_output=True, check=True
        )
        done = run.machines[name].run(
            ["sh", "-c", f"mkdir -p {BASE}/config && tar -x -C {BASE}/config && chmod 700 {BASE}/config"],
            input=tar.stdout,
            text=False,
        )
        if done.returncode != 0:
            raise CheckFailed(f"copy to {name}: {done.stderr!r}")
    return f"{BASE}/config on {', '.join(run.machines)} (the operator keeps ca.key)"


def start_machines(run: Run) -> str:
    """``python -m devtools.host`` on each machine (what the systemd unit runs), the provider's
    scripted model beside its object store."""
    LOGS.mkdir(parents=True, exist_ok=True)
    provider = run.machines["provider"]
    gateway = [sys.executable, "-m", "devtools.scripted_gateway", "--host", provider.address]
    provider.start(
        [*gateway, "--port", str(GATEWAY_PORT), "--scripts", "scripts"],
        (LOGS / "gateway.log").open("ab"),
        cwd=str(ROOT),
    )
    for name in ["provider", *MACHINES]:
        log = (LOGS / f"{name}.log").open("ab")
        run.machines[name].start(
            [sys.executable, "-m", "devtools.host", "--config", f"{BASE}/config"], log, cwd=str(ROOT)
        )
    return f"logs in {LOGS.relative_to(ROOT)}"


# -- turns -------------------------------------------------------------------------------------


def cli(run: Run, *args: str, timeout: float = 180) -> str:
    return sh([sys.executable, "-m", "control.cli", *args], env=run.cli_env(), timeout=timeout).stdout


def enqueue(run: Run, agent: str, model: str) -> str:
    return cli(run, "enqueue", f"{model} for {agent}", "--agent", agent, "--model", model, "--approval", "off").strip()


def wait_turn(run: Run, turn: str) -> None:
    status = json.loads(cli(run, "wait", turn, "--timeout", str(TURN_TIMEOUT), timeout=TURN_TIMEOUT + 30))
    if status.get("status") != "completed":
        raise CheckFailed(f"turn {turn} ended {status.get('status')}: {str(status)[:300]}")


def tool_output(run: Run, turn: str) -> str:
    items = [json.loads(line) for line in cli(run, "items", turn).splitlines() if line.strip()]
    outs = [str(i.get("output", "")) for i in items if i.get("type") == "function_call_output"]
    if len(outs) != 1:
        raise CheckFailed(f"turn {turn}: {len(outs)} tool outputs")
    return outs[0]


def _note_and_sha(text: str) -> tuple[str, str]:
    try:
        data = json.loads(text)
        text = str(data.get("stdout") or data.get("output") or text) if isinstance(data, dict) else text
    except ValueError:
        pass
    note = re.search(r"note: ([0-9a-f]{32})", text)
    sha = re.search(r"\b([0-9a-f]{64})\s+blob\.bin", text)
    if not note or not sha:
        raise CheckFailed(f"no note and checksum in the command's output: {text[:300]!r}")
    return note.group(1), sha.group(1)


def choose_agents(run: Run, per_node: int = 2) -> dict[str, str]:
    """Agent ids that the placement rule puts ``per_node`` on each live node (rendezvous hashing)."""
    from worker.placement.records import rendezvous

    nodes = sorted(run.nodes)
    chosen: dict[str, str] = {}
    stamp = time.strftime("%H%M%S")
    for i in range(1000):
        agent = f"hosts-{stamp}-{i}"
        node = rendezvous(agent, nodes)
        if node and sum(1 for n in chosen.values() if n == node) < per_node:
            chosen[agent] = node
        if len(chosen) == per_node * len(nodes):
            return chosen
    raise CheckFailed("no agents found for every node")


def where_tasks_ran(run: Run, turns: dict[str, str]) -> dict[str, list[str]]:
    """``turn -> ["step 0 on m1", "run_command (step 0) on m3", ...]`` from Flower's task list."""
    user, _, password = run.operator["FLOWER_BASIC_AUTH"].partition(":")
    url = f"{run.operator['FLOWER_URL']}/api/tasks"
    tasks = httpx.get(url, params={"limit": 5000}, auth=(user, password), timeout=30).json()
    rows: dict[str, list[str]] = {t: [] for t in turns}
    for task in sorted(tasks.values(), key=lambda t: t.get("received") or 0):
        label = str(task.get("args") or "")
        turn = next((t for t in turns if t in label), None)
        if turn is None:
            continue
        # No worker: sent to a dead machine's queue and never taken (the watchdog re-drove its turn).
        host = str(task.get("worker") or "@nobody (a dead machine's queue)").split("@")[-1]
        step = label.split("step=")[1].split()[0].strip("'\"),") if "step=" in label else "?"
        name = str(task.get("name", ""))
        if name.endswith("turn_step"):
            rows[turn].append(f"step {step} on {host}")
        elif name.endswith("tool_call"):
            tool = label.split()[0].strip("([',\"")
            rows[turn].append(f"{tool} (step {step}) on {host}")
    return rows


def show(rows: dict[str, list[str]], turns: dict[str, str]) -> None:
    for turn, row in rows.items():
        print(f"           {turns[turn]} turn {turn}: " + "; ".join(row), flush=True)


def write_turns(run: Run) -> str:
    run.agents = choose_agents(run)
    turns = {enqueue(run, agent, "hosts-write"): agent for agent in run.agents}
    for turn, agent in turns.items():
        wait_turn(run, turn)
        run.written[agent] = _note_and_sha(tool_output(run, turn))
    rows = wait_for("Flower's record of every task", lambda: _complete(where_tasks_ran(run, turns)), timeout=30)
    show(rows, turns)
    tool_hosts = {row.rsplit(" on ", 1)[1] for r in rows.values() for row in r if row.startswith("run_command")}
    step_hosts = {row.rsplit(" on ", 1)[1] for r in rows.values() for row in r if row.startswith("step")}
    if tool_hosts != set(MACHINES):
        raise CheckFailed(f"tool calls ran on {sorted(tool_hosts)}, expected each of {MACHINES}")
    return f"{len(turns)} turns: steps on {sorted(step_hosts)}, tool calls on {sorted(tool_hosts)}"


def _complete(rows: dict[str, list[str]]) -> dict[str, list[str]] | None:
    return rows if all(any(r.startswith("run_command") for r in row) for row in rows.values()) else None


def snapshots(run: Run) -> str:
    from worker.placement.records import snapshot_key

    def taken() -> list[str] | None:
        r = control_redis(run)
        found = [r.hget(snapshot_key(agent), "object") for agent in run.agents]
        return [str(f) for f in found] if all(found) else None

    objects = wait_for("a snapshot of every agent's home", taken, timeout=60)
    env = read_env(DEPLOYMENT / "machines" / "m1" / "host.env")
    import boto3

    s3 = boto3.client(
        "s3",
        endpoint_url=env["AGENT_SNAPSHOT_ENDPOINT_URL"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        region_name=env["AWS_DEFAULT_REGION"],
    )
    bucket = env["AGENT_SNAPSHOT_STORE"].removeprefix("s3://").split("/")[0]
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    size = sum(int(o["Size"]) for o in listed)
    return f"{len(objects)} homes snapshotted; {len(listed)} objects, {size / 2**20:.1f} MiB in s3://{bucket} on the provider"


def prometheus_targets(run: Run, down: frozenset[str] = frozenset()) -> str:
    url = f"{run.operator['PROMETHEUS_URL']}/api/v1/targets"

    def as_expected() -> list[dict[str, Any]] | None:
        targets = httpx.get(url, timeout=10).json()["data"]["activeTargets"]
        health = {(t["labels"]["machine"], t["labels"]["pool"]): t["health"] for t in targets}
        want = {(m, p): ("down" if m in down else "up") for m in MACHINES for p in ("io", "tools")}
        return targets if health == want else None

    targets = wait_for("Prometheus's view of every worker", as_expected, timeout=90, every=2)
    return ", ".join(f"{t['labels']['machine']}/{t['labels']['pool']} {t['health']}" for t in targets)


def api_turn(run: Run) -> str:
    # The turn asks for no approval, less than the API's floor ("declared"): only a token made to
    # lower it may (docs/control-plane.md, the approval floor).
    token = cli(run, "token", "create", "hosts-check", "--agent", "hosts-api", "--may-lower-approval").strip()
    api = run.operator["AGENT_API_URL"]
    headers = {"Authorization": f"Bearer {token}"}
    body = {"agent_id": "hosts-api", "input": "read back", "model": "hosts-read", "approval": {"mode": "off"}}
    r = httpx.post(f"{api}/v1/turns", json=body, headers=headers, timeout=30)
    if r.status_code not in (200, 201, 202):
        raise CheckFailed(f"POST {api}/v1/turns: {r.status_code} {r.text[:200]}")
    turn = r.json().get("turn_id") or r.json().get("id")
    wait_turn(run, str(turn))
    anonymous = httpx.post(f"{api}/v1/turns", json=body, timeout=10).status_code
    if anonymous != 401:
        raise CheckFailed(f"POST {api}/v1/turns without a token: {anonymous}, not 401")
    plain = cli(run, "token", "create", "hosts-check-plain", "--agent", "hosts-api").strip()
    lowered = httpx.post(f"{api}/v1/turns", json=body, headers={"Authorization": f"Bearer {plain}"}, timeout=10)
    if lowered.status_code != 403:
        raise CheckFailed(f"approval 'off' with a token not made to lower it: {lowered.status_code}, not 403")
    return (
        f"POST {api}/v1/turns with a token: turn {turn} completed; without one: 401; "
        "approval 'off' with a token not allowed to lower the floor: 403"
    )


def kill_victim(run: Run) -> str:
    victim = run.machines[VICTIM]
    held = [a for a, node in run.agents.items() if run.nodes[node] == VICTIM]
    took = victim.kill()
    if victim.disk_image.exists():
        raise CheckFailed(f"{victim.disk_image} still exists")
    alive = subprocess.run(["ip", "netns", "pids", victim.netns], capture_output=True, text=True).stdout.split()
    if alive:
        raise CheckFailed(f"processes left in {victim.netns}: {alive}")
    return f"{VICTIM} killed: every process, its disk released in {took:.1f} s and deleted; its agents {held}"


def after_kill(run: Run) -> str:
    from worker.placement.records import placement_key

    moved = [a for a, node in run.agents.items() if run.nodes[node] == VICTIM]
    turns = {enqueue(run, agent, "hosts-read"): agent for agent in moved}
    checked = []
    for turn, agent in turns.items():
        wait_turn(run, turn)
        out = tool_output(run, turn)
        if _note_and_sha(out) != run.written[agent]:
            raise CheckFailed(f"{agent}: read back {_note_and_sha(out)}, wrote {run.written[agent]}")
        if "[computer moved]" not in out:
            raise CheckFailed(f"{agent}: the model was not told its computer moved: {out[:300]!r}")
        record = control_redis(run).hgetall(placement_key(agent))
        machine = run.nodes.get(record.get("node", ""), record.get("node", ""))
        if machine == VICTIM or record.get("reason") != "node_down":
            raise CheckFailed(f"{agent}: placement {record}")
        checked.append(f"{agent} on {machine} (epoch {record.get('epoch')})")
    rows = where_tasks_ran(run, turns)
    show(rows, turns)
    hosts = {row.rsplit(" on ", 1)[1] for r in rows.values() for row in r}
    if VICTIM in hosts:  # a task the dead machine ran after its death
        raise CheckFailed(f"a task ran on {VICTIM} after its death: {rows}")
    return f"note and SHA-256 of blob.bin as written before the kill, model told: {'; '.join(checked)}"


def others_unaffected(run: Run) -> str:
    agent = next(a for a, node in run.agents.items() if run.nodes[node] == "m1")
    turn = enqueue(run, agent, "hosts-read")
    wait_turn(run, turn)
    if _note_and_sha(tool_output(run, turn)) != run.written[agent]:
        raise CheckFailed(f"{agent} on m1 lost its files")
    return f"{agent} (m1) read its files back, not moved"


def teardown(run: Run) -> str:
    for m in run.machines.values():
        if m.alive:
            m.kill()
    removed = run.network.remove_leftovers(DISKS)
    run.network.remove()
    shutil.rmtree(DEPLOYMENT, ignore_errors=True)  # the deployment's secrets
    # What remove_leftovers found besides the bridge, which is always there (a machine's veth the
    # kernel had not torn down yet...): named.
    left = [name for name in removed if name != run.network.bridge]
    extra = f" (also found and removed: {', '.join(left)})" if left else ""
    return f"machines, bridge and disks removed{extra}; {DEPLOYMENT.relative_to(ROOT)} deleted"


# -- the run -----------------------------------------------------------------------------------


def run_check(keep: bool) -> bool:
    steps = Steps()
    run = Run()
    print(f"deploy-check-hosts: {', '.join(MACHINES)} and a provider, as namespaces; {VICTIM} is killed", flush=True)
    ok = False
    try:
        steps.run("leftovers of an earlier run", lambda: ", ".join(run.network.remove_leftovers(DISKS)) or "none")
        steps.run("machines: namespaces, a bridge, a disk each", lambda: make_machines(run))
        steps.run("operator: python -m devtools.hosts_config", lambda: configure(run))
        steps.run("each machine's folder to its /srv/agent/config", lambda: copy_folders(run))
        steps.run("each machine: python -m devtools.host", lambda: start_machines(run))
        steps.run("Redis over TLS: a primary, two replicas, three Sentinels", lambda: redis_agrees(run))
        steps.run("TLS and ACL from the operator", lambda: tls_and_acl(run))
        steps.run("a tools node on each machine", lambda: nodes_live(run))
        steps.run("turns across the machines (which machine ran what)", lambda: write_turns(run))
        steps.run("homes snapshotted to the object store", lambda: snapshots(run))
        steps.run("Prometheus on m1 scrapes every machine", lambda: prometheus_targets(run))
        steps.run("the HTTP API from the operator", lambda: api_turn(run))
        steps.run(f"kill {VICTIM} whole (processes, disk, interface)", lambda: kill_victim(run))
        steps.run(f"{VICTIM}'s agents: next turns elsewhere, files restored", lambda: after_kill(run))
        steps.run("an agent of m1: files in place", lambda: others_unaffected(run))
        steps.run(f"Prometheus: {VICTIM}'s targets down", lambda: prometheus_targets(run, frozenset({VICTIM})))
        ok = True
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    except (CheckFailed, MachineError, subprocess.TimeoutExpired, httpx.HTTPError):
        pass  # printed by Steps.run
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # nothing cuts the teardown short
        if keep:
            print(
                f"kept up (--keep): `python -m devtools.hosts_check --teardown` removes it; logs in {LOGS}", flush=True
            )
        else:
            steps.run("teardown", lambda: teardown(run))
    total = time.monotonic() - steps.t0
    print(f"deploy-check-hosts: {'PASSED' if ok else 'FAILED'} in {total:.0f} s", flush=True)
    return ok


PRIVATE_DIRS = (Path("/tmp"), Path("/srv"))
"""What each namespace machine mounts a filesystem of its own over (``devtools.machines``): a
checkout or venv under one of them is hidden from the machine's processes."""


def check_visible(*paths: Path) -> None:
    """Raise ``MachineError`` naming the first of ``paths`` (the checkout, its Python) that lies under
    one of ``PRIVATE_DIRS``: a machine could not start ``python -m devtools.host`` from it, and the
    check would only fail later, as Redis refusing connections."""
    for path in paths:
        for private in PRIVATE_DIRS:
            if path.resolve().is_relative_to(private):
                raise MachineError(
                    f"{path} is under {private}, which each machine mounts a filesystem of its own over: "
                    f"run the check from a checkout outside {private}"
                )


def main() -> None:
    """``python -m devtools.hosts_check [--keep | --teardown]`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the machines up (no teardown)")
    parser.add_argument("--teardown", action="store_true", help="remove what a --keep run left, then exit")
    args = parser.parse_args()

    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        require_tools()
        check_visible(ROOT, Path(sys.executable))
        for tool in ("redis-server", "prometheus"):
            if not shutil.which(tool):
                raise MachineError(f"{tool} is missing: `make deploy-check-hosts` installs Debian's package")
    except MachineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if args.teardown:
        print(teardown(Run()))
        return
    raise SystemExit(0 if run_check(args.keep) else 1)


if __name__ == "__main__":
    main()
