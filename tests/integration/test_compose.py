"""compose.yaml describes a deployment made only of commands and images this project provides,
safe by default (issues 9, 18, 29 and 30): Redis with passwords on an internal network, a replica
and three Sentinels that every client goes through, nothing of Redis published, the model key
only where the model is called, the object store's keys only where snapshots are made, the tools
worker's grants (the per-agent limits on) and no others, every service under an init with a stop
grace that covers its work, Flower on localhost with auth on every route, nothing else published.
`make deploy-check` runs it for real (devtools/deploy_check.py); the Redis and Sentinel commands
run here against this machine's redis-server."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import redis
import yaml

from tasks.app import QUEUES, app

ROOT = Path(__file__).resolve().parents[2]


def _compose():
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _opt(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def _program(cmd):
    """The command a service runs, past the tools node's entry (deploy/tools-node execs its arguments)."""
    return cmd[1:] if cmd[0] == "agent-tools-node" else cmd


def test_every_service_command_is_provided_by_the_project():
    services = _compose()["services"]
    served = set()
    for name, svc in services.items():
        if svc["image"] != "localhost/agent-runtime:latest":  # Redis, Prometheus, Phoenix: their own tests
            continue
        cmd = _program(svc["command"])
        if cmd[0] == "celery":
            assert _opt(cmd, "-A") == "tasks.app", name
            assert importlib.util.find_spec("tasks.app") is not None
            sub = cmd[3]
            assert sub in ("worker", "beat", "flower"), name
            if sub == "worker":
                queues = _opt(cmd, "-Q").split(",")
                assert set(queues) <= set(QUEUES), name
                served |= set(queues)
            if sub == "beat":
                assert _opt(cmd, "-S") == "tasks.beat:ResilientRedBeatScheduler"
                assert importlib.util.find_spec("redbeat") is not None
            assert sub != "flower", "Flower runs through tasks.flower (auth on every route)"
        elif cmd[:3] == ["python", "-m", "tasks.flower"]:
            assert importlib.util.find_spec("tasks.flower") is not None
            assert not any("auth" in a for a in cmd), "Flower credentials never go on the command line"
        elif cmd[:3] == ["python", "-m", "control.api"]:  # the HTTP control plane
            assert importlib.util.find_spec("control.api.app") is not None
        elif cmd[:3] == ["python", "-m", "devtools.object_store"]:  # SeaweedFS's S3 server
            assert importlib.util.find_spec("devtools.object_store") is not None
            assert _opt(cmd, "--bucket") == "homes" and not any("key" in a.lower() for a in cmd)
        elif cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, f"{name}: no module {cmd[2]}"
            scripts = ROOT / _opt(cmd, "--scripts")
            assert any(scripts.glob("*.json")), f"{name}: no scripts in {scripts}"
        else:
            raise AssertionError(f"{name}: unknown command {cmd}")
    assert served == set(QUEUES), "every queue needs a worker service"


def _redis_shell(service: str = "redis-1") -> str:
    cmd = _compose()["services"][service]["command"]
    assert cmd[:2] == ["bash", "-c"]
    return cmd[2]


def test_redis_keeps_data_and_never_evicts():
    for server in ("redis-1", "redis-2"):
        script = _redis_shell(server)
        assert script.startswith("exec redis-server - ")  # redis-server is the process that gets SIGTERM
        args = shlex.split(script.split("exec redis-server -", 1)[1].split("<<<", 1)[0])
        assert _opt(args, "--maxmemory-policy") == "noeviction"
        assert _opt(args, "--appendonly") == "yes"


