"""Schema collection: from ``WorkerTool`` to OpenAI Responses tool definitions.

- A pydantic ``input_model`` becomes its ``model_json_schema()``; the root must
  be an object (OpenAI: "function tool parameters must use a root object
  schema").
- A raw ``json_schema`` is sent exactly as given (``minimum``, ``maximum`` and
  every other keyword intact) unless the tool asks for ``strict``, in which
  case the strict copy from ``worker.tooling.strict`` is sent. Validation always runs
  against the tool's own model or raw schema, never the strict copy.
- A raw schema must be a valid JSON Schema and every ``$ref`` in it must be
  local and resolve (``_check_refs``), checked at definition time: nothing
  is ever fetched, so a remote or dangling ref could never validate a call.
- ``strict`` is always sent explicitly: the Responses API treats a missing
  ``strict`` as true.

Definitions are cached per tool definition (name, description, flags and
schema identity), so re-assembling the same tools every turn is cheap.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Protocol
from urllib.parse import unquote, urljoin

import jsonschema
import orjson
from pydantic import BaseModel

from worker.tooling.errors import ToolDefinitionError
from worker.tooling.provider_choice import current_choice
from worker.tooling.strict import field_name, to_strict_schema
from worker.tooling.validators import CompiledValidator, compile_validator
from worker.tooling.wire import check_root, pointer, wire_copy
from worker.tooling.wire_profiles import profile_copy, sends_parameters, strict_profile_copy


class ToolSpec(Protocol):
    """What schema collection reads of a tool (``worker.tooling.contract.WorkerTool`` has it all):
    its name, description, input schema (a pydantic model, a raw JSON Schema, or neither) and
    provider flags. A protocol, so that this module needs nothing of the contract module, which
    calls it to check a tool when it is defined."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def input_model(self) -> type[BaseModel] | None: ...
    @property
    def json_schema(self) -> dict[str, Any] | None: ...
    @property
    def strict(self) -> bool: ...
    @property
    def namespace(self) -> str | None: ...
    @property
    def namespace_description(self) -> str | None: ...
    @property
    def defer_loading(self) -> bool: ...


_PARAMS_CACHE: dict[tuple[object, ...], dict[str, Any]] = {}
_DEF_CACHE: dict[tuple[object, ...], dict[str, Any]] = {}
_CACHE_LIMIT = 4096
# Per tool object (a WorkerTool is frozen and hashed by identity): the definition and the
# validation info, so a turn that re-assembles the same tools does dict lookups only.
# A raw ``json_schema`` must not be mutated after ``define_worker_tool``.
_DEF_BY_TOOL: "weakref.WeakKeyDictionary[ToolSpec, dict[str, dict[str, Any]]]" = weakref.WeakKeyDictionary()
# Validation info per tool object, read on every call: keyed by ``id(tool)`` and checked against a
# weak reference, whose callback drops the entry when the tool goes (a ``WeakKeyDictionary`` lookup
# builds a new weak reference each time: 0.2-0.5 us, a tenth of ``validate_json``'s own time).
_INFO_BY_ID: "dict[int, tuple[weakref.ref[ToolSpec], ValidationInfo]]" = {}
# ... and per schema content (``_schema_key``: a model class, or a raw schema's canonical JSON).
_INFO_BY_SCHEMA: dict[tuple[object, ...], ValidationInfo] = {}

EMPTY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def _schema_key(tool: ToolSpec) -> tuple[object, ...]:
    if tool.input_model is not None:
        return ("model", tool.input_model)
    if tool.json_schema is not None:
        # The raw dict may be a shared constant or built per turn: key on content.
        return ("raw", orjson.dumps(tool.json_schema, option=orjson.OPT_SORT_KEYS))
    return ("empty",)


def source_schema(tool: ToolSpec) -> dict[str, Any]:
    """The tool's own parameters schema (before any strict projection).

    Returns a dict; raises ``ToolDefinitionError`` if the root is not an
    object or a raw schema is not a valid JSON Schema (Draft 2020-12 meta-schema).
    """
    key = (_schema_key(tool), tool.name)
    cached = _PARAMS_CACHE.get(key)
    if cached is not None:
        return cached
    if tool.input_model is not None:
        schema = tool.input_model.model_json_schema()
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/") and set(schema) <= {"$ref", "$defs"}:
            # a self-referencing model: pydantic puts the root behind a $ref; the root must be an object
            defs = schema.get("$defs", {})
            schema = {**defs.get(ref[len("#/$defs/") :], {}), "$defs": defs}
    elif tool.json_schema is not None:
        schema = tool.json_schema
        if not isinstance(schema, dict):
            raise ToolDefinitionError(f"tool {tool.name!r}: json_schema must be a JSON object")
        validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            validator_cls.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise ToolDefinitionError(_invalid_schema(tool.name, schema, exc)) from exc
        _check_refs(schema, tool.name)
    else:
        schema = EMPTY_OBJECT_SCHEMA
    check_root(schema, tool.name, _resolver(schema))  # P1: raises naming a root combinator
    if len(_PARAMS_CACHE) > _CACHE_LIMIT:
        _PARAMS_CACHE.clear()
    _PARAMS_CACHE[key] = schema
    return schema


