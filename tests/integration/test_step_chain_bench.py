"""``bench/step_chain.py`` cleans up after itself: a run leaves nothing in the temporary folder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_a_run_leaves_no_folder_behind(tmp_path):
    """One short round of each side (1 turn x 2 steps): the agents' homes of the runtime's round
    (``bench-homes-*``, one per round before), the workers' logs (``bench-p1-*``) and the embedded
    Redis's folder are all gone when the run ends; the run still reports its ratio."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT)}
    for name in ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_BASE_URL", "AGENT_HOMES_ROOT", "AGENT_EXTRA_TOOLSETS"):
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "step_chain.py"), "--turns", "1", "--steps", "2", "--rounds", "1"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done 1/1" in run.stdout and "median of 1 rounds" in run.stdout, run.stdout
    assert sorted(p.name for p in tmp.iterdir()) == []
