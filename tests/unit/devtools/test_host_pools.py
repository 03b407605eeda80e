"""``devtools.host`` builds a machine's worker pools from its ``host.env``: ``AGENT_IO_POOL``,
``AGENT_IO_CONCURRENCY`` and ``AGENT_TOOLS_CONCURRENCY`` set there win over the environment the
host was started with (under systemd that environment holds none of host.env, and the pools used
to be built from it alone: a setting in host.env was ignored). A pool setting it refuses is one
``error:`` line, exit 1 (docs/deployment.md, "What each machine's environment holds")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devtools import host
from tests.support.runs import run_python

POOL_SETTINGS = ("AGENT_IO_POOL", "AGENT_IO_CONCURRENCY", "AGENT_TOOLS_CONCURRENCY", "AGENT_MODEL_CALLS")


@pytest.fixture(autouse=True)
def _no_pool_settings(monkeypatch):
    for name in POOL_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def _host_env(tmp_path: Path, **settings: str) -> dict[str, str]:
    """A worker machine's host.env, its data under ``tmp_path``."""
    return {
        "AGENT_HOST_NAME": "m1",
        "AGENT_HOST_ADDRESS": "127.0.0.1",
        "AGENT_HOST_ROLES": "worker",
        "AGENT_HOST_DIR": str(tmp_path),
        "REDIS_URL": "redis://127.0.0.1:1/0",
        **settings,
    }


def _pool(argv: list[str]) -> tuple[str, str | None]:
    return argv[argv.index("--pool") + 1], argv[argv.index("-c") + 1] if "-c" in argv else None


def test_the_pools_follow_host_env(tmp_path):
    env = _host_env(tmp_path, AGENT_IO_POOL="threads", AGENT_IO_CONCURRENCY="8", AGENT_TOOLS_CONCURRENCY="3")
    procs = host.commands(tmp_path, env)
    assert _pool(procs["worker-io"][0]) == ("threads", "8")
    assert _pool(procs["worker-tools"][0]) == ("prefork", "3")


def test_host_env_wins_over_the_process_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_IO_POOL", "threads")  # not in host.env: the process's is used
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", "4")
    monkeypatch.setenv("AGENT_TOOLS_CONCURRENCY", "7")
    procs = host.commands(tmp_path, _host_env(tmp_path, AGENT_IO_CONCURRENCY="16", AGENT_TOOLS_CONCURRENCY="2"))
    assert _pool(procs["worker-io"][0]) == ("threads", "16")
    assert _pool(procs["worker-tools"][0]) == ("prefork", "2")
    procs = host.commands(tmp_path, _host_env(tmp_path, AGENT_IO_POOL="solo"))
    assert _pool(procs["worker-io"][0]) == ("solo", None)
    assert _pool(procs["worker-tools"][0]) == ("prefork", "7")


@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"AGENT_TOOLS_CONCURRENCY": "0"}, "AGENT_TOOLS_CONCURRENCY must be a whole number of processes"),
        ({"AGENT_IO_POOL": "prefork"}, "AGENT_IO_POOL must be solo or threads, not 'prefork'"),
        ({"AGENT_IO_POOL": "threads", "AGENT_IO_CONCURRENCY": "x"}, "AGENT_IO_CONCURRENCY must be a whole number"),
    ],
)
def test_a_pool_setting_in_host_env_is_refused(tmp_path, setting, needle):
    with pytest.raises(host.HostError, match=needle):
        host.commands(tmp_path, _host_env(tmp_path, **setting))


@pytest.mark.slow
@pytest.mark.parametrize("size", ["0", "four"])
def test_host_refuses_a_malformed_tools_concurrency_in_one_line(tmp_path, size):
    """``python -m devtools.host``: one ``error:`` line, exit 1, nothing started."""
    config = tmp_path / "config"
    config.mkdir()
    lines = [f"{k}={v}" for k, v in _host_env(tmp_path, AGENT_TOOLS_CONCURRENCY=size).items()]
    (config / "host.env").write_text("\n".join(lines) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in POOL_SETTINGS}
    run = run_python(["-m", "devtools.host", "--config", str(config)], env)
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert (
        out.strip() == f"error: AGENT_TOOLS_CONCURRENCY must be a whole number of processes, at least 1, not {size!r}"
    )


def test_inline_model_calls_reach_the_io_pool_they_are_checked_for(tmp_path):
    """``AGENT_MODEL_CALLS`` in host.env is what the I/O pool runs with, the same value
    ``devtools.host`` checked against its pool (a threads pool: inline calls hold a thread each)."""
    procs = host.commands(tmp_path, _host_env(tmp_path, AGENT_IO_POOL="threads", AGENT_MODEL_CALLS="inline"))
    assert procs["worker-io"][1]["AGENT_MODEL_CALLS"] == "inline"
    assert "AGENT_MODEL_CALLS" not in procs["worker-tools"][1]
