"""compose.yaml describes a deployment made only of commands and images this project provides,
safe by default (issues 9 and 18): Redis with passwords on an internal network (published on
loopback for the control plane only), the model key only where the model is called, the tools
worker's grants and no others, Flower on localhost with auth on every route, nothing else
published. `make deploy-check` runs it for real (devtools/deploy_check.py)."""

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

ROOT = Path(__file__).resolve().parent.parent


def _compose():
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def _opt(cmd, flag):
    return cmd[cmd.index(flag) + 1]


def test_every_service_command_is_provided_by_the_project():
    services = _compose()["services"]
    served = set()
    for name, svc in services.items():
        if svc["image"] != "localhost/agent-runtime:latest":  # Redis, Prometheus, Phoenix: their own tests
            continue
        cmd = svc["command"]
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
        elif cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, f"{name}: no module {cmd[2]}"
            scripts = ROOT / _opt(cmd, "--scripts")
            assert any(scripts.glob("*.json")), f"{name}: no scripts in {scripts}"
        else:
            raise AssertionError(f"{name}: unknown command {cmd}")
    assert served == set(QUEUES), "every queue needs a worker service"


def _redis_shell() -> str:
    cmd = _compose()["services"]["redis"]["command"]
    assert cmd[:2] == ["sh", "-c"]
    return cmd[2]


def test_redis_keeps_data_and_never_evicts():
    args = shlex.split(_redis_shell().split("| redis-server -", 1)[1])
    assert _opt(args, "--maxmemory-policy") == "noeviction"
    assert _opt(args, "--appendonly") == "yes"


