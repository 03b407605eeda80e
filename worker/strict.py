"""OpenAI strict-mode conversion of a tool's parameters schema.

Placeholder: the full rule set (issue 3) replaces this module.
"""

from __future__ import annotations

import copy
from typing import Any

from worker.contract import ToolDefinitionError


def to_strict_schema(schema: dict[str, Any], *, tool_name: str) -> dict[str, Any]:
    """Return a strict-mode copy of ``schema``; raise ``ToolDefinitionError`` if impossible."""
    out = copy.deepcopy(schema)

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if node.get("type") == "object" or "properties" in node:
                ap = node.get("additionalProperties", False)
                if ap not in (False, None):
                    raise ToolDefinitionError(
                        f"tool {tool_name!r}: field {path or '<root>'} is an open object; "
                        "OpenAI strict mode requires additionalProperties: false on every object"
                    )
                node["additionalProperties"] = False
                props = node.get("properties", {})
                node["required"] = list(props)
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else k)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(out, "")
    return out
