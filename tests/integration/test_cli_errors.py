"""Every CLI gives one-line errors with exit 2 (issue 18): ``agent-runtime``, ``python -m
control.workflow_cli`` (with ``start`` and help on each subcommand), ``make run``'s stack with a
bad ``REDIS_URL``, and ``make redis`` keeps its data across a restart (exits 0 when stopped, 1 when
its server dies). Real processes against the session's Redis and its solo worker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from devtools.ports import free_port
from tests.conftest import ROOT
from tests.support.scripts import fc

UNREACHABLE = "redis://worker:pw@127.0.0.1:1/0"
SCHEMA = json.dumps(
    {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}
)


def _run(module: str, *args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line_error(run: subprocess.CompletedProcess, *needles: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stdout, run.stderr)
    assert run.stderr.startswith("error:") and run.stderr.count("\n") == 1, run.stderr
    assert "Traceback" not in run.stderr + run.stdout
    for needle in needles:
        assert needle in run.stderr, run.stderr


def _wf(*args: str, env: dict[str, str] | None = None, timeout: float = 120):
    return _run("control.workflow_cli", *args, env=env, timeout=timeout)


def test_workflow_cli_help_on_every_subcommand():
    top = _wf("--help")
    assert top.returncode == 0
    for sub in ("start", "show", "list", "wait", "retry", "cancel", "brain-add"):
        assert sub in top.stdout
        run = _wf(sub, "--help")
        assert run.returncode == 0 and "Usage:" in run.stdout, sub
    assert "--schema" in _wf("start", "--help").stdout


def test_workflow_cli_errors_are_one_line_with_exit_2(control, gateway, script_name):
    _one_line_error(_wf("show", "wf_nope"), "unknown workflow task 'wf_nope'")
    _one_line_error(_wf("cancel", "wf_nope"), "unknown workflow task")
    _one_line_error(_wf("show", "wf_x", env={"REDIS_URL": UNREACHABLE, "CONTROL_REDIS_URL": ""}), "cannot reach Redis")
    _one_line_error(_wf("list", env={"CONTROL_REDIS_URL": "http://nope"}), "CONTROL_REDIS_URL", "is not a Redis URL")
    start = ("start", "--title", "t", "--instructions", "do it")
    _one_line_error(_wf(*start, "--schema", "{not json"), "--schema is not JSON")
    _one_line_error(_wf(*start, "--schema", "[1]"), "--schema must be a JSON object")
    _one_line_error(_wf(*start, "--schema", "@/nonexistent/schema.json"), "cannot read the result schema")
    _one_line_error(_wf(*start, "--schema", '{"type": "nonsense"}'), "result_schema is not a valid JSON Schema")
    _one_line_error(_wf("start", "--title", "t", "--schema", SCHEMA), "--instructions")
    _one_line_error(_wf("brain-add", "--title", "t"), "--file or --text")

    # a finished task: started, succeeded, then cancelled or retried
    gateway.add_script(script_name, [{"output": [fc("submit_result", {"result": {"n": 7}})]}])
    done = _wf(*start, "--schema", SCHEMA, "--model", script_name, "--wait", "--timeout", "90")
    assert done.returncode == 0, done.stdout + done.stderr
    task = json.loads(done.stdout)
    assert task["status"] == "succeeded" and task["result"] == {"n": 7}
    _one_line_error(_wf("cancel", task["task_id"]), "already succeeded")
    _one_line_error(_wf("retry", task["task_id"]), "is succeeded")
    waited = _wf("wait", task["task_id"])
    assert waited.returncode == 0 and json.loads(waited.stdout)["status"] == "succeeded"


def test_agent_runtime_errors_are_one_line_with_exit_2(control):
    def art(*args: str, env: dict[str, str] | None = None):
        return _run("control.cli", *args, env=env)

    for args in (("status", "no-such-turn"), ("items", "no-such-turn"), ("cancel", "no-such-turn")):
        _one_line_error(art(*args), "no-such-turn")
    _one_line_error(art("status", "t1", env={"REDIS_URL": UNREACHABLE, "CONTROL_REDIS_URL": ""}), "cannot reach Redis")
    _one_line_error(art("approve", "no-such-turn", "call_1", "--by", "me"))
    _one_line_error(art("approve", "t", "c", "--params", "{oops"), "--params is not JSON")
    run = art("enqueue", "hi", "--approval", "sometimes")
    assert run.returncode == 2 and "approval.mode" in run.stderr and run.stderr.count("\n") == 1, run.stderr


def test_make_run_reports_a_bad_redis_url_in_one_line():
    for url, needle in (
        (UNREACHABLE, "REDIS_URL: cannot reach Redis at redis://worker:***@127.0.0.1:1/0"),
        ("redis://127.0.0.1:port/0", "REDIS_URL 'redis://127.0.0.1:port/0' is not a Redis URL"),
    ):
        run = _run("devtools.devstack", "--demo", "demo", env={"REDIS_URL": url})
        errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]  # on stderr
        assert run.returncode == 1 and len(errors) == 1 and needle in errors[0], run.stdout + run.stderr
        assert "Traceback" not in run.stdout + run.stderr and "pw@" not in run.stdout + run.stderr
        assert len((run.stdout + run.stderr).splitlines()) <= 3, run.stdout + run.stderr


def _env_file_url(path: Path) -> str:
    line = next(x for x in path.read_text().splitlines() if x.startswith("export REDIS_URL="))
    return line.split("=", 1)[1].strip("'")


def _start_redis(args: tuple[str, ...], env_file: Path) -> subprocess.Popen:
    """``python -m devtools.embedded_redis *args`` (what ``make redis`` runs), its output piped;
    returns once ``env_file`` exists (or after 30 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.embedded_redis", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 30
    while not env_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    return proc


def test_make_redis_keeps_its_data_across_a_restart(tmp_path):
    data, env_file, port = tmp_path / "data", tmp_path / "redis.env", free_port()
    args = ("--port", str(port), "--data-dir", str(data), "--env-file", str(env_file))
    urls = []
    for round_ in range(2):
        proc = _start_redis(args, env_file)
        try:
            url = _env_file_url(env_file)
            urls.append(url)
            client = redis.Redis.from_url(url)
            if round_ == 0:
                client.set("turn:kept", "yes")
            else:
                assert client.get("turn:kept") == b"yes"
            client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            out = proc.communicate(timeout=30)[0]
        assert proc.returncode == 0, out  # a stop, not a failure: make prints no Error
        assert str(data) in out and "append-only" in out
        assert not env_file.exists()  # removed on exit: the passwords do not outlive the server
    assert urls[0] != urls[1]  # fresh passwords each start
    assert any(data.rglob("*.aof")) or any(data.rglob("appendonly*"))


def test_make_redis_exits_1_when_its_server_dies(tmp_path):
    """A redis-server that exits on its own is a failure (make prints Error 1), not a stop."""
    env_file = tmp_path / "redis.env"
    args = ("--port", str(free_port()), "--data-dir", str(tmp_path / "data"), "--env-file", str(env_file))
    proc = _start_redis(args, env_file)
    try:
        (server,) = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        os.kill(int(server), signal.SIGKILL)
        out = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, out
    assert "error: redis-server exited (code -9)" in out, out
    assert not env_file.exists()


@pytest.mark.parametrize("sub", ["status", "wait", "items", "transcript", "cancel", "approve", "enqueue"])
def test_agent_runtime_help_on_every_subcommand(sub):
    run = _run("control.cli", sub, "--help")
    assert run.returncode == 0 and "Usage:" in run.stdout
