"""Provider wire profiles: the rules a tool's wire copy keeps at each provider, and the copy.

``AGENT_MODEL_PROVIDER`` (``settings.model_provider``) says which provider the deployment's
model requests reach: ``openai`` (the default, ``worker.tooling.provider_choice``), ``anthropic``,
``gemini``, or ``any`` (several, or one behind an OpenAI-compatible proxy such as LiteLLM or
OpenRouter, where the same copy may reach any of them). The name says what the setting is about (the provider in use), not how the
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
| G5 | gemini, any | every array has ``items`` that name a type (or are an ``anyOf``) | a type the items' keywords imply (``enum`` of strings, ``properties``) is written out; items left open (missing, ``{}``: "any item") are refused, since Gemini's Schema requires ``type`` and no Gemini schema means "anything" | "parameters.properties[tags].items: missing field" (cline/cline issue 7339, jackmusick/bifrost PR 225); Schema.type "Required", TYPE_UNSPECIFIED "should not be used" (the Gemini API's Schema and Type reference) |
| G6 | gemini, any | ``format`` only ``enum``/``date-time`` (string), ``float``/``double`` (number), ``int32``/``int64`` (integer) | another ``format`` moves into the description | "format: only 'enum' and 'date-time' are supported for STRING type" (google-gemini/gemini-cli issue 3178) |
| G7 | gemini, any | ``type`` is one name | a list becomes ``anyOf`` of one-type schemas (gemini: ``[X, "null"]`` becomes ``X`` with ``nullable: true``) | "Proto field is not repeating, cannot start list" (aoci-spec/aoci-code issue 61, laravel/ai PR 386) |
| G8 | gemini, any | ``enum`` only of strings | another ``enum`` moves into the description | "function declaration enum only allowed for STRING type" (decolua/9router PR 380) |
| G10 | gemini, any | no object with an empty ``properties`` | a root ``properties: {}`` is dropped (the same object); under ``gemini`` a tool without arguments is declared without ``parameters`` (the form Gemini documents for a function that takes none), a map root (no named properties) is refused | "parameters.properties: should be non-empty for OBJECT type" (BerriAI/litellm issue 9289, vercel/ai issue 3371, SWE-agent/SWE-agent PR 1431); google-genai's FunctionDeclaration: parameters may be left unset for a function without parameters (quoted in pydantic/pydantic-ai issue 1990) |
| G10 nested, G12 | gemini, any | every object node says ``type: object`` and has named properties, at every level | ``worker.tooling.gemini_objects`` (a free-form object below the root is sent as JSON text, decoded back by validation) | the table in ``worker.tooling.gemini_objects`` |
| G11 | gemini, any | ``anyOf`` is the only field of its schema | the node's constraints move into each branch (a branch of another type is dropped; an ``enum`` keeps the values of the branch's type), its description and title go to each branch but a ``null`` one, ``default``/``example`` into the description; a constraint a branch gives differently is refused | Vertex AI: "schema specified other fields alongside any_of. When using any_of, it must be the only field set" (BerriAI/litellm issue 11164, anomalyco/opencode issue 15795) |
| G9 | gemini, any | only the Gemini Schema's fields (type, format, title, description, nullable, enum, items, min/maxItems, properties, required, min/maxProperties, min/maxLength, pattern, example, anyOf, propertyOrdering, default, minimum, maximum) | ``oneOf`` becomes ``anyOf``; other constraints (``exclusiveMinimum``, ``multipleOf``, ``uniqueItems``, ``not``...) move into the description; other annotations are dropped; a tuple (``prefixItems``) is refused | "Invalid JSON payload received. Unknown name ..." (the errors above) |

Strict tools: OpenAI's strict mode needs ``additionalProperties: false`` on every object, which
Gemini refuses (G4), so no copy is both strict and Gemini's. A strict tool is refused at
definition under ``gemini`` and under ``any`` (whose copy keeps Gemini's rules), naming the path
and G4 (``strict_refusal``); ``submit_result`` and ``tool_search`` then fall back to
``strict=False``. Under ``openai`` the copy keeps D1-D10, under ``anthropic`` also A1.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

from worker.tooling.errors import ToolDefinitionError
from worker.tooling.gemini_objects import implied_type, needs_objects_rule, nested_objects
from worker.tooling.wire import field_name, merge_all_of, merge_types, pointer, with_note, without_presence

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
        """G4, G5, G7, G10-G12 on one node after its children."""
        out.pop("\0ref", None)
        extra = out.pop("additionalProperties", None)
        if isinstance(extra, dict) and extra:  # a typed map: the value schema moves into the description
            note = "each value: " + _show(json.dumps(extra, separators=(",", ":")))
            out["description"] = with_note(out.get("description"), note)
        implied_type(out)  # G12
        t = out.get("type")
        if isinstance(t, list) and "anyOf" not in out:  # beside an anyOf, G11 moves the list into its branches
            out.update(self.one_type(out, t, path))
        if out.get("type") == "array":
            self.typed_items(out, path)
        if isinstance(out.get("anyOf"), list) and set(out) - {"anyOf"}:
            self.any_of_alone(out, path)
        try:
            nested_objects(out, path)  # G10 below the root, once G11 has given each branch its constraints
        except ValueError as exc:
            raise self.fail(path, f"is {exc}", "G10: Gemini has no object without properties") from None

    def typed_items(self, array: dict[str, Any], path: tuple[Any, ...]) -> None:
        """G5: an array's ``items`` names its type (or is an ``anyOf``; a type its keywords imply,
        ``enum`` of strings or ``properties``, is written out). "Any item" has no Gemini form."""
        items = array.get("items")
        if isinstance(items, dict) and not isinstance(items.get("type"), str) and not items.get("anyOf"):
            if isinstance(items.get("enum"), list) and all(isinstance(v, str) for v in items["enum"]):
                array["items"] = items = {"type": "string", **items}
            elif isinstance(items.get("properties"), dict) and items["properties"]:
                array["items"] = items = {"type": "object", **items}
        if isinstance(items, dict) and (isinstance(items.get("type"), str) or items.get("anyOf")):
            return
        raise self.fail(
            path + ("items",) if isinstance(items, dict) else path,
            "is an array whose items name no type (any item)",
            "G5: Gemini needs every array's items, with a type (its Schema's type is required)",
        )

    def one_type(self, out: dict[str, Any], types: list[Any], path: tuple[Any, ...]) -> dict[str, Any]:
        """G7: a ``type`` list as one ``type`` (+ ``nullable`` for gemini) or an ``anyOf``."""
        del out["type"]
        names = [t for t in types if t != "null"]
        if self.provider == "gemini" and len(names) == 1:
            return {"type": names[0], **({"nullable": True} if "null" in types else {})}
        if len(types) == 1:
            return {"type": types[0]}
        shared = {k: out.pop(k) for k in _PER_TYPE if k in out}
        branches = []
        for t in types:
            branch: dict[str, Any] = {"type": t}
            branch.update({k: v for k, v in shared.items() if _fits(k, t)})
            if t == "array":
                self.typed_items(branch, path)
            branches.append(branch)
        return {"anyOf": branches}

    def any_of_alone(self, out: dict[str, Any], path: tuple[Any, ...]) -> None:
        """G11: ``anyOf`` as the only field of its node. The node's constraints move into each branch
        (``S and (A or B)`` is ``(S and A) or (S and B)``; a branch whose type cannot meet them is
        dropped); its description and title go to each branch but a ``null`` one, ``default``/``example``
        into the description. Refused when a constraint conflicts with a branch's own."""
        branches = out.pop("anyOf")
        desc, title = out.pop("description", None), out.pop("title", None)
        notes = [f"{k}: {_show(json.dumps(out.pop(k)))}" for k in ("default", "example") if k in out]
        constraints = dict(out)
        out.clear()
        kept = []
        for i, branch in enumerate(branches):
            merged = self.conjoin(dict(branch) if isinstance(branch, dict) else {}, constraints, path + ("anyOf", i))
            if merged is None:
                continue
            if merged.get("type") == "null" and any(isinstance(b, dict) and b.get("type") != "null" for b in branches):
                kept.append(merged)  # the words are for the value the model writes: not repeated on null
                continue
            parts = [d for d in (desc, merged.get("description")) if isinstance(d, str) and d]
            text = " ".join(parts) or None
            if notes:
                text = with_note(text, ", ".join(notes))
            if text:
                merged["description"] = text
            if title and "title" not in merged:
                merged["title"] = title
            kept.append(merged)
        if not kept:
            raise self.fail(path, "has an anyOf none of whose branches fits its own type", "G11: anyOf alone")
        if len(kept) == 1:
            out.update(kept[0])
        else:
            out["anyOf"] = kept

    def conjoin(
        self, branch: dict[str, Any], constraints: dict[str, Any], path: tuple[Any, ...]
    ) -> dict[str, Any] | None:
        """``branch`` with ``constraints`` added (G11); None when their types do not meet."""
        mine = branch.get("type")
        theirs = constraints.get("type")
        if theirs is not None:
            both = merge_types(mine, theirs) if mine is not None else theirs
            if both is None:
                return None  # "S and A" admits nothing: the branch goes
            branch["type"] = both
        names = branch.get("type")
        for key, value in constraints.items():
            if key == "type" or (key in _PER_TYPE and isinstance(names, str) and not _fits(key, names)):
                continue
            if key not in branch or branch[key] == value:
                branch[key] = value
            elif key == "required":
                branch[key] = list(dict.fromkeys(list(branch[key]) + list(value)))
            elif key == "properties" and not set(branch[key]) & set(value):
                branch[key] = {**branch[key], **value}
            elif key == "nullable":
                branch[key] = bool(branch[key]) and bool(value)
            else:
                raise self.fail(
                    path,
                    f"gives {key!r} beside its anyOf and in a branch, differently",
                    "G11: Vertex AI takes anyOf only as the only field of its schema",
                )
        if isinstance(branch.get("type"), list):
            branch.update(self.one_type(branch, branch["type"], path))
            if isinstance(branch.get("anyOf"), list) and set(branch) - {"anyOf"}:
                self.any_of_alone(branch, path)
        elif isinstance(branch.get("type"), str) and isinstance(branch.get("enum"), list):
            values = [v for v in branch["enum"] if _is_type(v, branch["type"])]
            if not values:
                return None  # no value of the enum has the branch's type
            branch["enum"] = values
        return branch


