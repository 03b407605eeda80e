"""OpenAI strict-mode projection of a tool's parameters schema.

``to_strict_schema(schema, tool_name=...)`` returns a *copy* of a tool's own
schema that OpenAI's strict mode accepts, or raises ``ToolDefinitionError``
naming the field and the rule when no faithful copy exists. The copy is only
what the provider sees: arguments are always validated against the tool's own
model or raw schema (``worker.tooling.arguments``), so every keyword the copy drops
still holds.

Rules (OpenAI "Structured Outputs: supported schemas" and the API error texts
collected in ``tests/fixtures/cases/strict-mode-rules.json``; rule ids D1-D10
refer to that file):

- D1/D9  every object gets ``additionalProperties: false``; an object that
  declares another ``additionalProperties`` (an open map such as
  ``dict[str, Any]`` or ``Mapping[str, int]``) or no ``properties`` at all
  cannot be strict and raises.
- D2     ``required`` lists every property; a property that was optional is
  made nullable (``anyOf: [<schema>, {"type": "null"}]``) unless it already
  accepts ``null``. ``worker.tooling.arguments`` turns such a ``null`` back into
  "omitted" before validating against the tool's own schema.
- D3     a ``$ref`` with sibling keywords is inlined (siblings win); only
  annotation siblings may sit next to a ``$ref``, a constraining sibling
  raises. A bare ``$ref`` is kept (recursion stays possible). Only local
  ``#/...`` refs are supported; a ``$ref`` cycle through siblings raises.
- D4     ``oneOf`` becomes ``anyOf``; a single-entry ``allOf`` is merged into
  its parent (a conflicting key raises); the root may not use ``anyOf``.
- D5     the root must be a non-nullable ``object`` (a typeless root with
  ``properties``, or ``{}``, is typed ``object``).
- D6     ``default: null`` is dropped (other defaults are kept: api.openai.com
  accepts them).
- D7     keywords outside the strict subset (``minLength``, ``maxLength``,
  ``uniqueItems``, ``patternProperties``, ``propertyNames``,
  ``min/maxProperties``, ``unevaluated*``, ``contains``, formats outside the
  supported list) are removed from the copy and stated in its
  ``description`` so the model still reads them (same choice as pydantic-ai).
- D8     an array must declare a typed ``items`` schema; a schema that accepts
  any JSON value (no ``type``, ``enum``, ``const``, ``$ref`` or composition)
  cannot be expressed in strict mode and raises.
- D10    guards: nesting depth 100 and 100,000 visited nodes (as
  openai-agents-python), against ``$ref`` fan-out; OpenAI's own size limits
  (10 levels of objects, 5,000 properties, 1,000 enum values, name lengths) are
  checked on the copy, each with its source (``worker.tooling.strict_limits``, L1-L5); a description grown by a
  D7 note stays within 1024 characters (the note is shortened; the tool's own
  description limit is checked by ``define_worker_tool``).
- D8     also: ``items: false`` (a ``prefixItems`` tuple) raises: strict mode
  has no tuples, and the copy would be an array that accepts nothing.
- D1/D2  also: a ``required`` name that is not a declared property raises:
  the closed strict copy could never carry it, so no call could succeed.

Provider rules that hold for every wire copy, strict or not (P1 plain object
root, P2 no regex look-around, P3 multi-entry ``allOf`` merged or refused, P4
``required`` on every object), with the provider errors they come from: the
table in ``worker.tooling.wire``. This converter applies P1-P3 as it goes
(``check_root``, ``merge_all_of``, ``has_lookaround``); D1/D2 give P4.
"""

from __future__ import annotations

import copy
from typing import Any, NoReturn

from worker.tooling.errors import ToolDefinitionError
from worker.tooling.strict_limits import check_strict_limits
from worker.tooling.wire import (
    ROOT_COMBINATORS,
    check_root,
    field_name,
    has_lookaround,
    merge_all_of,
    with_note,
    without_presence,
)
from worker.tooling.wire import pointer as _pointer

__all__ = ["accepts_null", "field_name", "strict_violations", "to_strict_schema"]

