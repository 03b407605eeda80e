"""The public API for tool authors: everything a tool, a category creator or a toolset of one's
own imports, from one module (docs/writing-a-tool.md).

What ``__all__`` names here is the API: its names and signatures change only with a note in the
docs; everything else under ``worker/`` is the runtime's own and may change. An embedder (a
service that starts turns and decides approvals from Python) imports from ``control.client``
instead (docs/control-plane.md, "The Python client").

- defining a tool: ``define_worker_tool`` (keyword arguments, checked at definition:
  ``ToolDefinitionError``), or ``function_tool`` for a plain typed Python function; a tool is a
  ``WorkerTool``;
- running it: ``execute(params, ctx: ToolContext) -> ToolResult`` (``PresentationEvent`` for a
  user-facing surface); ``ctx.abort`` is an ``AbortSignal`` whose ``raise_if_aborted`` raises
  ``TurnAborted``; ``ctx.services`` is the turn's ``ToolServices``;
- files in the agent's home: ``HomeDir``, race-free (refuses ``..``, absolute paths outside,
  symlinks out, special and hard-linked files);
- a category creator takes the turn's ``TurnContext`` (``TurnSupports``: what the request allows;
  ``Settings``) and returns its tools; a toolset of one's own may add the built-in catalog,
  ``text_turn_tools``;
- testing a tool: ``validate_tool_arguments(tool, raw_arguments)`` gives an ``ArgumentsOutcome``
  (validated ``params``, or the error the model would read), as the runtime does before ``execute``;
- errors: every public error derives from ``AgentRuntimeError``.
"""

from __future__ import annotations

from worker.errors import AgentRuntimeError
from worker.settings import Settings
from worker.tooling.arguments import ArgumentsOutcome, validate_tool_arguments
from worker.tooling.contract import (
    AbortSignal,
    PresentationEvent,
    ToolContext,
    ToolResult,
    ToolServices,
    TurnAborted,
    WorkerTool,
    define_worker_tool,
)
from worker.tooling.errors import ToolDefinitionError
from worker.tooling.function_tools import function_tool
from worker.tools.assembly import text_turn_tools
from worker.tools.computer.home_fs import HomeDir
from worker.turn.context import TurnContext
from worker.turn.request import TurnSupports

__all__ = [
    "AbortSignal",
    "AgentRuntimeError",
    "ArgumentsOutcome",
    "HomeDir",
    "PresentationEvent",
    "Settings",
    "ToolContext",
    "ToolDefinitionError",
    "ToolResult",
    "ToolServices",
    "TurnAborted",
    "TurnContext",
    "TurnSupports",
    "WorkerTool",
    "define_worker_tool",
    "function_tool",
    "text_turn_tools",
    "validate_tool_arguments",
]