def test_redis_requires_a_password_from_the_environment():
    compose = _compose()
    services = compose["services"]
    for server in ("redis-1", "redis-2"):
        env = services[server]["environment"]
        for var in ("REDIS_PASSWORD", "REDIS_CONTROL_PASSWORD", "REDIS_REPLICA_PASSWORD", "REDIS_SENTINEL_PASSWORD"):
            assert env[var].startswith(f"${{{var}:?"), (server, var)
        # default: locked by a random per-start password (not off: Redis 7.0 replays the AOF as default)
        assert "user default on >%s" in _redis_shell(server) and "/dev/urandom" in _redis_shell(server)
        assert "requirepass" not in _redis_shell(server)
    for name, svc in services.items():
        env = svc.get("environment") or {}
        if "REDIS_URL" in env:
            assert env["REDIS_URL"].startswith("redis://worker:${REDIS_PASSWORD:?"), name
        if "REDIS_URL" in env or "CONTROL_REDIS_URL" in env:  # every client through the Sentinels
            assert env["AGENT_REDIS_SENTINELS"] == "sentinel-1:26379,sentinel-2:26379,sentinel-3:26379", name
            assert env["AGENT_REDIS_SENTINEL_MASTER"] == "agent", name
            assert env["AGENT_REDIS_SENTINEL_PASSWORD"].startswith("${SENTINEL_PASSWORD:?"), name
    assert services["api"]["environment"]["CONTROL_REDIS_URL"].startswith("redis://control:${REDIS_CONTROL_PASSWORD:?")
    clients = {n for n, s in services.items() if {"REDIS_URL", "CONTROL_REDIS_URL"} & set(s.get("environment") or {})}
    assert clients == {"beat", "flower", "api"} | {n for n in services if n.startswith("worker-")}


def _compose_script(service: str, env: dict[str, str], data: str, port: int, primary_port: int | None = None) -> str:
    """compose's command of ``service`` with this machine's redis-server, on 127.0.0.1:``port``,
    its data in ``data``; a replica (or a Sentinel) follows 127.0.0.1:``primary_port``."""
    from devtools.embedded_redis import find_redis_server

    script = _redis_shell(service).replace("$$", "$").replace("redis-server ", f"{shlex.quote(find_redis_server())} ")
    script = script.replace("--dir /data", f"--dir {data}").replace("/data/sentinel.conf", f"{data}/sentinel.conf")
    if service.startswith("sentinel"):
        script = script.replace("port 26379", f"port {port}\\nbind 127.0.0.1")
        script = script.replace("sentinel monitor agent %s 6379", f"sentinel monitor agent %s {primary_port}")
        script = script.replace(
            "sentinel announce-ip %s\\n", "sentinel announce-ip %s\\nsentinel announce-port " + str(port) + "\\n"
        )
        return script
    return script.replace(" <<<", f" --port {port} --bind 127.0.0.1 --appendonly no --save '' <<<")


