"""The control-plane CLI's input handling: a malformed REDIS_URL, an empty message, input items
from a file, and toolsets it cannot run (exit 2 with one line, nothing enqueued); the control
plane's own refusal of a toolset nobody declared."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.support.scripts import msg

CLI = [sys.executable, "-m", "control.cli"]


def _cli(*args: str, env: dict | None = None, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        input=stdin,
        timeout=60,
    )


@pytest.mark.parametrize("url", ["redis://127.0.0.1:notaport/0", "http://127.0.0.1/0"])
def test_a_malformed_redis_url_is_exit_2_with_one_line(url):
    for var in ("REDIS_URL", "CONTROL_REDIS_URL"):
        env = {"REDIS_URL": url, "CONTROL_REDIS_URL": url if var == "CONTROL_REDIS_URL" else ""}
        run = _cli("status", "some-turn", env=env)
        assert run.returncode == 2
        assert run.stderr.count("\n") == 1 and f"{var} " in run.stderr and "is not a Redis URL" in run.stderr, (
            run.stderr
        )
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("text", ["", "   \n"])
def test_an_empty_message_is_refused(text):
    run = _cli("enqueue", text)
    assert run.returncode == 2 and run.stderr.strip() == "error: the message is empty"


def test_a_toolset_the_cli_cannot_run_is_refused():
    run = _cli("enqueue", "hello", "--toolset", "workflow_task")
    assert run.returncode == 2 and "cannot run from this command" in run.stderr
    assert "workflow_task" not in _cli("enqueue", "--help").stdout


def test_the_control_plane_refuses_an_unknown_toolset(control):
    from control.client import ControlPlaneError

    with pytest.raises(ControlPlaneError, match="unknown toolset 'nope'"):
        control.enqueue({"input": "x", "toolset": "nope"})


def test_input_items_from_a_file_or_stdin(control, gateway, script_name, tmp_path):
    gateway.add_script(script_name, [{"output": [msg("got it")]}])
    items = [
        {"type": "message", "role": "user", "content": "first part"},
        {"type": "message", "role": "user", "content": "second part"},
    ]
    path = tmp_path / "items.json"
    path.write_text(json.dumps(items))
    for args, stdin in ((["--input-file", str(path)], None), (["--input-file", "-"], json.dumps(items))):
        run = _cli("enqueue", *args, "--model", script_name, "--toolset", "testing", "--wait", stdin=stdin)
        assert run.returncode == 0, run.stdout + run.stderr
        turn_id = run.stdout.split("turn ", 1)[1].split()[0]
        assert control.items(turn_id)[:2] == items
        assert "got it" in run.stdout


@pytest.mark.parametrize("content", ["not json", "{}", "[]", "[1, 2]"])
def test_a_bad_input_file_is_exit_2(tmp_path, content):
    path = tmp_path / "items.json"
    path.write_text(content)
    run = _cli("enqueue", "--input-file", str(path))
    assert run.returncode == 2 and run.stderr.startswith("error:")


def test_a_message_and_an_input_file_together_are_refused(tmp_path):
    run = _cli("enqueue", "hello", "--input-file", str(tmp_path / "x.json"))
    assert run.returncode == 2
