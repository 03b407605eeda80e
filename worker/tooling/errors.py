"""The tool runtime's definition error (at the bottom of ``worker.tooling``: every module may raise it)."""

from worker.errors import AgentRuntimeError


class ToolDefinitionError(AgentRuntimeError, ValueError):
    """A tool definition the runtime cannot offer to a model.

    Raised at definition time (``define_worker_tool``), naming the tool and,
    where it applies, the schema field and the rule that was broken.
    """