def test_redis_requires_a_password_from_the_environment():
    services = _compose()["services"]
    assert services["redis"]["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    assert services["redis"]["environment"]["REDIS_CONTROL_PASSWORD"].startswith("${REDIS_CONTROL_PASSWORD:?")
    # default: locked by a random per-start password (not off: Redis 7.0 replays the AOF as default)
    assert "user default on >%s" in _redis_shell() and "/dev/urandom" in _redis_shell()
    assert "requirepass" not in _redis_shell()
    for name, svc in services.items():
        url = (svc.get("environment") or {}).get("REDIS_URL")
        if url is not None:
            assert url.startswith("redis://worker:${REDIS_PASSWORD:?"), name


def _run_compose_redis(env: dict[str, str]) -> tuple[subprocess.Popen, int]:
    """Run compose's Redis command line with this machine's redis-server on a free port."""
    from devtools.embedded_redis import find_redis_server
    from devtools.ports import free_port

    port = free_port()
    script = _redis_shell().replace("$$", "$").replace("| redis-server -", f"| {shlex.quote(find_redis_server())} -")
    script = script.replace("--dir /data", f"--dir {tempfile.mkdtemp()}")
    script += f" --port {port} --bind 127.0.0.1 --appendonly no --save ''"
    proc = subprocess.Popen(["sh", "-c", script], env={"PATH": os.environ["PATH"], **env}, start_new_session=True)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            redis.Redis(port=port, socket_connect_timeout=0.2).ping()
        except redis.AuthenticationError:
            return proc, port  # up, and refusing anonymous clients
        except redis.ConnectionError:
            time.sleep(0.05)
    os.killpg(proc.pid, 15)
    raise AssertionError("compose's Redis command did not start")


@pytest.mark.parametrize("control_password", ["ctl-pass-2"])
def test_compose_redis_command_really_enforces_the_acl(control_password):
    proc, port = _run_compose_redis({"REDIS_PASSWORD": "pw-1", "REDIS_CONTROL_PASSWORD": control_password})
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
        if control_password:
            assert redis.Redis(port=port, username="control", password=control_password).acl_whoami() == "control"
        else:
            with pytest.raises(redis.AuthenticationError):
                redis.Redis(port=port, username="control", password="").ping()
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert "pw-1" not in ps  # not in any process's command line
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(10)


def test_only_the_services_that_need_redis_join_the_backend_network():
    compose = _compose()
    services = compose["services"]
    assert compose["networks"]["backend"]["internal"] is True
    assert services["redis"]["networks"] == ["backend", "control"]
    # `control` carries Redis's published port and nothing else
    assert {n for n, s in services.items() if "control" in s.get("networks", [])} == {"redis"}
    on_backend = {n for n, s in services.items() if "backend" in s.get("networks", [])}
    assert on_backend == {"redis", "beat", "flower", "api"} | {n for n in services if n.startswith("worker-")}
    assert "gateway" not in on_backend
    for name, svc in services.items():
        assert svc.get("networks"), f"{name} must name its networks (no flat default network)"


def test_the_model_key_only_reaches_the_services_that_call_the_model():
    services = _compose()["services"]
    with_key = {n for n, s in services.items() if "OPENAI_API_KEY" in (s.get("environment") or {})}
    assert with_key == {"worker-turns", "worker-background", "worker-workflow"}


def test_nothing_is_published_but_the_operator_uis_on_localhost():
    services = _compose()["services"]
    published = {n: s["ports"] for n, s in services.items() if s.get("ports")}
    # Flower, metrics and traces (issue 12), Redis for the control plane outside compose (issue 18),
    # the HTTP control plane (issue 22; tokens on every route)
    assert set(published) == {"flower", "prometheus", "phoenix", "redis", "api"}
    assert all(p.startswith("127.0.0.1:") for ports in published.values() for p in ports)
    assert published["redis"] == ["127.0.0.1:${REDIS_HOST_PORT:-6380}:6379"]
    assert services["flower"]["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


# The syscalls bubblewrap makes to build the sandbox (bubblewrap's bubblewrap.c).
BWRAP_SYSCALLS = {"clone", "clone3", "unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "prctl"}
# What the profile must keep refusing: host-wide kernel state a command has no business with.
REFUSED_SYSCALLS = {"init_module", "finit_module", "kexec_load", "bpf", "perf_event_open", "ptrace", "keyctl",
                    "open_by_handle_at", "reboot", "swapon", "settimeofday", "userfaultfd", "io_uring_setup"}  # fmt: skip


def test_the_tools_worker_runs_the_sandbox_under_the_shipped_seccomp_profile():
    services = _compose()["services"]
    opts = services["worker-tools"]["security_opt"]
    assert "seccomp=deploy/seccomp-bwrap.json" in opts and "apparmor=unconfined" in opts
    # the only other grant: /proc unmasked (podman: unmask=/proc/*; Docker can only lift every mask)
    assert "${AGENT_TOOLS_PROC_OPT:-systempaths=unconfined}" in opts and len(opts) == 4
    for name, svc in services.items():
        if name != "worker-tools":
            grants = ("seccomp=", "apparmor=", "systempaths=", "unmask=", "${")
            assert not any(o.startswith(grants) for o in svc.get("security_opt", [])), name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert svc.get("cap_drop") == ["ALL"] and not svc.get("cap_add") and not svc.get("privileged"), name
    profile = json.loads((ROOT / "deploy" / "seccomp-bwrap.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    denied = {n for rule in profile["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert not denied & BWRAP_SYSCALLS
    assert REFUSED_SYSCALLS <= denied
    assert all(not rule.get("args") for rule in profile["syscalls"])  # no flag filter on clone/unshare


def test_images_run_as_an_unprivileged_user():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "\nUSER agent" in dockerfile
    for name, user in (("redis", "redis"), ("prometheus", "prometheus"), ("phoenix", "phoenix")):
        assert f"\nUSER {user}\n" in (ROOT / "deploy" / "images" / f"{name}.Dockerfile").read_text()


def test_every_image_is_built_here_on_a_base_given_as_a_build_argument():
    """No registry is needed beyond the base (docs/deployment.md): every service's image is built
    from this repository, on BASE_IMAGE; the host's CA bundle only ever as a build secret."""
    for name, svc in _compose()["services"].items():
        assert svc["image"].startswith("localhost/agent-"), name
        build = svc["build"]
        assert build["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-debian:bookworm-slim}", name
        dockerfile = ROOT / build["context"] / build.get("dockerfile", "Dockerfile")
        text = dockerfile.read_text()
        assert "ARG BASE_IMAGE=debian:bookworm-slim\nFROM ${BASE_IMAGE}\n" in text, dockerfile
        copies = [line for line in text.splitlines() if line.startswith(("COPY", "ADD"))]
        assert not any("ssl" in line or "cert" in line or ".crt" in line for line in copies), dockerfile
        if "pip install" in text:
            assert "--mount=type=secret,id=ca_bundle" in text, dockerfile
    from devtools.podman import IMAGES

    assert {s["image"] for s in _compose()["services"].values()} == set(IMAGES)


def test_redis_data_and_the_homes_are_directories_the_operator_chooses():
    """Redis's disk is not the homes' (issue 19): both are host directories compose requires."""
    services = _compose()["services"]
    (data,) = services["redis"]["volumes"]
    assert data.startswith("${REDIS_DATA_DIR:?") and data.endswith(":/data")
    for name, svc in services.items():
        if name.startswith("worker-"):
            assert [v for v in svc["volumes"] if v.endswith(":/homes")] == [svc["volumes"][0]], name
            assert svc["volumes"][0].startswith("${AGENT_HOMES_DIR:?"), name
    assert "--dir /data" in _redis_shell()


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
    workers = {n for n, s in services.items() if "worker" in s.get("command", [])[:4]}
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
    tools keep prefork; whatever exits (a Redis restart it did not survive) is restarted."""
    services = _compose()["services"]
    for queue in ("turns", "background", "workflow"):
        cmd = services[f"worker-{queue}"]["command"]
        assert _opt(cmd, "--pool") == "threads" and int(_opt(cmd, "-c")) >= 16, cmd
        assert services[f"worker-{queue}"].get("environment", {}).get("AGENT_MODEL_CALLS", "async") == "async"
        assert "--without-gossip" in cmd and "--without-mingle" in cmd
    tools = services["worker-tools"]["command"]
    assert _opt(tools, "--pool") == "prefork" and "--without-gossip" in tools
    assert _opt(services["beat"]["command"], "-S") == "tasks.beat:ResilientRedBeatScheduler"
    for name, svc in services.items():
        assert svc.get("restart") == "unless-stopped", name
