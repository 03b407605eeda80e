"""``worker.turn.toolbox.agent_home``: an agent's home is made once and kept per process, and what
is kept is bounded (a long-lived worker sees every agent of its deployment)."""

from __future__ import annotations

from worker.settings import Settings
from worker.turn import toolbox
from worker.turn.toolbox import agent_home, home_path


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


def test_a_model_steps_home_is_named_not_made(tmp_path):
    """``home_path`` (a model step's context) is where ``agent_home`` makes the home, and makes nothing."""
    settings = Settings(homes_root=tmp_path / "homes")
    named = home_path(settings, "a-x")
    assert not named.exists() and not (tmp_path / "homes").exists()
    assert agent_home(settings, "a-x") == named and named.is_dir()