def _start(script: str, env: dict[str, str], port: int, ready=lambda client: client.ping()) -> subprocess.Popen:
    proc = subprocess.Popen(["bash", "-c", script], env={"PATH": os.environ["PATH"], **env}, start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            ready(redis.Redis(port=port, socket_connect_timeout=0.2))
        except redis.AuthenticationError:
            return proc  # up, and refusing anonymous clients
        except redis.ConnectionError:
            time.sleep(0.05)
        else:
            return proc
    os.killpg(proc.pid, 15)
    raise AssertionError(f"compose's command did not start: {script[:80]}")


PASSWORDS = {
    "REDIS_PASSWORD": "pw-1",
    "REDIS_CONTROL_PASSWORD": "ctl-pass-2",
    "REDIS_REPLICA_PASSWORD": "repl-3",
    "REDIS_SENTINEL_PASSWORD": "sent-4",
}


def _run_compose_redis(env: dict[str, str], service: str = "redis-1", primary_port: int | None = None):
    """Run compose's Redis command line with this machine's redis-server on a free port."""
    from devtools.ports import free_port

    port = free_port()
    env = {"REDIS_ANNOUNCE": "127.0.0.1", **env}
    script = _compose_script(service, env, tempfile.mkdtemp(), port)
    if primary_port:
        env["REDIS_REPLICAOF"] = "127.0.0.1"
        script = script.replace("--replicaof $REDIS_REPLICAOF 6379", f"--replicaof $REDIS_REPLICAOF {primary_port}")
    return _start(script, env, port), port


def _stop(*procs: subprocess.Popen) -> None:
    for proc in procs:
        os.killpg(proc.pid, 15)
    for proc in procs:
        proc.wait(10)


def test_compose_redis_command_really_enforces_the_acl():
    proc, port = _run_compose_redis(PASSWORDS)
    try:
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port).get("x")
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=port, username="worker", password="wrong").ping()
        worker = redis.Redis(port=port, username="worker", password="pw-1")
        assert worker.acl_whoami() == "worker"
        worker.lpush("tools", "x")
        for command in (("CONFIG", "SET", "dir", "/tmp"), ("FLUSHALL",), ("ACL", "LIST"), ("MODULE", "LIST")):
            with pytest.raises(redis.ResponseError, match="no permissions"):
                worker.execute_command(*command)
        assert redis.Redis(port=port, username="control", password="ctl-pass-2").acl_whoami() == "control"
        # the replication and Sentinel users can do their job and nothing else
        for user, password in (("replica", "repl-3"), ("sentinel", "sent-4")):
            with pytest.raises(redis.ResponseError, match="no permissions"):
                redis.Redis(port=port, username=user, password=password).get("tools")
        assert redis.Redis(port=port, username="sentinel", password="sent-4").execute_command("ROLE")[0] == b"master"
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert not any(pw in ps for pw in PASSWORDS.values())  # not in any process's command line
    finally:
        _stop(proc)


def test_compose_replica_and_sentinel_commands_replicate_and_watch_with_their_own_users():
    """redis-2's command replicates from redis-1's as the `replica` user; a Sentinel's command
    watches the primary as the `sentinel` user, finds the replica, and asks a password of its own."""
    from devtools.ports import free_port

    primary, p1 = _run_compose_redis(PASSWORDS)
    replica, p2 = _run_compose_redis(PASSWORDS, "redis-2", primary_port=p1)
    sport = free_port()
    senv = {"SENTINEL_ANNOUNCE": "127.0.0.1", "REDIS_PRIMARY": "127.0.0.1", "SENTINEL_PASSWORD": "sentinels-5"}
    senv["REDIS_SENTINEL_PASSWORD"] = "sent-4"
    data = tempfile.mkdtemp()
    sentinel = _start(_compose_script("sentinel-1", senv, data, sport, primary_port=p1), senv, sport)
    try:
        redis.Redis(port=p1, username="worker", password="pw-1").set("k", "v")
        worker2 = redis.Redis(port=p2, username="worker", password="pw-1")
        deadline = time.monotonic() + 20
        while worker2.get("k") != b"v" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert worker2.get("k") == b"v" and worker2.info("replication")["master_link_status"] == "up"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=sport).execute_command("SENTINEL", "MASTERS")
        s = redis.Redis(port=sport, password="sentinels-5", decode_responses=True)
        while time.monotonic() < deadline:
            master = s.execute_command("SENTINEL", "MASTER", "agent")
            info = dict(zip(master[::2], master[1::2])) if isinstance(master, list) else master
            replicas = s.execute_command("SENTINEL", "REPLICAS", "agent")
            if info["flags"] == "master" and replicas:
                break
            time.sleep(0.2)
        assert info["flags"] == "master" and int(info["num-slaves"]) == 1, info  # logged in, replica found
        assert oct(os.stat(f"{data}/sentinel.conf").st_mode & 0o777) == "0o600"
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "sentinels-5" not in ps and "sent-4" not in ps
    finally:
        _stop(sentinel, replica, primary)


