"""``bench/step_chain.py`` cleans up after itself: a run leaves nothing in the temporary folder."""

from __future__ import annotations

import pytest

from tests.support.runs import run_bench


@pytest.mark.slow
def test_a_run_leaves_no_folder_behind(tmp_path):
    """One short round of each side (1 turn x 2 steps): the agents' homes of the runtime's round
    (``bench-homes-*``, one per round before), the workers' logs (``bench-p1-*``) and the embedded
    Redis's folder are all gone when the run ends; the run still reports its ratio."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = run_bench("step_chain.py", ["--turns", "1", "--steps", "2", "--rounds", "1"], tmp)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "done 1/1" in run.stdout and "median of 1 rounds" in run.stdout, run.stdout
    assert sorted(p.name for p in tmp.iterdir()) == []
