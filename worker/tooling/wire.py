"""Provider rules for the wire copy of a tool's parameters schema.

One tool whose schema a provider refuses makes every request of the turn fail,
not only that tool's calls. So the copy sent on the wire (strict or not) keeps
to what every provider accepts; arguments are still validated against the
tool's own schema (``worker.tooling.param_validation``), so nothing the copy
drops stops holding. The strict-mode rules D1-D10 are in ``worker.tooling.strict``;
these apply to every tool, strict or not:

| rule | the wire copy | provider error (source) |
|---|---|---|
| P1 | root is a plain ``type: object``: an ``allOf`` at the root is merged into it when its branches merge cleanly; ``anyOf``/``oneOf``/``not``/``if``-``then``-``else`` at the root, or a root without ``type: object``, is refused at definition, naming the keyword | OpenAI: "Invalid schema for function 'subagent': schema must be a JSON Schema of 'type: "object"', got 'type: null'" (S04, github.com/Jaxton07/percho/pull/22); Anthropic: "input_schema does not support oneOf, allOf, or anyOf at the top level" |
| P2 | a ``pattern`` with regex look-around (``(?=``, ``(?!``, ``(?<=``, ``(?<!``) is dropped from the copy and stated in the description | OpenAI: "Invalid JSON schema: regex lookaround is not supported. Found at $.properties.bitbucketEmail.pattern." (S01, github.com/Dokploy/mcp/issues/45; fix pattern: BerriAI/litellm#40485) |
| P3 | (strict) a multi-entry ``allOf`` is merged into its parent when the entries merge cleanly (the same keyword with different values, or a property defined differently in two entries, does not), else refused at definition naming the field | OpenAI: "In context=('properties', 'data'), 'allOf' is not permitted." (S03, github.com/makenotion/notion-mcp-server/issues/102) |
| P5 | a root ``anyOf``/``oneOf`` whose branches only list declared fields as ``required`` ("at least one of these") is kept in OpenAI's non-strict copy, which takes it; the copies for Anthropic, Gemini, ``any`` and strict mode state it in the root's description instead (validation still holds it) | Anthropic: "input_schema does not support oneOf, allOf, or anyOf at the top level" (marianfoo/mcp-sap-docs PR 51, DeusData/codebase-memory-mcp issue 1524, redhat-et/ripwire issue 48); OpenAI non-strict takes the keyword beside ``type: object`` |
| P4 | every object schema carries ``required`` (``[]`` when it requires nothing, e.g. a no-argument tool) | OpenAI-compatible relays: "Invalid schema for function 'get_goal': null is not of type "array"" (S05, github.com/aqiu817/dsh-llm-agentrouter/pull/2); strict sibling: yomo#860 |

Each rule has a test in ``tests/unit/tooling/test_wire_rules.py`` against the cases of
``tests/fixtures/cases/provider-schema-rejections.json`` and cases of our own.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from worker.tooling.errors import ToolDefinitionError

ROOT_COMBINATORS = ("anyOf", "oneOf", "not", "if", "then", "else")
_ANNOTATIONS = ("description", "title", "$comment", "examples")


def field_name(path: tuple[Any, ...]) -> str:
    """Human field path from a schema path: ('properties','a','items','properties','b') -> 'a[].b'."""
    out = ""
    i = 0
    while i < len(path):
        part = path[i]
        if part == "properties" and i + 1 < len(path):
            name = str(path[i + 1])
            out = f"{out}.{name}" if out else name
            i += 2
            continue
        if part == "items":
            out += "[]"
        elif part in ("anyOf", "oneOf", "allOf") and i + 1 < len(path):
            out += f"<{part}[{path[i + 1]}]>"
            i += 2
            continue
        elif part in ("$defs", "definitions") and i + 1 < len(path):
            out = f"$defs.{path[i + 1]}"
            i += 2
            continue
        i += 1
    return out or "<root>"


def pointer(path: tuple[Any, ...]) -> str:
    """``('properties', 'a')`` -> ``/properties/a``."""
    return "/" + "/".join(str(p) for p in path) if path else "/"


def has_lookaround(pattern: Any) -> bool:
    """True when a regex uses look-ahead or look-behind (``(?=``, ``(?!``, ``(?<=``, ``(?<!``)
    outside a character class and not escaped. One linear scan."""
    if not isinstance(pattern, str) or "(?" not in pattern:
        return False
    i, n, in_class = 0, len(pattern), False
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
        elif c == "(" and pattern.startswith(("(?=", "(?!", "(?<=", "(?<!"), i):
            return True
        i += 1
    return False


def merge_types(a: Any, b: Any) -> Any:
    sa = {a} if isinstance(a, str) else set(a)
    sb = {b} if isinstance(b, str) else set(b)
    both = sa & sb
    if "number" in sa and "integer" in sb or "number" in sb and "integer" in sa:
        both.add("integer")
    if not both:
        return None
    return next(iter(both)) if len(both) == 1 else sorted(both)


def merge_all_of(
    parent: dict[str, Any], entries: list[Any], resolve: Callable[[Any], Any]
) -> tuple[dict[str, Any] | None, str]:
    """Merge ``allOf`` entries into their parent (the parent's other keys included).

    Returns ``(merged, "")``, or ``(None, reason)`` when they do not merge cleanly:
    a keyword with two different values (``type`` is intersected; ``required``
    is the union; ``properties`` are united, a property given twice must be
    given identically; ``description``/``title`` keep the first), an entry that
    is not a schema object, or an entry closed with ``additionalProperties:
    false`` while another adds properties (no value could satisfy both).
    """
    merged: dict[str, Any] = {k: v for k, v in parent.items() if k != "allOf"}
    closed_props: list[set[str]] = []
    if merged.get("additionalProperties") is False:
        closed_props.append(set(merged.get("properties") or {}))
    for i, entry in enumerate(entries):
        entry = resolve(entry)
        if not isinstance(entry, dict):
            return None, f"allOf entry {i} is not a schema object"
        if "allOf" in entry:
            entry, why = merge_all_of(entry, entry["allOf"], resolve)
            if entry is None:
                return None, why
        if entry.get("additionalProperties") is False:
            closed_props.append(set(entry.get("properties") or {}))
        for key, value in entry.items():
            if key in ("$defs", "definitions", "$schema", "$id"):
                continue
            if key not in merged:
                merged[key] = copy.deepcopy(value)
            elif key in _ANNOTATIONS:
                continue
            elif key == "type":
                t = merge_types(merged["type"], value)
                if t is None:
                    return None, f"allOf entry {i} has type {value!r}, the others {merged['type']!r}"
                merged["type"] = t
            elif key == "required":
                merged["required"] = list(dict.fromkeys(list(merged["required"]) + list(value)))
            elif key == "properties" and isinstance(value, dict) and isinstance(merged["properties"], dict):
                props = dict(merged["properties"])
                for name, sub in value.items():
                    if name in props and props[name] != sub:
                        return None, f"allOf entries define the property {name!r} differently"
                    props[name] = copy.deepcopy(sub)
                merged["properties"] = props
            elif merged[key] != value:
                return None, f"allOf entries give {key!r} different values"
    all_props = set(merged.get("properties") or {})
    for closed in closed_props:
        if all_props - closed:
            return None, "an allOf entry is closed (additionalProperties: false) while another adds properties"
    return merged, ""


_PRESENCE_KEYS = frozenset({"required", "description", "title"})


def presence_only(schema: dict[str, Any]) -> str | None:
    """P5: a root ``anyOf`` (or ``oneOf``) whose every branch only lists declared properties as
    ``required`` ("send at least one of these fields") returns its combinator's name, else None.
    OpenAI takes it in a non-strict copy; Anthropic ("input_schema does not support oneOf, allOf, or
    anyOf at the top level"), Gemini and strict mode do not, so their copies state it in the
    description instead (``without_presence``) and validation against the tool's own schema holds it."""
    props = schema.get("properties")
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if not isinstance(branches, list) or not branches or not isinstance(props, dict):
            continue
        other = "oneOf" if key == "anyOf" else "anyOf"
        if other in schema or any(k in schema for k in ("not", "if", "then", "else")):
            return None
        for b in branches:
            if not isinstance(b, dict) or set(b) - _PRESENCE_KEYS or not isinstance(b.get("required"), list):
                return None
            if not b["required"] or not all(isinstance(n, str) and n in props for n in b["required"]):
                return None
        return key
    return None


def without_presence(schema: dict[str, Any]) -> dict[str, Any]:
    """The root without its P5 combinator, which its description states: "send at least one of:
    paths, scopes" (``anyOf``) or "exactly one of" (``oneOf``); sets of several fields joined by "and"."""
    key = presence_only(schema)
    if key is None:
        return schema
    out = {k: v for k, v in schema.items() if k != key}
    out["description"] = with_note(schema.get("description"), presence_words(schema, key))
    return out


def presence_words(schema: dict[str, Any], key: str) -> str:
    """What a P5 combinator asks, in words: "send at least one of: paths; scopes"."""
    sets = [" and ".join(b["required"]) for b in schema[key]]
    words = "at least one of" if key == "anyOf" else "exactly one of"
    return f"send {words}: {'; '.join(sets)}"


def check_root(schema: dict[str, Any], tool_name: str, resolve: Callable[[Any], Any]) -> dict[str, Any]:
    """Rule P1: the root as sent. Returns ``schema`` (unchanged), or a copy with a root
    ``allOf`` merged; raises ``ToolDefinitionError`` naming the keyword otherwise (a root
    combinator that only says which fields must be present is P5's: ``presence_only``)."""
    presence = presence_only(schema)
    found = [k for k in ROOT_COMBINATORS if k in schema and k != presence]
    if found:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: the root schema uses {', '.join(found)}; providers accept only a plain "
            "'type: object' root (OpenAI: \"schema must be a JSON Schema of 'type: \\\"object\\\"'\", Anthropic: "
            '"input_schema does not support oneOf, allOf, or anyOf at the top level"), so this tool would make '
            "every request of the turn fail: describe the variants as optional properties of one object (and "
            "check the combination in execute), or define one tool per variant"
        )
    if "allOf" in schema:
        merged, why = merge_all_of(schema, schema["allOf"], resolve)
        if merged is None:
            raise ToolDefinitionError(
                f"tool {tool_name!r}: the root schema's allOf cannot be merged into one object ({why}); "
                "providers accept only a plain 'type: object' root"
            )
        schema = merged
    if schema.get("type") != "object":
        raise ToolDefinitionError(
            f"tool {tool_name!r}: function tool parameters must use a root object schema, a non-nullable "
            f"object (got type {schema.get('type')!r}); providers refuse any other root"
        )
    return schema


def with_note(desc: Any, note: str, limit: int = 1024) -> Any:
    """``desc`` with ``(note)`` appended, the note shortened so the result stays within ``limit``
    characters; a description already at the limit is left as it is."""
    desc = desc if isinstance(desc, str) else ""
    sep = " " if desc else ""
    room = limit - len(desc) - len(sep) - 2
    if room <= 3:
        return desc or None
    if len(note) > room:
        note = note[: room - 3] + "..."
    return f"{desc}{sep}({note})"


_SUB_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUB_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUB_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")


def _is_object_schema(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t) or (t is None and "properties" in node)


def wire_copy(schema: dict[str, Any], tool_name: str, resolve: Callable[[Any], Any]) -> dict[str, Any]:
    """The non-strict wire copy: rules P1, P2 and P4 (``schema`` itself when it already keeps them).

    Raises ``ToolDefinitionError`` for a root P1 refuses.
    """
    root = check_root(schema, tool_name, resolve)
    if not _needs_change(root):
        return root
    root = copy.deepcopy(root)
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if has_lookaround(node.get("pattern")):
            note = f"pattern={node.pop('pattern')}"
            node["description"] = with_note(node.get("description"), note)
        if _is_object_schema(node) and not isinstance(node.get("required"), list):
            node["required"] = []
        stack.extend(_subschemas(node))
    return root


def _subschemas(node: dict[str, Any]) -> list[Any]:
    """The schemas directly inside ``node`` (under maps, lists and single-schema keywords)."""
    out: list[Any] = []
    for key in _SUB_MAPS:
        if isinstance(node.get(key), dict):
            out.extend(node[key].values())
    for key in _SUB_LISTS:
        if isinstance(node.get(key), list):
            out.extend(node[key])
    for key in _SUB_ONE:
        if isinstance(node.get(key), dict):
            out.append(node[key])
    return out


def _needs_change(root: dict[str, Any]) -> bool:
    stack = [root]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if has_lookaround(node.get("pattern")):
            return True
        if _is_object_schema(node) and not isinstance(node.get("required"), list):
            return True
        stack.extend(_subschemas(node))
    return False