def test_only_the_services_that_need_redis_join_the_backend_network():
    compose = _compose()
    services = compose["services"]
    assert compose["networks"]["backend"]["internal"] is True and compose["networks"]["store"]["internal"] is True
    redis_side = {"redis-1", "redis-2", "sentinel-1", "sentinel-2", "sentinel-3"}
    for name in redis_side:  # a fixed address on backend alone (compose.yaml says why)
        assert list(services[name]["networks"]) == ["backend"], name
        assert services[name]["networks"]["backend"]["ipv4_address"].startswith("${REDIS_NETWORK_PREFIX:-10.89.240}.")
        assert services[name]["mac_address"].startswith("02:00:"), name
    on_backend = {n for n, s in services.items() if "backend" in s.get("networks", [])}
    assert on_backend == redis_side | {"beat", "flower", "api"} | {n for n in services if n.startswith("worker-")}
    assert "gateway" not in on_backend
    assert {n for n, s in services.items() if "store" in s.get("networks", [])} == {"objectstore", "worker-tools"}
    for name, svc in services.items():
        assert svc.get("networks"), f"{name} must name its networks (no flat default network)"


def test_the_model_key_only_reaches_the_services_that_call_the_model():
    services = _compose()["services"]
    with_key = {n for n, s in services.items() if "OPENAI_API_KEY" in (s.get("environment") or {})}
    assert with_key == {"worker-turns", "worker-background", "worker-workflow"}


def test_the_object_store_and_snapshot_keys_only_reach_the_tools_workers():
    services = _compose()["services"]
    with_store_key = {n for n, s in services.items() if "AWS_SECRET_ACCESS_KEY" in (s.get("environment") or {})}
    assert with_store_key == {"objectstore", "worker-tools"}
    env = services["worker-tools"]["environment"]
    assert env["AGENT_SNAPSHOT_KEY"].startswith("${AGENT_SNAPSHOT_KEY:?")  # required, never a default
    assert (
        env["AGENT_SNAPSHOT_STORE"] == "s3://homes/snapshots"
        and env["AGENT_SNAPSHOT_ENDPOINT_URL"] == "http://objectstore:8333"
    )
    assert _opt(services["objectstore"]["command"], "--bucket") == "homes"
    assert {n for n, s in services.items() if "AGENT_SNAPSHOT_KEY" in (s.get("environment") or {})} == {"worker-tools"}
    assert "objectstore-data:/objectstore" in services["objectstore"]["volumes"]


def test_nothing_is_published_but_the_operator_uis_on_localhost():
    services = _compose()["services"]
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    # Flower, metrics and traces (issue 12), the HTTP control plane (issue 22; tokens on every route)
    # the control plane runs in compose (the API, and its CLI in the api container): no Redis port
    assert set(published) == {"flower", "prometheus", "phoenix", "api"}
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


# The syscalls bubblewrap makes to build the sandbox (bubblewrap's bubblewrap.c).
BWRAP_SYSCALLS = {"clone", "clone3", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "prctl"}
# What the profile must keep refusing: host-wide kernel state a command has no business with.
REFUSED_SYSCALLS = {"init_module", "finit_module", "kexec_load", "bpf", "perf_event_open", "ptrace", "keyctl",
                    "open_by_handle_at", "reboot", "swapon", "settimeofday", "userfaultfd", "io_uring_setup"}  # fmt: skip


# What the tools worker is granted to run the per-agent limits (docs/deployment.md "The tools
# worker's grants"; each measured: without it a limit or the sandbox fails).
# SETPCAP: a command's bounding set emptied (without it the command kept the others; the sandbox's
# probe refuses that now: worker/tools/computer/privileges.py).
TOOLS_CAPABILITIES = {
    "SYS_ADMIN",
    "MKNOD",
    "SETUID",
    "SETGID",
    "SETPCAP",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "NET_ADMIN",
}


