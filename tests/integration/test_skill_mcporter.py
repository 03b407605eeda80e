"""Skills: instructions projection, mcporter config, and an MCP call through run_command + mcporter."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import orjson
import pytest

from tests.support.mcporter import ensure_mcporter, node_path_dirs
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer.catalog import create_computer_tools
from worker.tools.computer.confine import ConfinementError
from worker.tools.skills import skills_instructions, write_mcporter_config
from worker.turn.context import Skill, TurnContext

ECHO_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_echo_server.py"


def test_instructions_projection():
    assert skills_instructions([]) == ""
    text = skills_instructions(
        [
            Skill(name="release-notes", description="Write release notes.", instructions="Use the changelog."),
            Skill(name="echo-skill", description="Echo things back.", mcp_server="echo"),
        ]
    )
    assert "## release-notes" in text and "Write release notes." in text and "Use the changelog." in text
    assert "## echo-skill" in text
    assert "mcporter call echo.<tool> key=value" in text
    assert "mcporter list echo --schema" in text
    assert "run_command" in text and "config/mcporter.json" in text
    # A plain skill mentions no MCP server.
    assert "mcporter" not in skills_instructions([Skill(name="s", description="d")])


def test_config_file_shape_and_mode(tmp_path):
    path = write_mcporter_config(tmp_path, {"echo": {"command": "python3", "args": ["server.py"]}})
    assert path == (tmp_path / "config" / "mcporter.json").resolve()
    data = orjson.loads(path.read_bytes())
    assert data == {"mcpServers": {"echo": {"command": "python3", "args": ["server.py"]}}, "imports": []}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="must match"):
        write_mcporter_config(tmp_path, {"bad.name": {"command": "x"}})
    with pytest.raises(ValueError, match="needs a 'command'"):
        write_mcporter_config(tmp_path, {"empty": {}})


def test_config_refuses_symlinked_config_dir(tmp_path):
    home, outside = tmp_path / "home", tmp_path / "outside"
    home.mkdir()
    outside.mkdir()
    (home / "config").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfinementError):
        write_mcporter_config(home, {"echo": {"command": "x"}})
    assert not (outside / "mcporter.json").exists()


def test_mcp_skill_called_through_run_command(tmp_path, monkeypatch):
    ensure_mcporter()
    # Commands run in the sandbox: what they may run comes from AGENT_COMMAND_EXTRA_PATH (bound
    # read-only: mcporter's node_modules, the venv for the MCP server's python), as `make run` sets it.
    dirs = [str(d) for d in node_path_dirs()] + [str(Path(sys.executable).parent)]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-visible-to-mcp")
    home = tmp_path / "agent-home"
    home.mkdir()
    # The server script lives in the agent's home: the project's tests/ is not mounted in a sandbox.
    server = home / "mcp_echo_server.py"
    server.write_bytes(ECHO_SERVER.read_bytes())
    write_mcporter_config(home, {"echo": {"command": sys.executable, "args": [str(server.resolve())]}})
    ctx = TurnContext(
        turn_id="t",
        agent_id="a",
        home=home,
        settings=Settings(command_timeout=120, command_extra_path=os.pathsep.join(dirs), homes_root=tmp_path),
        skills=(Skill(name="echo", description="Echo", mcp_server="echo"),),
    )
    assert "mcporter call echo." in skills_instructions(ctx.skills)
    run = {t.name: t for t in create_computer_tools(ctx)}["run_command"]
    tctx = ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal())

    r = run.execute(run.input_model(command="mcporter call echo.echo text='hello from the agent'"), tctx)
    assert not r.is_error, r.content
    assert "echo: hello from the agent" in r.content
    assert r.details["exit_code"] == 0

    r = run.execute(run.input_model(command="mcporter call echo.add a=2 b=40"), tctx)
    assert r.details["exit_code"] == 0, r.content
    assert "42" in r.content