# Keywords that constrain one type only (JSON Schema ignores them for a value of another type).
_PER_TYPE = ("items", "minItems", "maxItems", "properties", "required", "minProperties", "maxProperties") + (
    "propertyOrdering",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "format",
)


def _fits(keyword: str, type_name: str) -> bool:
    if keyword in ("items", "minItems", "maxItems"):
        return type_name == "array"
    if keyword in ("properties", "required", "minProperties", "maxProperties", "propertyOrdering"):
        return type_name == "object"
    if keyword in ("minimum", "maximum"):
        return type_name in ("integer", "number")
    if keyword == "format":
        return type_name in ("string", "integer", "number")
    return type_name == "string"


def _is_type(value: Any, type_name: str) -> bool:
    """Whether ``value`` is an instance of the JSON Schema type ``type_name``."""
    if type_name == "integer":
        return isinstance(value, int) and not isinstance(value, bool) or isinstance(value, float) and value.is_integer()
    if type_name == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    kinds = {"string": str, "boolean": bool, "object": dict, "array": list}
    return value is None if type_name == "null" else isinstance(value, kinds.get(type_name, object))


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 120 else text[:117] + "..."


def profile_copy(schema: dict[str, Any], tool_name: str, provider: str) -> dict[str, Any]:
    """The non-strict wire copy of ``schema`` (already through P1-P4) for ``provider``; ``schema``
    itself when no rule of the profile changes it. Raises ``ToolDefinitionError`` naming the field,
    its schema path and the rule where keeping the rule would change the tool's meaning."""
    if provider == "openai":
        return schema
    schema = without_presence(schema)  # P5: only OpenAI takes it
    if not _needs_profile(schema, provider):
        return schema
    if provider == "gemini" and not schema.get("properties") and _is_map(schema):
        raise _fail(
            tool_name, (), "is a map (no named properties)", "G10: Gemini has no object without properties", provider
        )
    root = copy.deepcopy(schema)
    out: dict[str, Any] = _Copy(root, tool_name, provider).walk(root, ())
    if "properties" in out and not out["properties"]:
        del out["properties"]  # G10: the same object; Gemini refuses an empty properties
    return out


