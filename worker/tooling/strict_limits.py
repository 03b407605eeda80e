"""OpenAI strict mode's size limits, checked at definition on the strict copy (``to_strict_schema``).

A strict schema over a limit is refused by the API for every request that lists the tool, so the
definition is refused instead, naming the limit, the figure and its source; ``submit_result``
then falls back to ``strict=False`` with the reason in the task's ``strict_note``.

Source of every limit: OpenAI's Structured Outputs guide, "Supported schemas", the section on
objects' nesting depth and size (https://platform.openai.com/docs/guides/structured-outputs#supported-schemas),
the limits that apply to a function's ``parameters`` under ``strict: true``:

| rule | limit | counted as | report |
|---|---|---|---|
| L1 | at most 5,000 object properties in all | every entry of every ``properties`` (``$defs`` counted once) | the guide |
| L2 | at most 10 levels of nesting | objects on the longest path from the root (the root is level 1), through ``items``, ``anyOf`` and ``$ref`` | "6 levels of nesting exceeds limit of 5" (tidyverse/ellmer issue 671, an earlier limit); openai/openai-java issue 732 (the guide says 10) |
| L3 | at most 120,000 characters of names | property names, ``$defs`` names, ``enum`` and ``const`` string values, summed | the guide |
| L4 | at most 1,000 ``enum`` values in all | every value of every ``enum`` | "Expected at most 500 enum values in total within a single schema" (an earlier limit, community.openai.com thread 974416) |
| L5 | an ``enum`` of more than 250 string values: at most 15,000 characters of values | that enum's values | the guide |
"""

from __future__ import annotations

from typing import Any

from worker.tooling.errors import ToolDefinitionError
from worker.tooling.wire import field_name, pointer

MAX_PROPERTIES = 5_000
MAX_DEPTH = 10
MAX_NAME_CHARS = 120_000
MAX_ENUM_VALUES = 1_000
LARGE_ENUM = 250
MAX_LARGE_ENUM_CHARS = 15_000
SOURCE = "OpenAI Structured Outputs, supported schemas"


class _Tally:
    def __init__(self, root: dict[str, Any], tool: str):
        self.root, self.tool = root, tool
        self.properties = self.names = self.enums = 0

    def fail(self, path: tuple[Any, ...], what: str, rule: str) -> ToolDefinitionError:
        return ToolDefinitionError(
            f"tool {self.tool!r} cannot be strict: field {field_name(path)!r} (schema path {pointer(path)}) {what}; "
            f"OpenAI strict mode allows {rule} ({SOURCE}), so the API would refuse every request listing this "
            "tool. Make the schema smaller or flatter, or define the tool with strict=False"
        )

    def count(self, node: Any, path: tuple[Any, ...]) -> None:
        """L1, L3-L5 over every node once (``$ref`` not followed)."""
        stack = [(node, path)]
        while stack:
            cur, where = stack.pop()
            if not isinstance(cur, dict):
                continue
            props = cur.get("properties")
            if isinstance(props, dict):
                self.properties += len(props)
                self.names += sum(len(k) for k in props)
                stack.extend((v, where + ("properties", k)) for k, v in props.items())
            for key in ("$defs", "definitions"):
                if isinstance(cur.get(key), dict):
                    self.names += sum(len(k) for k in cur[key])
                    stack.extend((v, where + (key, k)) for k, v in cur[key].items())
            if isinstance(cur.get("const"), str):
                self.names += len(cur["const"])
            if isinstance(cur.get("enum"), list):
                self.enum(cur["enum"], where)
            if isinstance(cur.get("items"), dict):
                stack.append((cur["items"], where + ("items",)))
            for key in ("anyOf", "allOf"):
                if isinstance(cur.get(key), list):
                    stack.extend((v, where + (key, i)) for i, v in enumerate(cur[key]))
        if self.properties > MAX_PROPERTIES:
            raise self.fail((), f"has {self.properties} object properties in all", f"at most {MAX_PROPERTIES} (L1)")
        if self.names > MAX_NAME_CHARS:
            raise self.fail(
                (), f"has {self.names} characters of property names and enum values", f"at most {MAX_NAME_CHARS} (L3)"
            )
        if self.enums > MAX_ENUM_VALUES:
            raise self.fail((), f"has {self.enums} enum values in all", f"at most {MAX_ENUM_VALUES} (L4)")

    def enum(self, values: list[Any], where: tuple[Any, ...]) -> None:
        self.enums += len(values)
        chars = sum(len(v) for v in values if isinstance(v, str))
        self.names += chars
        if len(values) > LARGE_ENUM and chars > MAX_LARGE_ENUM_CHARS:
            raise self.fail(
                where,
                f"has an enum of {len(values)} values totalling {chars} characters",
                f"at most {MAX_LARGE_ENUM_CHARS} characters in an enum of more than {LARGE_ENUM} values (L5)",
            )

    def depth(self, node: Any, path: tuple[Any, ...], level: int, refs: tuple[str, ...]) -> None:
        """L2: objects on each path, through ``$ref`` (a ref already on the path ends it: recursion
        is allowed, its depth is the model's to choose)."""
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            if ref in refs:
                return
            node, refs = self.resolve(ref), refs + (ref,)
            if not isinstance(node, dict):
                return
        if node.get("type") == "object" or "properties" in node:
            level += 1
            if level > MAX_DEPTH:
                raise self.fail(path, f"is nested {level} objects deep", f"at most {MAX_DEPTH} levels of nesting (L2)")
        for name, sub in (node.get("properties") or {}).items():
            self.depth(sub, path + ("properties", name), level, refs)
        if isinstance(node.get("items"), dict):
            self.depth(node["items"], path + ("items",), level, refs)
        for key in ("anyOf", "allOf"):
            for i, sub in enumerate(node.get(key) or []):
                self.depth(sub, path + (key, i), level, refs)

    def resolve(self, ref: str) -> Any:
        target: Any = self.root
        for part in ref[2:].split("/") if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            target = target.get(part) if isinstance(target, dict) else None
        return target


def check_strict_limits(schema: dict[str, Any], tool_name: str) -> None:
    """Raise ``ToolDefinitionError`` when the strict copy ``schema`` is over one of OpenAI's
    documented limits (L1-L5 in the module docstring), naming the limit, the figure, the field
    for L2 and L5, and the source."""
    tally = _Tally(schema, tool_name)
    tally.count(schema, ())
    tally.depth(schema, (), 0, ())
