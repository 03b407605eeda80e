"""compose.yaml describes a deployment made only of commands this project provides."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
        if "image" in svc:  # third-party services (Redis, Prometheus, Jaeger): checked below
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
                assert _opt(cmd, "-S") == "redbeat.RedBeatScheduler"
                assert importlib.util.find_spec("redbeat") is not None
        elif cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, f"{name}: no module {cmd[2]}"
            if "--scripts" in cmd:
                scripts = ROOT / _opt(cmd, "--scripts")
                assert any(scripts.glob("*.json")), f"{name}: no scripts in {scripts}"
        else:
            raise AssertionError(f"{name}: unknown command {cmd}")
    assert served == set(QUEUES), "every queue needs a worker service"


def test_redis_keeps_data_and_never_evicts():
    cmd = _compose()["services"]["redis"]["command"]
    assert _opt(cmd, "--maxmemory-policy") == "noeviction"
    assert _opt(cmd, "--appendonly") == "yes"


def test_celery_settings_follow_the_reliability_rules():
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.worker_prefetch_multiplier == 1
    from worker.settings import get_settings

    # a task still running past the visibility timeout is delivered again, in parallel
    assert conf.broker_transport_options["visibility_timeout"] >= 4 * get_settings().tool_time_limit
    assert conf.task_serializer == "orjson" and "pickle" not in conf.accept_content
    assert conf.worker_send_task_events and conf.task_send_sent_event


def test_flower_password_comes_from_the_environment_not_the_command_line():
    flower = _compose()["services"]["flower"]
    assert flower["command"][:3] == ["python", "-m", "tasks.flower"]
    assert not any("auth" in a for a in flower["command"]), "ps would show the password"
    assert flower["environment"]["FLOWER_BASIC_AUTH"].startswith("${FLOWER_BASIC_AUTH:?")


def test_every_service_has_a_health_check():
    for name, svc in _compose()["services"].items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no health check"


def test_prometheus_scrapes_every_worker_service_on_its_metrics_port():
    services = _compose()["services"]
    workers = {n for n, s in services.items() if "worker" in s.get("command", [])[:4]}
    assert workers
    ports = {services[n]["environment"]["AGENT_METRICS_PORT"] for n in workers}
    (mount,) = [v for v in services["prometheus"]["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "agent-workers"]
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == workers and {str(sd["port"])} == ports


def test_workers_send_traces_to_the_jaeger_service():
    services = _compose()["services"]
    env = services["worker-turns"]["environment"]
    assert "jaeger:4318" in env["OTEL_EXPORTER_OTLP_ENDPOINT"] and "otlp" in env["OTEL_TRACES_EXPORTER"]
    assert services["jaeger"]["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
