"""``bench/message_floor.py`` runs both sides to the end and cleans up after itself."""

from __future__ import annotations

import re

import pytest

from tests.support.runs import run_bench


@pytest.mark.slow
def test_a_round_finishes_every_turn_of_both_sides_and_leaves_no_folder(tmp_path):
    """One round of 5 turns: the runtime's turns and the floor's null turns (three empty messages on
    the runtime's own app) all finish, each side reports its worker CPU, and the workers' logs, the
    agents' homes and the embedded Redis's folder are gone when the run ends."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = run_bench("message_floor.py", ["--turns", "5", "--rounds", "1"], tmp)
    assert run.returncode == 0, run.stdout + run.stderr
    rows = re.findall(r"^\s+1 (floor|runtime)\s+[\d.]+\s+(\d+)\s+(\d+)\s+[\d.]+\s+[\d.]+\s+([\d.]+)$", run.stdout, re.M)
    assert sorted(r[0] for r in rows) == ["floor", "runtime"], run.stdout
    assert all(unfinished == "0" and float(total) > 0 for _, unfinished, _, total in rows), run.stdout
    commands = {who: int(cmds) for who, _, cmds, _ in rows}
    assert commands["floor"] < commands["runtime"], run.stdout  # the floor has no turn store
    assert "runtime less floor: median" in run.stdout, run.stdout
    assert sorted(p.name for p in tmp.iterdir()) == [], run.stdout
