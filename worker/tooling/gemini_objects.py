"""Gemini's object nodes in a wire copy, at every nesting level (``worker.tooling.wire_profiles``).

Gemini's Schema requires ``type`` on every node and refuses an ``OBJECT`` without properties
("properties: should be non-empty for OBJECT type"); JSON Schema allows both (a node with
``properties`` is an object whatever its ``type``; ``{"type": "object"}`` is any object). Two rules:

| rule | the wire copy | source |
|---|---|---|
| G12 | a node with no ``type`` (nor ``anyOf``) names the type its keywords imply: ``properties`` or ``required``: ``object``; ``items``: ``array``; an ``enum`` of strings (a ``const`` made one by G2): ``string`` | "properties[data].properties: only allowed for OBJECT type" (anomalyco/opencode issue 13148, PR 13150; ComposioHQ/composio issue 4022; router-for-me/CLIProxyAPI PR 1941); "schema didn't specify the schema type field" (QuantumNous/new-api PR 3170) |
| G10 | an object below the root without named properties (a free-form value such as a JsonLogic query, or a map whose value schema G4 moved into the description) is sent as a string that holds the object as JSON text, its description saying so | "parameters.properties[query].properties: should be non-empty for OBJECT type" (MarkusPfundstein/mcp-obsidian issue 21, browser-use/browser-use issue 3786, vercel/ai PR 11319) |

Gemini has no schema for "any object", so G10's copy is the form that keeps the meaning: the tool's
own schema still types the field as an object, validation runs against it, and the object rung
``decoded_field`` (``worker.tooling.object_rungs``) decodes the JSON text back into the object the
tool receives (recorded as ``decoded_field:<field>``); a model that sends the object itself (under
``any``, another provider) passes as it is. The root keeps its own rule (G10 in
``worker.tooling.wire_profiles``: declared without ``parameters`` under ``gemini``).
"""

from __future__ import annotations

import json
from typing import Any

from worker.tooling.wire import with_note

JSON_TEXT_NOTE = 'a JSON object written as a JSON string, e.g. "{\\"key\\": \\"value\\"}"'
_KEPT = ("title", "nullable")


def implied_type(node: dict[str, Any]) -> None:
    """G12: the type ``node``'s keywords imply, written out (nothing when they imply none)."""
    if "type" in node or "anyOf" in node:
        return
    if "properties" in node or "required" in node:
        node["type"] = "object"
    elif isinstance(node.get("items"), dict):
        node["type"] = "array"
    elif isinstance(node.get("enum"), list) and node["enum"] and all(isinstance(v, str) for v in node["enum"]):
        node["type"] = "string"


def is_free_form(node: Any) -> bool:
    """An object schema with no named properties (after G4 dropped ``additionalProperties``)."""
    return isinstance(node, dict) and node.get("type") == "object" and not node.get("properties")


def as_json_text(node: dict[str, Any]) -> None:
    """G10 below the root: ``node`` (a free-form object) becomes a string holding the object as JSON
    text, in place; its other constraints (``minProperties``, ``required``...) and ``default`` or
    ``example`` move into the description, which validation against the tool's own schema still holds."""
    notes = [JSON_TEXT_NOTE]
    for key in sorted(k for k in node if k not in _KEPT and k not in ("type", "properties", "description")):
        if node[key] != []:  # P4's empty required says nothing
            notes.append(f"{key}={_short(node[key])}")
    kept = {k: node[k] for k in _KEPT if k in node}
    description = with_note(node.get("description"), ", ".join(notes))
    node.clear()
    node.update({"type": "string", **kept, "description": description})


def nested_objects(node: dict[str, Any], path: tuple[Any, ...]) -> None:
    """G10 on ``node`` (not the root) and on the branches of its ``anyOf``, once G11 has moved the
    node's constraints into them; a branch itself is left to its parent (``{"required": ["a"]}``
    beside ``properties`` is a constraint on the parent's object, not a free-form object).

    Raises ``ValueError`` (the caller names the path and the rule) for a free-form object branch
    beside a string branch: its JSON text would read as that string, not as the object."""
    if not path or len(path) >= 2 and path[-2] in ("anyOf", "oneOf", "allOf"):
        return
    if is_free_form(node):
        as_json_text(node)
    branches = node.get("anyOf") or []
    for branch in branches:
        if is_free_form(branch):
            if any(isinstance(b, dict) and b.get("type") == "string" for b in branches):
                raise ValueError("a free-form object beside a string (its JSON text would read as the string)")
            as_json_text(branch)


def needs_objects_rule(node: dict[str, Any], is_root: bool) -> bool:
    """Whether G12 or G10 would change ``node`` (the cheap scan of ``wire_profiles``)."""
    if (
        "type" not in node
        and "anyOf" not in node
        and any(k in node for k in ("properties", "required", "items", "enum"))
    ):
        return True
    t = node.get("type")
    objectish = t == "object" or isinstance(t, list) and "object" in t
    return not is_root and objectish and not node.get("properties")


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return text if len(text) <= 120 else text[:117] + "..."
