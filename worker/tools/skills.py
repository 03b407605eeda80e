"""Skills: projecting enabled skills into a turn's instructions, and the agent's mcporter config.

The agent's enabled skills are projected into the turn's instructions, and an
MCP-backed skill is reached through the computer command tool, not through a
tool of its own: there is no MCP tool in the tool set (one tool set for every
agent, and the command sandbox already confines what mcporter does). The
instructions tell the model to run ``mcporter call <server>.<tool>
key=value ...`` with ``run_command``, and ``write_mcporter_config`` puts the
servers where mcporter finds them.

mcporter facts (README of mcporter 0.9, checked against the CLI):

- config lookup: ``--config <path>``, else ``$MCPORTER_CONFIG``, else
  ``<cwd>/config/mcporter.json``, else ``~/.mcporter/mcporter.json``;
  ``run_command`` runs in the agent home, so ``<home>/config/mcporter.json``
  is found without flags;
- shape: ``{"mcpServers": {name: {"command", "args", "env", "cwd"} or
  {"baseUrl", "headers"}}, "imports": [...]}``; ``"imports": []`` turns off
  merging of editor configs (Cursor, Claude, Codex...);
- calls: ``mcporter call server.tool key=value`` (also ``key:value``, or
  ``--args '<json object>'``); ``mcporter list server --schema`` shows tools
  and parameters.

mcporter itself must be on the command ``PATH`` (see
``worker.tools.computer.launch.command_env``): put its ``node_modules/.bin`` in
``AGENT_COMMAND_EXTRA_PATH``, which the command sandbox mounts read-only; an
MCP server runs inside the same sandbox as the command (its files must be in
the home or a mounted directory; no network unless the turn allows egress).
The worker does not use ``npx`` at run time, which would download an unpinned package.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Sequence

import orjson

from worker.settings import Settings, get_settings
from worker.tools.computer import homes
from worker.tools.computer.home_fs import HomeDir
from worker.turn.request import Skill

MCPORTER_CONFIG = "config/mcporter.json"
SERVER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # no dots: the selector is <server>.<tool>


def skills_instructions(skills: Sequence[Skill], *, mcporter: str = "mcporter") -> str:
    """The instructions block for the enabled ``skills`` (``""`` when there are none).

    Each skill contributes its name, description and instructions; an
    MCP-backed skill (``Skill.mcp_server``) also gets how to list and call its
    server's tools through ``run_command``. ``mcporter`` is the command name
    to show (e.g. an absolute path when it is not on ``PATH``).
    """
    if not skills:
        return ""
    parts = ["# Skills", "These skills are enabled for you. When a task matches a skill, follow its instructions."]
    mcp_servers = []
    for skill in skills:
        block = [f"## {skill.name}", skill.description.strip()]
        if skill.instructions.strip():
            block.append(skill.instructions.strip())
        if skill.mcp_server:
            server = skill.mcp_server
            mcp_servers.append(server)
            block.append(
                f"This skill's tools live on the MCP server `{server}`. Call them with the run_command tool:\n"
                f"- list its tools and their parameters: `{mcporter} list {server} --schema`\n"
                f"- call a tool: `{mcporter} call {server}.<tool> key=value other=value` "
                f"(quote values with spaces: `text='hello world'`; for nested values use "
                f"`--args '{{\"key\": [1, 2]}}'`)"
            )
        parts.append("\n\n".join(block))
    if mcp_servers:
        parts.append(
            "MCP servers are configured in config/mcporter.json in your home directory (the working "
            "directory of run_command); do not edit that file."
        )
    return "\n\n".join(parts)


def write_mcporter_config(
    home: Path | str, servers: dict[str, dict[str, Any]], settings: Settings | None = None
) -> Path:
    """Write the agent's mcporter config to ``<home>/config/mcporter.json`` and return its path.

    ``servers`` maps a server name (``^[A-Za-z0-9_-]{1,64}$``: no dots, as
    the call selector is ``server.tool``) to an mcporter entry: a stdio server
    ``{"command": str, "args": [str], "env": {str: str}, "cwd": str}`` or an
    HTTP server ``{"baseUrl": str, "headers": {...}}``. Editor imports are
    turned off (``"imports": []``) so only these servers exist for the agent.
    Commands run without the worker's environment: put the values a server
    needs in its ``env``. The file is written atomically with mode 0600 (it
    may hold tokens), by descriptors from the home (``home_fs``: race-free). Raises ``ValueError`` for a bad name or entry and
    ``worker.tools.computer.confine.ConfinementError`` if ``config/`` escapes the home, and
    ``homes.HomeUnavailable`` when the home cannot be made ready (``settings``: default the process's).
    """
    for name, entry in servers.items():
        if not SERVER_NAME.match(name):
            raise ValueError(f"mcporter server name {name!r} must match {SERVER_NAME.pattern}")
        if not isinstance(entry, dict) or not (entry.get("command") or entry.get("baseUrl") or entry.get("url")):
            raise ValueError(f"mcporter server {name!r} needs a 'command' (stdio) or a 'baseUrl' (HTTP)")
    data = orjson.dumps({"mcpServers": servers, "imports": []}, option=orjson.OPT_INDENT_2)
    # The home made ready as for a tool call (its quota mounted), the file the agent's: mode 0600
    # must not keep the agent's own commands from reading it.
    agent_home = homes.provision(settings or get_settings(), Path(home))
    with agent_home.as_owner(), HomeDir(home) as hd:
        rel = hd.write_atomic(MCPORTER_CONFIG, data, mode=0o600)
        return Path(hd.root) / rel
