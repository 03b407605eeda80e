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
        if name == "redis":
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
            if sub == "flower":
                assert any(a.startswith("--basic-auth=${FLOWER_BASIC_AUTH") for a in cmd), "Flower must use basic auth"
        elif cmd[:2] == ["python", "-m"]:
            assert importlib.util.find_spec(cmd[2]) is not None, f"{name}: no module {cmd[2]}"
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