def test_the_tools_worker_runs_the_per_agent_limits_with_its_measured_grants_only():
    services = _compose()["services"]
    tools = services["worker-tools"]
    opts = tools["security_opt"]
    assert opts == ["no-new-privileges:true", "seccomp=deploy/seccomp-bwrap.json", "apparmor=unconfined"]
    assert tools["user"] == "root" and not tools.get("privileged")
    assert tools["cap_drop"] == ["ALL"] and set(tools["cap_add"]) == TOOLS_CAPABILITIES
    assert tools["devices"] == ["/dev/loop-control:/dev/loop-control"]
    assert tools["device_cgroup_rules"] == ["b 7:* rwm"]  # loop devices, nothing else
    assert tools["command"][0] == "agent-tools-node"  # loop nodes, the cgroup, its own homes; then exec
    # the limits are on: nothing turns them off (issue 30: "off" is never the production default)
    env = tools["environment"]
    assert "AGENT_COMMAND_MEMORY_CGROUP" not in env and "AGENT_COMMAND_SECCOMP" not in env
    assert env["AGENT_HOME_QUOTA_MB"] == "${AGENT_HOME_QUOTA_MB:-1024}"
    for name, svc in services.items():
        if name != "worker-tools":
            grants = ("seccomp=", "apparmor=", "systempaths=", "unmask=", "${")
            assert not any(o.startswith(grants) for o in svc.get("security_opt", [])), name
            assert not svc.get("cap_add") and not svc.get("devices") and svc.get("user") in (None,), name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert svc.get("cap_drop") == ["ALL"] and not svc.get("privileged"), name
    profile = json.loads((ROOT / "deploy" / "seccomp-bwrap.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert not denied & BWRAP_SYSCALLS
    assert REFUSED_SYSCALLS <= denied
    assert all(not rule.get("args") for rule in profile["syscalls"])  # no flag filter on clone/unshare
    entry = (ROOT / "deploy" / "tools-node").read_text()
    assert "mknod" in entry and "remount,bind,rw" in entry and "flock -n 9" in entry and 'exec "$@"' in entry
    assert "COPY deploy/tools-node /usr/local/bin/agent-tools-node" in (ROOT / "Dockerfile").read_text()


def test_each_tools_replica_is_a_node_with_its_own_homes():
    """deploy/tools-node gives each replica the first free /homes/node-<n>, held by an flock for the
    worker's life: two replicas never share a homes root (docs/placement.md "Nodes")."""
    entry = (ROOT / "deploy" / "tools-node").read_text()
    slots = entry[entry.index("n=1") : entry.index('exec "$@"')]
    with tempfile.TemporaryDirectory() as homes:
        script = slots.replace("/homes", homes) + 'echo "$AGENT_HOMES_ROOT"; exec sleep 30'
        first = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
        second = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
        try:
            roots = {first.stdout.readline().strip(): first, second.stdout.readline().strip(): second}
            assert set(roots) == {f"{homes}/node-1", f"{homes}/node-2"}
            holder = roots[f"{homes}/node-1"]  # either may have started first
            holder.kill()
            holder.wait()
            third = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True)
            assert third.stdout.readline().strip() == f"{homes}/node-1"  # a dead replica's slot is taken again
            third.kill()
            third.wait()
        finally:
            for proc in (first, second):
                proc.kill()
                proc.wait()


def test_images_run_as_an_unprivileged_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "\nUSER agent" in dockerfile
    for name, user in (("redis", "redis"), ("prometheus", "prometheus"), ("phoenix", "phoenix")):
        assert f"\nUSER {user}\n" in (ROOT / "deploy" / "images" / f"{name}.Dockerfile").read_text()


def test_every_image_is_built_here_on_a_base_given_as_a_build_argument():
    """No registry is needed beyond the base (docs/deployment.md): every service's image is built
    from this repository, on BASE_IMAGE (the project's on trixie, RUNTIME_BASE_IMAGE: a Python with
    the tarfile fixes; the others on bookworm); the host's CA bundle only ever as a build secret."""
    from devtools.podman import IMAGES, RUNTIME_SUITE

    for name, svc in _compose()["services"].items():
        assert svc["image"].startswith("localhost/agent-"), name
        build = svc["build"]
        suite = IMAGES[svc["image"]][2]
        given = (
            "${RUNTIME_BASE_IMAGE:-debian:trixie-slim}"
            if suite == RUNTIME_SUITE
            else "${BASE_IMAGE:-debian:bookworm-slim}"
        )
        assert build["args"]["BASE_IMAGE"] == given, name
        assert (svc["image"] == "localhost/agent-runtime:latest") == (suite == RUNTIME_SUITE), name
        dockerfile = ROOT / build["context"] / build.get("dockerfile", "Dockerfile")
        text = dockerfile.read_text()
        assert f"ARG BASE_IMAGE=debian:{suite}-slim\nFROM ${{BASE_IMAGE}}\n" in text, dockerfile
        if suite == RUNTIME_SUITE:  # a Python without the tarfile fixes fails the build
            assert "os.path.ALLOW_MISSING" in text and "exit 1" in text, dockerfile
        copies = [line for line in text.splitlines() if line.startswith(("COPY", "ADD"))]
        assert not any("ssl" in line or "cert" in line or ".crt" in line for line in copies), dockerfile
        if "pip install" in text:
            assert "--mount=type=secret,id=ca_bundle" in text, dockerfile
    assert {s["image"] for s in _compose()["services"].values()} == set(IMAGES)


def test_redis_data_and_the_homes_are_directories_the_operator_chooses():
    """Redis's disk is not the homes' (issue 19): both are host directories compose requires."""
    services = _compose()["services"]
    for server in ("redis-1", "redis-2"):
        (data,) = services[server]["volumes"]
        assert data.startswith("${REDIS_DATA_DIR:?") and data.endswith(f"}}/{server}:/data"), data
        assert "--dir /data" in _redis_shell(server)
    mounts = {n for n, s in services.items() if any(v.endswith(":/homes") for v in s.get("volumes", []))}
    assert mounts == {"worker-tools"}  # the only service that touches agents' homes
    assert services["worker-tools"]["volumes"][0].startswith("${AGENT_HOMES_DIR:?")


def test_every_service_gets_its_signals_and_a_grace_for_its_work():
    """Issue 29: no shell as PID 1 (an init passes signals on; a shell execs its program), and
    a stop grace that covers what a stopping service must finish, so a planned stop never SIGKILLs."""
    from devtools.deploy_stack import stop_graces, stop_phase
    from worker.settings import Settings

    services = _compose()["services"]
    for name, svc in services.items():
        assert svc.get("init") is True, name
        cmd = svc["command"]
        if cmd[0] in ("sh", "bash"):
            # its last command is an exec: the shell becomes the program
            assert cmd[1] == "-c" and cmd[2].rsplit(";", 1)[-1].lstrip().startswith("exec "), name
    graces = stop_graces()
    settings = Settings()
    assert graces["worker-tools"] >= settings.tool_time_limit + 30  # its commands finish, then snapshots
    for name in ("worker-turns", "worker-background", "worker-workflow"):
        assert graces[name] >= settings.model_timeout + 90, name  # drained model calls run to their end
    assert graces["redis-1"] >= 30 and graces["objectstore"] >= 25
    order = sorted(services, key=stop_phase)
    assert order[-2:] in (["redis-1", "redis-2"], ["redis-2", "redis-1"])
    assert max(order.index(s) for s in ("worker-tools", "beat", "api")) < min(
        order.index(f"sentinel-{i}") for i in (1, 2, 3)
    )


def _wait_http(url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer")


def test_flower_requires_auth_on_every_route_including_metrics():
    from devtools.ports import free_port

    port = free_port()
    env = {**os.environ, "FLOWER_BASIC_AUTH": "ops:s3cret-flower"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tasks.flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_http(f"{base}/healthcheck")
        good = {"Authorization": "Basic " + base64.b64encode(b"ops:s3cret-flower").decode()}
        bad = {"Authorization": "Basic " + base64.b64encode(b"ops:wrong").decode()}
        for path in ("/metrics", "/healthcheck", "/", "/workers", "/tasks", "/broker", "/api/workers", "/api/tasks"):
            assert httpx.get(base + path, timeout=10).status_code == 401, path
            assert httpx.get(base + path, headers=bad, timeout=10).status_code == 401, path
        metrics = httpx.get(f"{base}/metrics", headers=good, timeout=10)
        assert metrics.status_code == 200 and "flower_" in metrics.text
        assert httpx.get(f"{base}/healthcheck", headers=good, timeout=10).status_code == 200
    finally:
        proc.terminate()
        proc.wait(20)


def test_flower_refuses_to_start_without_credentials():
    env = {k: v for k, v in os.environ.items() if k != "FLOWER_BASIC_AUTH"}
    out = subprocess.run([sys.executable, "-m", "tasks.flower"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode != 0 and "FLOWER_BASIC_AUTH" in out.stderr


def test_celery_settings_follow_the_reliability_rules():
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    from worker.settings import get_settings

    # a task still running past the visibility timeout is delivered again, in parallel
    assert conf.broker_transport_options["visibility_timeout"] >= 4 * get_settings().tool_time_limit
    assert conf.task_serializer == "orjson" and "pickle" not in conf.accept_content
    assert conf.worker_send_task_events and conf.task_send_sent_event


def test_every_service_has_a_health_check():
    for name, svc in _compose()["services"].items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert "REDIS_PASSWORD" not in str(svc["healthcheck"]["test"]).replace("$$", ""), name


def test_prometheus_scrapes_every_worker_service_on_its_metrics_port():
    compose = _compose()
    services = compose["services"]
    workers = {n for n, s in services.items() if "worker" in _program(s.get("command", []))[:4]}
    assert workers and {services[n]["environment"]["AGENT_METRICS_PORT"] for n in workers} == {"9808"}
    assert compose["networks"]["ops"]["internal"] is True
    assert all("ops" in services[n]["networks"] for n in workers | {"prometheus", "phoenix"})
    assert {services[n]["environment"]["AGENT_METRICS_ADDR"] for n in workers} == {"0.0.0.0"}
    (mount,) = [v for v in services["prometheus"]["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "agent-workers"]
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == workers and sd["port"] == 9808


def test_workers_send_traces_to_the_trace_ui():
    services = _compose()["services"]
    for name in ("worker-turns", "worker-tools", "worker-background", "worker-workflow"):
        env = services[name]["environment"]
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"].endswith("phoenix:6006}") and "otlp" in env["OTEL_TRACES_EXPORTER"]
    assert services["phoenix"]["command"] == ["phoenix", "serve"]
    assert "arize-phoenix" in (ROOT / "deploy" / "images" / "phoenix.Dockerfile").read_text()


def test_model_queues_on_an_io_pool_tools_on_prefork_and_every_service_restarts():
    """Issues 11 and 20: a step waiting on the model must not hold a process (an in-process pool,
    whose steps hand their model calls to the event loop: nothing sets AGENT_MODEL_CALLS=inline);
    issue 34: that pool is solo, the steps on the consumer's own thread;
    tools keep prefork; whatever exits (a Redis restart it did not survive) is restarted."""
    services = _compose()["services"]
    for queue in ("turns", "background", "workflow"):
        cmd = services[f"worker-{queue}"]["command"]
        assert _opt(cmd, "--pool") == "solo" and "-c" not in cmd, cmd
        assert services[f"worker-{queue}"].get("environment", {}).get("AGENT_MODEL_CALLS", "async") == "async"
        assert "--without-gossip" in cmd and "--without-mingle" in cmd
    tools = services["worker-tools"]["command"]
    assert _opt(tools, "--pool") == "prefork" and "--without-gossip" in tools
    assert _opt(services["beat"]["command"], "-S") == "tasks.beat:ResilientRedBeatScheduler"
    for name, svc in services.items():
        assert svc.get("restart") == "unless-stopped", name