def _invalid_schema(tool_name: str, schema: dict[str, Any], exc: jsonschema.SchemaError) -> str:
    """The definition error for a schema its own draft refuses, naming the field, the schema path
    and the keyword (a draft-4 boolean ``exclusiveMinimum`` under a 2020-12 ``$schema`` gets a hint)."""
    path = tuple(exc.absolute_path)
    draft = schema.get("$schema", "draft 2020-12 (no $schema)")
    text = (
        f"tool {tool_name!r}: json_schema is not a valid JSON Schema ({draft}): field {field_name(path)!r} "
        f"(schema path {pointer(path)}): {exc.message}"
    )
    if path and path[-1] in ("exclusiveMinimum", "exclusiveMaximum") and isinstance(exc.instance, bool):
        bound = "minimum" if path[-1] == "exclusiveMinimum" else "maximum"
        text += (
            f"; a boolean {path[-1]} is draft 4's form (it makes {bound} exclusive): from draft 6 on it is the "
            f"bound itself, so write {path[-1]}: <the {bound}> and drop {bound}, or declare draft 4 in $schema"
        )
    return text


_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "contentSchema",
)


def _schema_nodes(root: Any) -> Iterator[tuple[dict[str, Any], tuple[Any, ...]]]:
    """Every sub-schema of ``root`` with its path (iterative; only schema positions, so a
    ``$ref`` key inside ``enum``/``const``/``default``/``examples`` data is not taken for one)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict):
            continue
        yield node, path
        for key in _SCHEMA_MAPS:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.extend((v, path + (key, name)) for name, v in sub.items())
        for key in _SCHEMA_LISTS:
            sub = node.get(key)
            if isinstance(sub, list):
                stack.extend((v, path + (key, i)) for i, v in enumerate(sub))
        for key in _SCHEMA_ONE:
            sub = node.get(key)
            if isinstance(sub, dict):
                stack.append((sub, path + (key,)))
            elif key == "items" and isinstance(sub, list):  # draft 4-7 tuple form
                stack.extend((v, path + (key, i)) for i, v in enumerate(sub))


def _pointer_target(root: Any, pointer: str) -> Any:
    """The node at a JSON pointer (``/a/b``), or ``_MISSING``."""
    node = root
    if not pointer:
        return node
    if not pointer.startswith("/"):
        return _MISSING
    for part in pointer[1:].split("/"):
        part = unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


_MISSING = object()


def _check_refs(schema: dict[str, Any], tool_name: str) -> None:
    """Every ``$ref``/``$dynamicRef`` must be local and resolve, else ``ToolDefinitionError``.

    Local means a fragment into this schema: ``#``, a JSON pointer ``#/...``, or
    ``#name`` naming an ``$anchor``/``$dynamicAnchor`` (or a draft-7 ``$id: "#name"``);
    a ref to the root's own ``$id`` with such a fragment also counts. Remote refs
    (``other.json#/x``, ``http://...``) are refused: validation never fetches
    anything, so such a tool could never validate a call.
    """
    nodes = list(_schema_nodes(schema))
    anchors = set()
    for node, _ in nodes:
        for key in ("$anchor", "$dynamicAnchor"):
            if isinstance(node.get(key), str):
                anchors.add(node[key])
        if isinstance(node.get("$id"), str) and node["$id"].startswith("#"):
            anchors.add(node["$id"][1:])
    root_id = schema.get("$id") if isinstance(schema.get("$id"), str) else None
    for node, path in nodes:
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if key not in node:
                continue
            where = f"tool {tool_name!r}: field {field_name(path)!r} (schema path /{'/'.join(map(str, path))})"
            if not isinstance(ref, str):
                raise ToolDefinitionError(f"{where} has a {key} that is not a string")
            base, _, fragment = ref.partition("#")
            if base and not (root_id and urljoin(root_id, base) == root_id.partition("#")[0]):
                raise ToolDefinitionError(
                    f"{where} has the non-local {key} {ref!r}; only refs into the schema itself "
                    "('#/$defs/...', '#anchor') are supported (nothing is fetched)"
                )
            fragment = unquote(fragment)
            if fragment and not fragment.startswith("/"):
                target = schema if fragment in anchors else _MISSING
                if target is _MISSING:
                    raise ToolDefinitionError(f"{where} has a {key} {ref!r} to an anchor that does not exist")
                continue
            target = _pointer_target(schema, fragment)
            if target is _MISSING:
                raise ToolDefinitionError(f"{where} has a {key} {ref!r} that does not resolve in the schema")
            if not isinstance(target, (dict, bool)):
                raise ToolDefinitionError(f"{where} has a {key} {ref!r} that points to a non-schema")


def current_provider() -> str:
    """The provider profile in use (``AGENT_MODEL_PROVIDER``, else ``worker.tooling.provider_choice``'s
    guess: ``openai`` unless the endpoint is a known provider's)."""
    return current_choice().provider


def parameters_schema(tool: ToolSpec, provider: str | None = None) -> dict[str, Any]:
    """The ``parameters`` sent to the provider: the strict copy (``worker.tooling.strict``), or the
    wire copy (``worker.tooling.wire``: the source schema itself unless a provider rule changes it),
    kept to the rules of ``provider`` (default: ``current_provider()``; ``worker.tooling.wire_profiles``).
    Raises ``ToolDefinitionError`` naming the field and the rule where a copy cannot keep them."""
    provider = provider or current_provider()
    schema = source_schema(tool)
    key = ("strict" if tool.strict else "wire", _schema_key(tool), tool.name, provider)
    cached = _PARAMS_CACHE.get(key)
    if cached is None:
        if tool.strict:
            cached = strict_profile_copy(to_strict_schema(schema, tool_name=tool.name), tool.name, provider)
        else:
            cached = profile_copy(wire_copy(schema, tool.name, _resolver(schema)), tool.name, provider)
        _PARAMS_CACHE[key] = cached
    return cached


def function_definition(tool: ToolSpec, provider: str | None = None) -> dict[str, Any]:
    """The Responses API function tool for ``tool``, its parameters kept to ``provider``'s rules
    (default: the profile in use).

    Shape: ``{"type": "function", "name", "description", "parameters",
    "strict"}`` plus ``"defer_loading": true`` for deferred tools; without ``parameters`` for a tool
    that takes no arguments under ``gemini`` (rule G10, ``worker.tooling.wire_profiles``). The dict
    is cached and shared: callers must not mutate it.
    """
    provider = provider or current_provider()
    by_provider = _DEF_BY_TOOL.get(tool)
    cached = by_provider.get(provider) if by_provider is not None else None
    if cached is not None:
        return cached
    key = (_schema_key(tool), tool.name, tool.description, tool.strict, tool.defer_loading, provider)
    cached = _DEF_CACHE.get(key)
    if cached is not None:
        _DEF_BY_TOOL.setdefault(tool, {})[provider] = cached
        return cached
    parameters = parameters_schema(tool, provider)
    definition: dict[str, Any] = {"type": "function", "name": tool.name, "description": tool.description}
    if sends_parameters(parameters, provider):
        definition["parameters"] = parameters
    definition["strict"] = tool.strict
    if tool.defer_loading:
        definition["defer_loading"] = True
    if len(_DEF_CACHE) > _CACHE_LIMIT:
        _DEF_CACHE.clear()
    _DEF_CACHE[key] = definition
    _DEF_BY_TOOL.setdefault(tool, {})[provider] = definition
    return definition


def collect_tool_definitions(
    tools: Iterable[ToolSpec], *, loaded: Iterable[str] = (), provider: str | None = None
) -> list[dict[str, Any]]:
    """The ``tools`` array of a Responses request, in assembly order.

    - Tools without a namespace become function tools.
    - Tools sharing a namespace are grouped into one
      ``{"type": "namespace", "name", "description", "tools": [...]}`` entry,
      placed where the first of them stands.
    - Deferred tools (``defer_loading``) are left out unless their name is in
      ``loaded`` (chosen by the tool-search tool earlier in the turn).

    Raises ``ToolDefinitionError`` on duplicate tool names.
    """
    loaded_set = set(loaded)
    provider = provider or current_provider()
    out: list[dict[str, Any]] = []
    namespaces: dict[str, dict[str, Any]] = {}
    seen: set[str] = set()
    for tool in tools:
        if tool.name in seen:
            raise ToolDefinitionError(f"duplicate tool name {tool.name!r} in the turn's tool set")
        seen.add(tool.name)
        if tool.defer_loading and tool.name not in loaded_set:
            continue
        definition = function_definition(tool, provider)
        if tool.defer_loading:
            definition = {k: v for k, v in definition.items() if k != "defer_loading"}
        if tool.namespace:
            ns = namespaces.get(tool.namespace)
            if ns is None:
                ns = {
                    "type": "namespace",
                    "name": tool.namespace,
                    "description": tool.namespace_description or tool.namespace,
                    "tools": [],
                }
                namespaces[tool.namespace] = ns
                out.append(ns)
            elif tool.namespace_description and ns["description"] == tool.namespace:
                ns["description"] = tool.namespace_description
            ns["tools"].append(definition)
        else:
            out.append(definition)
    return out


# ---- validation info -------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationInfo:
    """What argument validation needs about a tool, computed once per tool object.

    - ``schema``: the tool's own (source) parameters schema.
    - ``properties``: its top-level ``properties`` (``{}`` when none).
    - ``validator``: a compiled validator for raw-schema tools
      (``worker.tooling.validators.CompiledValidator``; ``None`` for pydantic
      tools, which validate with their model).
    - ``engine``: what validates the calls: ``"pydantic"``, ``"jsonschema-rs"``,
      or ``"jsonschema (fallback: <why jsonschema-rs could not compile it>)"``.
    - ``resolve``: returns a sub-schema with a local ``$ref`` resolved.
    - ``integers``: the schema names the type ``integer`` somewhere (a raw-schema tool's
      integral floats are then made integers: ``worker.tooling.coercion.whole_numbers``).
    """

    schema: dict[str, Any]
    properties: dict[str, Any]
    validator: CompiledValidator | None
    resolve: Callable[[Any], Any]
    engine: str = "pydantic"
    integers: bool = False


def _resolver(root: dict[str, Any]) -> Callable[[Any], Any]:
    def resolve(node: Any) -> Any:
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#"):
            seen += 1
            if seen > 32:
                break
            target: Any = root
            ref = node["$ref"]
            for part in ref[2:].split("/") if ref not in ("#", "#/") else []:
                part = unquote(part).replace("~1", "/").replace("~0", "~")
                if not isinstance(target, dict) or part not in target:
                    return node
                target = target[part]
            node = target
        return node

    return resolve


def _new_validation_info(tool: ToolSpec) -> ValidationInfo:
    if tool.input_model is not None:
        schema = source_schema(tool)
        validator = None
    else:
        # no schema: any object validates, as before (the definition sends EMPTY_OBJECT_SCHEMA)
        schema = tool.json_schema if tool.json_schema is not None else {"type": "object"}
        validator = compile_validator(schema)
    props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
    return ValidationInfo(
        schema=schema,
        properties=props,
        validator=validator,
        resolve=_resolver(schema),
        engine=validator.engine if validator is not None else "pydantic",
        integers=b'"integer"' in orjson.dumps(schema),
    )


def validation_info(tool: ToolSpec) -> ValidationInfo:
    """Cached ``ValidationInfo`` for ``tool`` (see the class docstring), kept while the tool lives."""
    entry = _INFO_BY_ID.get(id(tool))
    if entry is not None and entry[0]() is tool:
        return entry[1]
    # A category creator defines its tools again for every call: a new tool object with the same
    # schema shares the info (a raw schema's validator compiled once, not per call: 60 us per call).
    try:
        content = _schema_key(tool)
    except (TypeError, orjson.JSONEncodeError):  # not JSON: refused at definition; not shared
        content = None
    info = _INFO_BY_SCHEMA.get(content) if content is not None else None
    if info is None:
        info = _new_validation_info(tool)
        if content is not None:
            if len(_INFO_BY_SCHEMA) > _CACHE_LIMIT:
                _INFO_BY_SCHEMA.clear()
            _INFO_BY_SCHEMA[content] = info
    key = id(tool)

    def forget(ref: "weakref.ref[ToolSpec]") -> None:
        # the tool is gone: drop its entry unless a newer tool (reusing the id) replaced it
        if _INFO_BY_ID.get(key, (None,))[0] is ref:
            _INFO_BY_ID.pop(key, None)

    _INFO_BY_ID[key] = (weakref.ref(tool, forget), info)
    return info