# Annotation keywords that may sit next to a $ref and be merged into its target
# (openai-agents-python strict_schema.py keeps the same list).
_REF_ANNOTATION_SIBLINGS = frozenset(
    {
        "description",
        "title",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
        "$comment",
        "$anchor",
        "$defs",
        "definitions",
        "$schema",
        "$id",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
# Keywords OpenAI strict mode does not support (pydantic-ai OpenAIJsonSchemaTransformer list).
_UNSUPPORTED = (
    "minLength",
    "maxLength",
    "patternProperties",
    "unevaluatedProperties",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "unevaluatedItems",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
)
_SUPPORTED_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"})
_TYPE_DEFINING = ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf", "properties", "items")
_MAX_DEPTH = 100
_MAX_NODES = 100_000


def accepts_null(node: Any) -> bool:
    """True if ``node`` explicitly admits ``null`` (type null, nullable anyOf/oneOf, enum with None)."""
    if not isinstance(node, dict):
        return node is True
    t = node.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return True
    if "enum" in node and None in node["enum"]:
        return True
    if "const" in node and node["const"] is None:
        return True
    for key in ("anyOf", "oneOf"):
        branches = node.get(key)
        if isinstance(branches, list) and any(accepts_null(b) for b in branches):
            return True
    return False


def _is_object(node: dict[str, Any]) -> bool:
    t = node.get("type")
    return t == "object" or (isinstance(t, list) and "object" in t) or (t is None and "properties" in node)


class _Converter:
    def __init__(self, root: dict[str, Any], tool_name: str):
        self.root = root
        self.tool_name = tool_name
        self.nodes = 0

    def fail(self, path: tuple[Any, ...], problem: str, rule: str) -> NoReturn:
        raise ToolDefinitionError(
            f"tool {self.tool_name!r} cannot be strict: field {field_name(path)!r} "
            f"(schema path {_pointer(path)}) {problem}; {rule}. "
            "Fix the schema or define the tool with strict=False."
        )

    def resolve(self, ref: str, path: tuple[Any, ...]) -> dict[str, Any]:
        if not ref.startswith("#"):
            self.fail(path, f"uses the non-local $ref {ref!r}", "strict conversion only resolves local '#/...' refs")
        node: Any = self.root
        for part in ref[2:].split("/") if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            else:
                self.fail(path, f"has a $ref {ref!r} that does not resolve", "a $ref must point into the schema")
        if not isinstance(node, dict):
            self.fail(path, f"has a $ref {ref!r} to a non-schema", "a $ref must point to a schema object")
        return node

    def _deref(self, entry: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(entry, dict) and isinstance(entry.get("$ref"), str) and len(entry) == 1:
            return self.resolve(entry["$ref"], path)
        return entry

    def walk(self, node: Any, path: tuple[Any, ...], refs: tuple[str, ...] = ()) -> Any:
        """The strict copy of ``node`` (a schema at ``path``; ``refs``: the $refs being inlined)."""
        self._count(path)
        if not isinstance(node, dict):
            if node is True or node == {}:
                self.fail(path, "accepts any JSON value", "OpenAI strict mode requires every schema to declare a type")
            return node
        merged = self._merged(node, path, refs)
        if merged is not None:
            return self.walk(*merged)

        out = _rewritten_keywords(node)
        self._walk_children(out, path, refs)
        if "not" in out:
            self.fail(path, "uses 'not'", "OpenAI strict mode does not support the 'not' keyword")
        if _is_object(out) and "anyOf" not in out:
            self.close_object(out, path, refs)
        if out.get("type") == "array" or (isinstance(out.get("type"), list) and "array" in out["type"]):
            self._convert_array(out, path, refs)
        if not any(k in out for k in _TYPE_DEFINING):
            self.fail(
                path,
                "accepts any JSON value (no type, enum, const, $ref or anyOf)",
                "OpenAI strict mode requires every schema to declare a type",
            )
        return out

    def _count(self, path: tuple[Any, ...]) -> None:
        """The size guards (D10): at most ``_MAX_NODES`` nodes, ``_MAX_DEPTH`` levels."""
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            self.fail(path, "makes the schema too large", f"conversion visits at most {_MAX_NODES} nodes")
        if len(path) > _MAX_DEPTH * 2:
            self.fail(path, "is nested too deeply", f"conversion stops at depth {_MAX_DEPTH}")

    def _merged(
        self, node: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]
    ) -> tuple[dict[str, Any], tuple[Any, ...], tuple[str, ...]] | None:
        """``node`` rewritten into one schema to walk again (``(node, path, refs)``) when it is a
        $ref with siblings (D3) or has an allOf (D4, P3); ``None`` when it is neither."""
        # D3: $ref with siblings -> inline the target (siblings win), then re-process.
        if "$ref" in node and len(node) > 1:
            ref = node["$ref"]
            bad = sorted(k for k in node if k != "$ref" and k not in _REF_ANNOTATION_SIBLINGS)
            if bad:
                self.fail(
                    path,
                    f"has a $ref with constraining sibling keyword(s) {bad}",
                    "OpenAI strict mode forbids keywords next to $ref and only annotations can be merged",
                )
            if ref in refs:
                self.fail(
                    path,
                    f"has a circular $ref {ref!r} with sibling keywords",
                    "a $ref that needs inlining cannot be recursive",
                )
            target = copy.deepcopy(self.resolve(ref, path))
            return {**target, **{k: v for k, v in node.items() if k != "$ref"}}, path, refs + (ref,)

        # D4: single-entry allOf merges into its parent.
        all_of = node.get("allOf")
        if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], dict):
            inner = all_of[0]
            rest = {k: v for k, v in node.items() if k != "allOf"}
            clash = sorted(k for k in inner if k in rest and rest[k] != inner[k] and k not in ("description", "title"))
            if clash:
                self.fail(
                    path,
                    f"has a single-entry allOf whose keys {clash} conflict with its parent",
                    "OpenAI strict mode needs the allOf merged into its parent",
                )
            return {**inner, **rest}, path, refs
        # P3 (worker.tooling.wire): a multi-entry allOf is merged when its entries merge cleanly.
        if isinstance(all_of, list) and len(all_of) > 1:
            all_merged, why = merge_all_of(node, all_of, lambda e: self._deref(e, path))
            if all_merged is None:
                self.fail(
                    path,
                    f"has an allOf that cannot be merged into one schema ({why})",
                    "P3: providers refuse allOf in strict mode ('allOf' is not permitted), and strict mode "
                    "closes each entry, so no value could satisfy them all",
                )
            return all_merged, path, refs
        return None

    def _walk_children(self, out: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]) -> None:
        """Convert ``out``'s $defs/definitions, anyOf branches and allOf entries in place."""
        for defs_key in ("$defs", "definitions"):
            if isinstance(out.get(defs_key), dict):
                out[defs_key] = {
                    name: self.walk(sub, path + (defs_key, name), refs) for name, sub in out[defs_key].items()
                }

        if "anyOf" in out:
            branches = [self.walk(b, path + ("anyOf", i), refs) for i, b in enumerate(out["anyOf"])]
            out["anyOf"] = branches
            # "type: object" sitting next to anyOf-of-objects without its own properties:
            # the branches carry the shapes, so the parent's bare type is dropped from the copy.
            if out.get("type") == "object" and "properties" not in out:
                if all(isinstance(b, dict) and (b.get("type") == "object" or "$ref" in b) for b in branches):
                    del out["type"]
                    out.pop("additionalProperties", None)
                else:
                    self.fail(
                        path,
                        "is an object with anyOf/oneOf branches that are not all objects",
                        "OpenAI strict mode cannot express it",
                    )
        if isinstance(out.get("allOf"), list):
            out["allOf"] = [self.walk(b, path + ("allOf", i), refs) for i, b in enumerate(out["allOf"])]

    def _convert_array(self, out: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]) -> None:
        """D8: an array keeps one typed ``items`` schema (converted in place); no ``prefixItems``."""
        items = out.get("items")
        if items is False or (items is not None and not isinstance(items, dict) and items is not True):
            self.fail(
                path,
                f"is an array with 'items': {items!r}"
                + (" (a fixed-length tuple through prefixItems)" if "prefixItems" in out else ""),
                "D8: OpenAI strict mode supports neither prefixItems nor a non-schema 'items'; "
                "an array must declare one typed 'items' schema",
            )
        if (
            items is None
            or items is True
            or items == {}
            or (isinstance(items, dict) and not any(k in items for k in _TYPE_DEFINING))
        ):
            self.fail(
                path,
                "is an array without a typed 'items' schema",
                'OpenAI strict mode requires arrays to declare their item type ("array schema missing items")',
            )
        out["items"] = self.walk(items, path + ("items",), refs)
        out.pop("prefixItems", None)

    def close_object(self, out: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]) -> None:
        ap = out.get("additionalProperties", False)
        if ap is not False:
            self.fail(
                path,
                f"is an open map (additionalProperties is {ap!r})",
                "OpenAI strict mode requires additionalProperties: false on every object, "
                "so maps such as dict[str, X] cannot be strict",
            )
        if "properties" not in out:
            if path:
                self.fail(
                    path,
                    "is an object without declared properties (any keys accepted)",
                    "OpenAI strict mode requires additionalProperties: false, which would only allow {}",
                )
            out["properties"] = {}
        out["type"] = out.get("type", "object")
        props = out["properties"]
        required = set(out.get("required", []))
        undeclared = sorted(str(r) for r in required if r not in props)
        if undeclared:
            self.fail(
                path,
                f"requires {undeclared}, which are not among its properties",
                "D1/D2: strict mode closes every object (additionalProperties: false), so an undeclared "
                "required key could never be sent and no call could succeed",
            )
        new_props = {}
        for name, sub in props.items():
            sub_path = path + ("properties", name)
            converted = self.walk(sub, sub_path, refs)
            if name not in required and not accepts_null(converted):
                converted = _nullable(converted)
            new_props[name] = converted
        out["properties"] = new_props
        out["additionalProperties"] = False
        out["required"] = list(new_props)


