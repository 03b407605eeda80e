"""What a wire copy must satisfy at each provider, checked independently of the code that makes
the copy (``worker.tooling.wire_profiles`` states the same rules with their sources)."""

from __future__ import annotations

import re
from typing import Any

import jsonschema

from worker.tooling.strict import strict_violations

GEMINI_FIELDS = {
    "type", "format", "title", "description", "nullable", "enum", "items", "minItems", "maxItems", "properties",
    "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern", "example", "anyOf",
    "propertyOrdering", "default", "minimum", "maximum",
}  # fmt: skip
GEMINI_FORMATS = {"string": {"enum", "date-time"}, "number": {"float", "double"}, "integer": {"int32", "int64"}}
_LOOKAROUND = re.compile(r"\(\?<?[=!]")


def _schemas(node: Any, path: str = ""):
    """Every schema node with its path (through properties, items, anyOf... not through data)."""
    if not isinstance(node, dict):
        return
    yield node, path or "/"
    for key in ("properties", "$defs", "definitions", "patternProperties"):
        for name, sub in (node.get(key) or {}).items():
            yield from _schemas(sub, f"{path}/{key}/{name}")
    for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
        for i, sub in enumerate(node.get(key) or []):
            yield from _schemas(sub, f"{path}/{key}/{i}")
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        if isinstance(node.get(key), dict):
            yield from _schemas(node[key], f"{path}/{key}")


def _root(schema: dict[str, Any]) -> list[str]:
    bad = [k for k in ("anyOf", "oneOf", "allOf", "not", "enum") if k in schema]
    return [] if schema.get("type") == "object" and not bad else [f"/: root must be a plain object ({bad})"]


def _presence_only(schema: dict[str, Any]) -> bool:
    """A root anyOf whose branches only list declared fields as required: OpenAI takes it non-strict."""
    branches = schema.get("anyOf", schema.get("oneOf"))
    props = schema.get("properties") or {}
    return isinstance(branches, list) and all(
        isinstance(b, dict) and set(b) == {"required"} and set(b["required"]) <= set(props) for b in branches
    )


def openai_violations(schema: dict[str, Any], strict: bool) -> list[str]:
    if strict:
        return strict_violations(schema)
    plain = {k: v for k, v in schema.items() if k not in ("anyOf", "oneOf")} if _presence_only(schema) else schema
    out = _root(plain)
    for node, path in _schemas(schema):
        if isinstance(node.get("pattern"), str) and _LOOKAROUND.search(node["pattern"]):
            out.append(f"{path}: look-around pattern")
        t = node.get("type")
        if (t == "object" or (isinstance(t, list) and "object" in t)) and not isinstance(node.get("required"), list):
            out.append(f"{path}: object without a required array")
    return out


def anthropic_violations(schema: dict[str, Any]) -> list[str]:
    out = _root(schema)
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        out.append(f"/{'/'.join(map(str, exc.absolute_path))}: not valid draft 2020-12: {exc.message}")
    return out


def gemini_violations(schema: dict[str, Any]) -> list[str]:
    out = _root(schema)
    for node, path in _schemas(schema):
        extra = set(node) - GEMINI_FIELDS
        if extra:
            out.append(f"{path}: fields Gemini does not know: {sorted(extra)}")
        t = node.get("type")
        if t is not None and not isinstance(t, str):
            out.append(f"{path}: type is not one name")
        if "enum" in node and not all(isinstance(v, str) for v in node["enum"]):
            out.append(f"{path}: enum of non-strings")
        if "format" in node and node["format"] not in GEMINI_FORMATS.get(str(t), set()):
            out.append(f"{path}: format {node['format']!r}")
        if t == "array":
            items = node.get("items")
            if not isinstance(items, dict) or not (isinstance(items.get("type"), str) or items.get("anyOf")):
                out.append(f"{path}: array without typed items")
        if "anyOf" in node and set(node) - {"anyOf"}:
            out.append(f"{path}: anyOf beside {sorted(set(node) - {'anyOf'})} (Vertex: anyOf must be alone)")
        if path != "/" and "properties" in node and not node["properties"]:
            out.append(f"{path}: empty properties")
        implied = [k for k in ("properties", "required", "items", "enum") if k in node]
        if t is None and "anyOf" not in node and implied:
            out.append(f"{path}: {implied[0]} without a type (Gemini: only allowed for OBJECT type)")
        if path != "/" and t == "object" and not node.get("properties"):
            out.append(f"{path}: object without properties (should be non-empty for OBJECT type)")
    if "properties" in schema and not schema["properties"]:
        out.append("/: empty properties (a tool without arguments is sent without parameters or properties)")
    return out


def violations(schema: dict[str, Any], provider: str, strict: bool) -> list[str]:
    """Every rule of ``provider`` the wire copy ``schema`` breaks (``[]`` when it keeps them all).
    Strict copies are OpenAI's strict mode: under ``any`` they keep OpenAI strict and Anthropic,
    and the Gemini rules that do not contradict strict mode (no ``$schema``, no ``const``)."""
    if provider == "openai":
        return openai_violations(schema, strict)
    if provider == "anthropic":
        return anthropic_violations(schema)
    if provider == "gemini":
        return gemini_violations(schema)
    out = openai_violations(schema, strict) + anthropic_violations(schema)
    if strict:
        out += [f"{p}: {k}" for node, p in _schemas(schema) for k in ("$schema", "const") if k in node]
    else:
        out += gemini_violations(schema)
    return out
