"""``worker.turn.toolbox.agent_home``: an agent's home is made once and kept per process, and what
is kept is bounded (a long-lived worker sees every agent of its deployment)."""

from __future__ import annotations

from worker.settings import Settings
from worker.turn import toolbox
from worker.turn.toolbox import agent_home


def test_homes_are_made_once_and_at_most_homes_max_kept(tmp_path):
    settings = Settings(homes_root=tmp_path)
    first = agent_home(settings, "a-0")
    assert first == (tmp_path / "a-0").resolve() and first.is_dir()
    assert agent_home(settings, "a-0") is first  # kept: no realpath, no mkdir
    for i in range(1, toolbox._HOMES_MAX + 10):
        assert agent_home(settings, f"a-{i}").is_dir()
    assert len(toolbox._HOMES) == toolbox._HOMES_MAX
    again = agent_home(settings, "a-0")  # the oldest went; made again, the same directory
    assert again == first and again is not first