def sends_parameters(parameters: dict[str, Any], provider: str) -> bool:
    """False for a tool without arguments under ``gemini`` (G10): its function is declared without
    ``parameters``, the form Gemini documents for a function that takes none."""
    return not (provider == "gemini" and not parameters.get("properties") and parameters.get("type") == "object")


def _is_map(schema: dict[str, Any]) -> bool:
    extra = schema.get("additionalProperties")
    return bool(schema.get("patternProperties")) or (isinstance(extra, dict) and bool(extra))


def strict_profile_copy(schema: dict[str, Any], tool_name: str, provider: str) -> dict[str, Any]:
    """The strict copy for ``provider`` (see "Strict tools" in the module docstring)."""
    refusal = strict_refusal(tool_name, provider)
    if refusal:
        raise ToolDefinitionError(refusal)
    if provider == "openai" or not _needs_profile(schema, "anthropic", strict=True):
        return schema
    root = copy.deepcopy(schema)
    conv = _Copy(root, tool_name, "anthropic")
    conv.const_enum = provider == "any"
    return conv.walk(root, ())  # type: ignore[no-any-return]


def strict_refusal(tool_name: str, provider: str) -> str | None:
    """Why a strict tool cannot be sent under ``provider`` (None when it can): strict mode is
    OpenAI's and its copy closes every object with ``additionalProperties: false``, which Gemini
    refuses (G4). Under ``gemini`` and ``any`` (whose copy keeps Gemini's rules too) the definition
    is refused; callers that can do without strict mode fall back to ``strict=False``."""
    if provider not in ("gemini", "any"):
        return None
    scope = "" if provider == "gemini" else ", and the default profile 'any' keeps Gemini's rules"
    return (
        f"tool {tool_name!r}: field '<root>' (schema path /additionalProperties) cannot be strict with "
        f"AGENT_MODEL_PROVIDER={provider}: strict mode is OpenAI's and its copy needs additionalProperties: false "
        f"on every object, which Gemini refuses (rule G4){scope}. Define the tool with strict=False, or set "
        "AGENT_MODEL_PROVIDER=openai (or anthropic) when that is the one provider in use"
    )


def _needs_profile(schema: dict[str, Any], provider: str, strict: bool = False) -> bool:
    """A cheap scan: whether any node has something a rule of ``provider`` rewrites."""
    gemini = provider in ("gemini", "any") and not strict
    if gemini and "properties" in schema and not schema["properties"]:
        return True  # G10
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
        if gemini and needs_objects_rule(node, node is schema):
            return True  # G10 below the root, G12
        if gemini and node.get("type") == "array":
            items = node.get("items")
            if not isinstance(items, dict) or not (isinstance(items.get("type"), str) or items.get("anyOf")):
                return True  # G5 refuses it
        if gemini and isinstance(node.get("anyOf"), list) and set(node) - {"anyOf"}:
            return True  # G11
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
