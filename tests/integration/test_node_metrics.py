"""Each pool of a node exports its own metrics, on a configured address (issue 18, issue 19).

`make worker` (``python -m devtools.workers``) runs the node's two pools; with one
``AGENT_METRICS_PORT`` both used to bind it, the tools pool logged "Address already in use" and
``agent_tool_call_seconds`` never appeared. Real processes: the supervisor and its two Celery
workers, alone on a Redis database of their own, a turn through the scripted gateway.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from devtools.ports import free_port
from devtools.workers import pool_env
from tests.conftest import ROOT
from tests.support.scripts import fc, msg


def _listening(port: int) -> set[str]:
    """The local addresses (IPv4) listening on ``port``, from /proc/net/tcp."""
    found = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if state == "0A" and int(p, 16) == port:
            found.add(socket.inet_ntoa(bytes.fromhex(addr)[::-1]))
    return found


def _scrape(port: int) -> str:
    return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text


def test_each_pool_of_a_node_serves_its_own_metrics_on_loopback(redis_url, gateway, script_name, tmp_path):
    from control.client import ControlPlane

    url = redis_url.rsplit("/", 1)[0] + "/9"  # a database of its own: no other worker takes these tasks
    port = free_port(2)
    env = {**os.environ, "REDIS_URL": url, "AGENT_METRICS_PORT": str(port), "AGENT_TOOLS_CONCURRENCY": "1"}
    env.pop("AGENT_METRICS_ADDR", None)
    log = tmp_path / "node.log"
    with open(log, "w") as out:
        node = subprocess.Popen(
            [sys.executable, "-m", "devtools.workers"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert node.poll() is None, log.read_text()[-2000:]
            try:
                _scrape(port), _scrape(port + 1)
                break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            raise AssertionError(f"the pools' metrics did not come up: {log.read_text()[-2000:]}")
        gateway.add_script(script_name, [{"output": [fc("list_files", {"path": "."})]}, {"output": [msg("ok")]}])
        control = ControlPlane(url)
        turn = control.enqueue({"agent_id": "metrics-node", "input": "list", "model": script_name})
        assert control.wait(turn, timeout=60).status.value == "completed"
        io, tools = _scrape(port), _scrape(port + 1)
        assert "agent_model_call_seconds_count" in io and "agent_tool_call_seconds_count" not in io
        assert 'agent_tool_call_seconds_count{tool="list_files"} 1.0' in tools
        assert "agent_model_call_seconds_count" not in tools
        # unauthenticated, so loopback unless configured otherwise
        assert _listening(port) == {"127.0.0.1"} and _listening(port + 1) == {"127.0.0.1"}
        assert "Address already in use" not in log.read_text()
    finally:
        node.send_signal(signal.SIGTERM)
        node.wait(60)


def test_the_pools_ports_and_a_port_that_leaves_no_room_for_the_tools_pool():
    assert pool_env("worker-io", {"AGENT_METRICS_PORT": "9808"})["AGENT_METRICS_PORT"] == "9808"
    assert pool_env("worker-tools", {"AGENT_METRICS_PORT": "9808"})["AGENT_METRICS_PORT"] == "9809"
    assert "AGENT_METRICS_PORT" not in pool_env("worker-tools", {})
    assert "PROMETHEUS_MULTIPROC_DIR" not in pool_env("worker-tools", {"PROMETHEUS_MULTIPROC_DIR": "/tmp/x"})
    with pytest.raises(ValueError, match="AGENT_METRICS_PORT"):
        pool_env("worker-tools", {"AGENT_METRICS_PORT": "65535"})
    run = subprocess.run(
        [sys.executable, "-m", "devtools.workers"],
        cwd=ROOT,
        env={**os.environ, "REDIS_URL": "redis://127.0.0.1:1/0", "AGENT_METRICS_PORT": "nine"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode != 0 and run.stderr.strip() == "error: AGENT_METRICS_PORT must be a port number, not 'nine'"


def test_the_metrics_address_is_configured_and_checked(redis_url):
    from tasks.metrics import _state, start_metrics_server
    from worker.settings import Settings

    with pytest.raises(ValueError, match="metrics_addr"):
        Settings(metrics_addr="everywhere")
    port = free_port()
    start_metrics_server(port, "127.0.0.2")
    try:
        assert _listening(port) == {"127.0.0.2"}
        assert "python_info" in httpx.get(f"http://127.0.0.2:{port}/metrics", timeout=5).text
    finally:
        _state["server"].shutdown()
        _state["server"].server_close()
        _state["server"] = None
