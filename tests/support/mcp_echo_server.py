"""A tiny MCP server over stdio for the skill/mcporter tests.

Tools: ``echo(text) -> "echo: <text>"`` and ``add(a, b) -> a + b``.
Works with the ``mcp`` package 1.x (``FastMCP``) and 2.x (``MCPServer``).
Run: ``python tests/support/mcp_echo_server.py`` (speaks MCP on stdin/stdout).
"""

from __future__ import annotations

try:  # mcp >= 2
    from mcp.server.mcpserver import MCPServer as _Server
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as _Server

server = _Server("echo")


@server.tool()
def echo(text: str) -> str:
    """Return the text prefixed with 'echo: '."""
    return f"echo: {text}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


if __name__ == "__main__":
    server.run("stdio")
