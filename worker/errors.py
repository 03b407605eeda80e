"""The one root of the project's public errors: ``AgentRuntimeError``.

Every error the runtime raises to a tool author or an embedder derives from it, beside the
standard exception it always was (``ToolDefinitionError`` is still a ``ValueError``,
``GatewayError`` a ``RuntimeError``...), so ``except AgentRuntimeError`` catches what the project
raises and nothing it does not, and older ``except ValueError`` code keeps working. The public
errors are exported by ``worker.api`` (tool authors) and ``control.client`` (embedders);
``tests/unit/test_public_api.py`` holds every exported error to this root.

Errors that never leave the runtime (a fenced-out transition, the repair ladder's refusals) do not
derive from it: nobody outside catches them.
"""

from __future__ import annotations

__all__ = ["AgentRuntimeError"]


class AgentRuntimeError(Exception):
    """An error of the agent tools runtime (see the module docstring)."""
