"""Provider wire profiles: the rules a tool's wire copy keeps at each provider, and the copy.

``AGENT_MODEL_PROVIDER`` (``settings.model_provider``) says which provider the deployment's
model requests reach: ``openai``, ``anthropic``, ``gemini``, or ``any`` (the default: several,
or one behind an OpenAI-compatible proxy such as LiteLLM or OpenRouter, where the same copy may
reach any of them). The name says what the setting is about (the provider in use), not how the
runtime reacts to it. The copy keeps the rules of that provider (``any``: of all of them at
once), changing the schema only where the tool's meaning stays the same; where a rule would
change the meaning, the definition is refused naming the field's path and the rule. Arguments
are always validated against the tool's own schema (``worker.tooling.param_validation``), never
the copy, so a constraint the copy moves into a description still holds.

| rule | provider | the wire copy | on a schema that breaks it | source |
|---|---|---|---|---|
| P1-P4 | openai, any (P1 all) | ``worker.tooling.wire`` (plain object root, no look-around, ``allOf`` merged, ``required`` on every object) | fixed or refused as there | the table in ``worker.tooling.wire`` |
| D1-D10 | openai strict | ``worker.tooling.strict`` | fixed or refused as there | ``tests/fixtures/cases/strict-mode-rules.json`` |
| A1 | anthropic, any | a valid draft 2020-12 ``input_schema`` | draft-4 boolean ``exclusiveMinimum``/``exclusiveMaximum`` become the bound; tuple ``items: [...]`` becomes ``prefixItems``; ``dependencies`` becomes ``dependentRequired``/``dependentSchemas`` | "tools.17.custom.input_schema: JSON schema is invalid. It must match JSON Schema draft 2020-12" (anthropics/claude-code issue 86664) |
| G1 | gemini, any | no ``$schema`` (nor ``$id``, ``$comment``, ``$anchor``) | dropped (annotations) | 'Unknown name "$schema"' (router-for-me/CLIProxyAPI issue 97, C15) |
| G2 | gemini, any | no ``const`` | a one-value ``enum`` | 'Unknown name "const"' (earendil-works/pi issue 4932, C13; zed-extensions/mcp-server-brave-search issue 12) |
| G3 | gemini, any | no ``$ref``/``$defs``/``definitions`` | every ``$ref`` inlined; a recursive one is refused | Gemini's Schema has no reference (the Schema object of the Gemini API; typia's IGeminiSchema notes) |
| G4 | gemini, any | no ``additionalProperties`` | ``false``/``true``/``{}`` dropped (validation still closes the object); a typed map's value schema moves into the description | 'Unknown name "additionalProperties"' (nanbingxyz/5ire issue 42) |
| G5 | gemini, any | every array has ``items`` | ``items: {}`` where any item is allowed | "parameters.properties[tags].items: missing field" (cline/cline issue 7339, jackmusick/bifrost PR 225) |
| G6 | gemini, any | ``format`` only ``enum``/``date-time`` (string), ``float``/``double`` (number), ``int32``/``int64`` (integer) | another ``format`` moves into the description | "format: only 'enum' and 'date-time' are supported for STRING type" (google-gemini/gemini-cli issue 3178) |
| G7 | gemini, any | ``type`` is one name | a list becomes ``anyOf`` of one-type schemas (gemini: ``[X, "null"]`` becomes ``X`` with ``nullable: true``) | "Proto field is not repeating, cannot start list" (aoci-spec/aoci-code issue 61, laravel/ai PR 386) |
| G8 | gemini, any | ``enum`` only of strings | another ``enum`` moves into the description | "function declaration enum only allowed for STRING type" (decolua/9router PR 380) |
| G9 | gemini, any | only the Gemini Schema's fields (type, format, title, description, nullable, enum, items, min/maxItems, properties, required, min/maxProperties, min/maxLength, pattern, example, anyOf, propertyOrdering, default, minimum, maximum) | ``oneOf`` becomes ``anyOf``; other constraints (``exclusiveMinimum``, ``multipleOf``, ``uniqueItems``, ``not``...) move into the description; other annotations are dropped; a tuple (``prefixItems``) is refused | "Invalid JSON payload received. Unknown name ..." (the errors above) |

Strict tools: OpenAI's strict mode needs ``additionalProperties: false`` on every object, which
Gemini refuses, so a strict copy keeps the OpenAI strict rules (D1-D10) and, under ``any``, the
rules that do not contradict them (A1, G1, G2); a strict tool under ``gemini`` is refused at
definition (``strict=False`` there).
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from worker.tooling.errors import ToolDefinitionError
from worker.tooling.wire import field_name, merge_all_of, pointer, with_note

Provider = Literal["any", "openai", "anthropic", "gemini"]
PROVIDERS: tuple[str, ...] = ("any", "openai", "anthropic", "gemini")

GEMINI_FIELDS = frozenset(
    {"type", "format", "title", "description", "nullable", "enum", "items", "minItems", "maxItems"}
    | {"properties", "required", "minProperties", "maxProperties", "minLength", "maxLength", "pattern"}
    | {"example", "anyOf", "propertyOrdering", "default", "minimum", "maximum"}
)
GEMINI_FORMATS = {"string": {"enum", "date-time"}, "number": {"float", "double"}, "integer": {"int32", "int64"}}
_ANNOTATIONS = frozenset(
    {"$schema", "$id", "$comment", "$anchor", "$dynamicAnchor", "examples", "deprecated", "readOnly", "writeOnly"}
    | {"contentEncoding", "contentMediaType", "contentSchema", "discriminator"}
)
_MAX_NODES = 20_000


def _fail(tool: str, path: tuple[Any, ...], problem: str, rule: str, provider: str) -> ToolDefinitionError:
    return ToolDefinitionError(
        f"tool {tool!r}: field {field_name(path)!r} (schema path {pointer(path)}) {problem}; {rule}, so the "
        f"copy sent to the provider (AGENT_MODEL_PROVIDER={provider}) would not mean what the tool means. "
        "Change the schema, or set AGENT_MODEL_PROVIDER to the one provider in use if it accepts this"
    )


def anthropic_fixes(node: dict[str, Any]) -> dict[str, Any]:
    """Rule A1 on one schema node: draft-4/7 forms rewritten to their draft 2020-12 meaning."""
    out = dict(node)
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(out.get(key), bool):
            if out.pop(key) and bound in out:
                out[key] = out.pop(bound)
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    elif "additionalItems" in out:
        out.pop("additionalItems")  # without a tuple it has no effect
    deps = out.pop("dependencies", None)
    if isinstance(deps, dict):
        for name, dep in deps.items():
            target = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            out.setdefault(target, {})[name] = dep
    return out


class _Copy:
    """One profile copy of a root schema (see the module docstring for the rules)."""

    def __init__(self, root: dict[str, Any], tool: str, provider: str):
        self.root, self.tool, self.provider = root, tool, provider
        self.gemini = provider in ("gemini", "any")
        self.anthropic = provider in ("anthropic", "any")
        self.const_enum = self.gemini
        self.nodes = 0

    def fail(self, path: tuple[Any, ...], problem: str, rule: str) -> ToolDefinitionError:
        return _fail(self.tool, path, problem, rule, self.provider)

    def resolve(self, ref: str, path: tuple[Any, ...]) -> dict[str, Any]:
        node: Any = self.root
        for part in ref[2:].split("/") if ref not in ("#", "#/") else []:
            part = part.replace("~1", "/").replace("~0", "~")
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise self.fail(path, f"has a $ref {ref!r} that cannot be inlined", "G3: Gemini has no $ref")
        return node

    def walk(self, node: Any, path: tuple[Any, ...], refs: tuple[str, ...] = ()) -> Any:
        self.nodes += 1
        if self.nodes > _MAX_NODES:
            raise self.fail(path, "makes the copy too large", f"a copy visits at most {_MAX_NODES} nodes")
        if node is True:
            return {}
        if not isinstance(node, dict):
            return node
        if self.gemini and isinstance(node.get("$ref"), str):
            node = self.inline(node, path, refs)
            refs = refs + (node.pop("\0ref"),)
        if self.anthropic:
            node = anthropic_fixes(node)
        out = self.keywords(dict(node), path)
        self.children(out, path, refs)
        if self.gemini:
            self.gemini_shape(out, path)
        return out

    def inline(self, node: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]) -> dict[str, Any]:
        """G3: ``$ref`` replaced by its target (the node's other keys win)."""
        ref = node["$ref"]
        if ref in refs:
            raise self.fail(path, f"is recursive (its $ref {ref!r} reaches itself)", "G3: Gemini has no $ref")
        target = self.resolve(ref, path)
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        if isinstance(merged.get("$ref"), str):
            return self.inline({**merged, "\0ref": ref}, path, refs + (ref,))
        merged.setdefault("\0ref", ref)
        return merged

    def entry(self, e: Any, path: tuple[Any, ...]) -> Any:
        """An ``allOf`` entry with a bare ``$ref`` resolved (for merging)."""
        if isinstance(e, dict) and isinstance(e.get("$ref"), str) and len(e) == 1:
            return self.resolve(e["$ref"], path)
        return e

    def keywords(self, out: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
        """G1, G2, G6-G9 on one node (its children are walked after)."""
        for key in ("$schema", "$id", "$comment", "$anchor"):
            out.pop(key, None)  # G1 (harmless everywhere: annotations)
        if "const" in out and self.const_enum:
            value = out.pop("const")
            if "enum" not in out:
                out["enum"] = [value]  # G2
        if not self.gemini:
            return out
        out.pop("$defs", None)
        out.pop("definitions", None)
        if isinstance(out.get("allOf"), list):
            merged, why = merge_all_of(out, out["allOf"], lambda e: self.entry(e, path))
            if merged is None:
                raise self.fail(path, f"has an allOf that cannot be merged ({why})", "G9: Gemini has no allOf")
            out = merged
        if "oneOf" in out:
            out["anyOf"] = list(out.get("anyOf", [])) + list(out.pop("oneOf"))
        if "prefixItems" in out:
            raise self.fail(path, "is a tuple (prefixItems)", "G9: Gemini has no tuples")
        notes = []
        fmt = out.get("format")
        if fmt is not None and fmt not in GEMINI_FORMATS.get(str(out.get("type")), set()):
            notes.append(f"format={out.pop('format')}")  # G6
        if isinstance(out.get("enum"), list) and not all(isinstance(v, str) for v in out["enum"]):
            values = out.pop("enum")  # G8
            strings = [v for v in values if isinstance(v, str)]
            if None in values and len(strings) == len(values) - 1 and strings:
                out["enum"] = strings
                out["nullable"] = True
            else:
                notes.append("one of: " + ", ".join(_show(v) for v in values))
        for key in [k for k in out if k not in GEMINI_FIELDS and k != "additionalProperties" and k != "\0ref"]:
            value = out.pop(key)
            if key not in _ANNOTATIONS and not key.startswith("$"):
                notes.append(f"{key}={_show(value)}")  # G9: a constraint the model still reads
        if notes:
            out["description"] = with_note(out.get("description"), ", ".join(notes))
        return out

    def children(self, out: dict[str, Any], path: tuple[Any, ...], refs: tuple[str, ...]) -> None:
        props = out.get("properties")
        if isinstance(props, dict):
            out["properties"] = {k: self.walk(v, path + ("properties", k), refs) for k, v in props.items()}
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if isinstance(out.get(key), list):
                out[key] = [self.walk(v, path + (key, i), refs) for i, v in enumerate(out[key])]
        for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
            if isinstance(out.get(key), dict):
                out[key] = self.walk(out[key], path + (key,), refs)
        for key in ("$defs", "definitions", "patternProperties", "dependentSchemas"):
            if isinstance(out.get(key), dict):
                out[key] = {k: self.walk(v, path + (key, k), refs) for k, v in out[key].items()}

    def gemini_shape(self, out: dict[str, Any], path: tuple[Any, ...]) -> None:
        """G4, G5, G7 on one node after its children."""
        out.pop("\0ref", None)
        extra = out.pop("additionalProperties", None)
        if isinstance(extra, dict) and extra:  # a typed map: the value schema moves into the description
            note = "each value: " + _show(json.dumps(extra, separators=(",", ":")))
            out["description"] = with_note(out.get("description"), note)
        t = out.get("type")
        if isinstance(t, list):
            out.update(self.one_type(out, t))
        if out.get("type") == "array" and not isinstance(out.get("items"), dict):
            out["items"] = {}  # G5: any item, as the tool's schema allows

    def one_type(self, out: dict[str, Any], types: list[Any]) -> dict[str, Any]:
        """G7: a ``type`` list as one ``type`` (+ ``nullable`` for gemini) or an ``anyOf``."""
        del out["type"]
        names = [t for t in types if t != "null"]
        if self.provider == "gemini" and len(names) == 1:
            return {"type": names[0], **({"nullable": True} if "null" in types else {})}
        if len(types) == 1:
            return {"type": types[0]}
        per_type = ("items", "properties", "required", "minItems", "maxItems", "minLength", "maxLength", "pattern")
        shared = {k: out.pop(k) for k in per_type if k in out}
        branches = []
        for t in types:
            branch: dict[str, Any] = {"type": t}
            branch.update({k: v for k, v in shared.items() if _fits(k, t)})
            if t == "array" and "items" not in branch:
                branch["items"] = {}
            branches.append(branch)
        return {"anyOf": list(out.pop("anyOf", [])) + branches}


def _fits(keyword: str, type_name: str) -> bool:
    if keyword in ("items", "minItems", "maxItems"):
        return type_name == "array"
    if keyword in ("properties", "required"):
        return type_name == "object"
    return type_name == "string"


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def profile_copy(schema: dict[str, Any], tool_name: str, provider: str) -> dict[str, Any]:
    """The non-strict wire copy of ``schema`` (already through P1-P4) for ``provider``; ``schema``
    itself when no rule of the profile changes it. Raises ``ToolDefinitionError`` naming the field,
    its schema path and the rule where keeping the rule would change the tool's meaning."""
    if provider == "openai" or not _needs_profile(schema, provider):
        return schema
    root = copy.deepcopy(schema)
    return _Copy(root, tool_name, provider).walk(root, ())  # type: ignore[no-any-return]


def strict_profile_copy(schema: dict[str, Any], tool_name: str, provider: str) -> dict[str, Any]:
    """The strict copy for ``provider`` (see "Strict tools" in the module docstring)."""
    if provider == "gemini":
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be strict with AGENT_MODEL_PROVIDER=gemini: strict mode is OpenAI's, and its "
            "copy needs additionalProperties: false on every object, which Gemini refuses (rule G4); define the "
            "tool with strict=False"
        )
    if provider == "openai" or not _needs_profile(schema, "anthropic", strict=True):
        return schema
    root = copy.deepcopy(schema)
    conv = _Copy(root, tool_name, "anthropic")
    conv.const_enum = provider == "any"
    return conv.walk(root, ())  # type: ignore[no-any-return]


def _needs_profile(schema: dict[str, Any], provider: str, strict: bool = False) -> bool:
    """A cheap scan: whether any node has something a rule of ``provider`` rewrites."""
    gemini = provider in ("gemini", "any") and not strict
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if any(
            k in node for k in ("$schema", "$id", "$comment", "$anchor", "const", "dependencies", "additionalItems")
        ):
            return True
        if isinstance(node.get("exclusiveMinimum"), bool) or isinstance(node.get("exclusiveMaximum"), bool):
            return True
        if isinstance(node.get("items"), list):
            return True
        if gemini and (set(node) - GEMINI_FIELDS - {"properties"} or isinstance(node.get("type"), list)):
            return True
        if gemini and node.get("type") == "array" and not isinstance(node.get("items"), dict):
            return True
        if gemini and "format" in node and node["format"] not in GEMINI_FORMATS.get(str(node.get("type")), set()):
            return True
        if gemini and isinstance(node.get("enum"), list) and not all(isinstance(v, str) for v in node["enum"]):
            return True
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas"):
                if isinstance(value, dict):
                    stack.extend(value.values())
            elif key in ("enum", "default", "example", "examples", "required", "const"):
                continue  # data, not schemas
            elif isinstance(value, (dict, list)):
                stack.append(value)
    return False
