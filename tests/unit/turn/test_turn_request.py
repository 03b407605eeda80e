"""The turn request model and its published JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.turn.request import TurnRequest

ROOT = Path(__file__).resolve().parents[3]


def test_published_schema_is_current():
    published = json.loads((ROOT / "docs" / "turn-request.schema.json").read_text())
    assert published == TurnRequest.model_json_schema(), "run: agent-runtime schema > docs/turn-request.schema.json"


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"input": "x", "agent_id": "../../etc"}, "agent_id"),
        ({"input": "x", "max_model_calls": 0}, "max_model_calls"),
        ({"input": "x", "queue": "default"}, "queue"),
        ({"input": "x", "unknown": 1}, "unknown"),
        ({}, "input"),
    ],
)
def test_bad_requests_name_the_field(bad, field):
    with pytest.raises(ValidationError) as exc:
        TurnRequest.model_validate(bad)
    assert field in str(exc.value)


def test_worker_refuses_a_toolset_it_cannot_import():
    from worker.settings import Settings
    from worker.tools.toolsets import check_toolsets

    with pytest.raises(ValueError, match="AGENT_EXTRA_TOOLSETS: toolset 'mine' cannot be loaded"):
        check_toolsets(Settings(extra_toolsets="mine=no_such_module:tools"))
    with pytest.raises(ValueError, match="must look like 'name=package.module:function'"):
        check_toolsets(Settings(extra_toolsets="broken"))
    check_toolsets(Settings(extra_toolsets="testing=tests.support.toolsets:testing_tools"))


@pytest.mark.slow
def test_worker_process_exits_at_start_with_a_broken_toolset():
    import os
    import subprocess
    import sys

    env = {**os.environ, "AGENT_EXTRA_TOOLSETS": "mine=no_such_module:tools"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tasks.app",
            "worker",
            "-Q",
            "unused-queue",
            "--pool",
            "solo",
            "-l",
            "WARNING",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode != 0
    assert "worker not started: AGENT_EXTRA_TOOLSETS: toolset 'mine' cannot be loaded" in proc.stdout + proc.stderr