def _rewritten_keywords(node: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``node`` with oneOf as anyOf (D4), a null default dropped (D6), and the keywords
    strict mode refuses removed and stated in the description (D7, P2)."""
    out = dict(node)
    # D4: oneOf -> anyOf.
    if "oneOf" in out:
        one_of = out.pop("oneOf")
        out["anyOf"] = list(out.get("anyOf", [])) + list(one_of)
        out.pop("discriminator", None)
    # D6: null default dropped.
    if "default" in out and out["default"] is None:
        del out["default"]
    # D7: unsupported keywords removed from the copy, stated in the description.
    notes = []
    for key in _UNSUPPORTED:
        if key in out:
            value = out.pop(key)
            if not isinstance(value, (dict, list)):
                notes.append(f"{key}={value}")
            else:
                notes.append(key)
    if has_lookaround(out.get("pattern")):  # P2 (worker.tooling.wire): providers reject look-around
        notes.append(f"pattern={out.pop('pattern')}")
    if "format" in out and out["format"] not in _SUPPORTED_FORMATS:
        notes.append(f"format={out.pop('format')}")
    if notes:
        out["description"] = _with_note(out.get("description"), ", ".join(notes))
    return out


MAX_DESCRIPTION_CHARS = 1024
"""The strict copy never grows a description past this (the API's description limit, D10)."""


def _with_note(desc: Any, note: str) -> Any:
    """``desc`` with ``(note)`` appended (D7), within ``MAX_DESCRIPTION_CHARS`` (``wire.with_note``)."""
    return with_note(desc, note, MAX_DESCRIPTION_CHARS)


_ANNOTATIONS_OUTSIDE_ANYOF = ("description", "title", "default", "examples", "deprecated")


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """``node`` widened to also accept null (D2: optional -> required + nullable)."""
    if "anyOf" in node:
        return {**node, "anyOf": list(node["anyOf"]) + [{"type": "null"}]}
    inner = {k: v for k, v in node.items() if k not in _ANNOTATIONS_OUTSIDE_ANYOF}
    outer = {k: node[k] for k in _ANNOTATIONS_OUTSIDE_ANYOF if k in node}
    return {"anyOf": [inner, {"type": "null"}], **outer}


def to_strict_schema(schema: dict[str, Any], *, tool_name: str) -> dict[str, Any]:
    """Return an OpenAI strict-mode copy of ``schema`` (the input is not modified).

    Shape: a JSON Schema dict whose root is ``{"type": "object", "properties",
    "required": [all keys], "additionalProperties": false, ...}``. Converting
    an already strict schema returns an equal schema.

    Raises ``ToolDefinitionError`` naming the tool, the field (``a[].b``), its
    schema path and the strict-mode rule when the schema cannot be strict: open
    maps (D1/D9), a nullable or ``anyOf`` root (D4/D5), arrays without item
    type (D8), schemas accepting any value, ``$ref`` with constraining siblings
    (D3), ``not``, non-local refs, conflicting single ``allOf`` and the size
    guards (D10). See the module docstring for each rule's source.
    """
    if not isinstance(schema, dict):
        raise ToolDefinitionError(f"tool {tool_name!r} cannot be strict: the root schema is not an object schema")
    root = without_presence(copy.deepcopy(schema))  # P5: strict mode has no root anyOf
    if root == {}:
        root = {"type": "object", "properties": {}}
    if "properties" in root and "type" not in root and not any(k in root for k in ROOT_COMBINATORS):
        root["type"] = "object"
    conv = _Converter(root, tool_name)
    # P1 (worker.tooling.wire): combinators at the root are refused naming the keyword, a root allOf merged.
    root = check_root(root, tool_name, lambda e: conv._deref(e, ()))
    conv.root = root if "$defs" in root or "definitions" in root else conv.root
    t = root.get("type")
    if t is None and "properties" in root:
        root["type"] = "object"
    elif t != "object":
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be strict: the root schema has type {t!r}; "
            "OpenAI strict mode requires the root to be a non-nullable object"
        )
    converted: dict[str, Any] = conv.walk(root, ())
    check_strict_limits(converted, tool_name)  # L1-L5: OpenAI's documented size limits
    return converted


def strict_violations(schema: Any) -> list[str]:
    """Check a schema against the strict-mode rules; return one message per violation (``[]`` when strict).

    Used by tests to prove that ``to_strict_schema`` output is acceptable:
    every object closed with all properties required, no ``oneOf``, no
    ``$ref`` with siblings, typed arrays, no ``default: null``, a non-nullable
    object root.
    """
    problems: list[str] = []
    if not isinstance(schema, dict) or schema.get("type") != "object" or "anyOf" in schema:
        problems.append("/: root must be a non-nullable object without anyOf")

    def visit(node: Any, path: tuple[Any, ...]) -> None:
        if not isinstance(node, dict):
            if isinstance(node, list):
                for i, v in enumerate(node):
                    visit(v, path + (i,))
            return
        where = _pointer(path)
        if "$ref" in node and len(node) > 1:
            problems.append(f"{where}: $ref has siblings {sorted(k for k in node if k != '$ref')}")
        if "oneOf" in node:
            problems.append(f"{where}: oneOf is not permitted")
        if "default" in node and node["default"] is None:
            problems.append(f"{where}: default null")
        if _is_object(node) and "anyOf" not in node:
            if node.get("additionalProperties") is not False:
                problems.append(f"{where}: additionalProperties must be false")
            if set(node.get("required", [])) != set(node.get("properties", {})):
                problems.append(f"{where}: required must list every property")
        t = node.get("type")
        if (t == "array" or (isinstance(t, list) and "array" in t)) and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: array schema missing items")
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
                for name, sub in value.items():
                    visit(sub, path + (key, name))
            elif key in ("items", "anyOf", "allOf"):
                visit(value, path + (key,))

    visit(schema, ())
    return problems
