"""A workflow task's result schema: checked at start, wrapped for ``submit_result``, and re-validated at commit.

``check_result_schema`` refuses what could never validate (remote or dynamic refs,
non-object roots); ``submit_result_schema`` wraps the task's schema for the strict
``submit_result`` tool, keeping the meaning of refs to the task schema's root;
``result_errors`` validates a submitted value against the persisted schema (run again
at commit time, ``worker.records.workflow``, whatever the tool already checked).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any, Callable
from urllib.parse import unquote

import jsonschema
import orjson
import referencing.exceptions
import referencing.jsonschema
from jsonschema.protocols import Validator
from referencing import Registry

from worker.errors import AgentRuntimeError
from worker.tooling.errors import ToolDefinitionError

FINISH_TOOL = "submit_result"
MAX_SCHEMA_CHARS = 50_000


class WorkflowError(AgentRuntimeError, ValueError):
    """A refused workflow operation: bad schema or parameters, unknown task, wrong status for the operation."""


_SUBSCHEMA_ONE = (
    "items",
    "additionalItems",
    "additionalProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
)
_SUBSCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_SUBSCHEMA_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies")
_HOISTED = ("$defs", "definitions")
_DYNAMIC_REFS = ("$dynamicRef", "$recursiveRef")
RESULT_DEF = "result"


def _subschemas(node: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """``(relative path, subschema)`` for each direct subschema of a schema node."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    if not isinstance(node, dict):
        return out
    for key in _SUBSCHEMA_ONE:
        if isinstance(node.get(key), (dict, bool)):
            out.append(((key,), node[key]))
    for key in _SUBSCHEMA_LIST:
        if isinstance(node.get(key), list):
            out.extend(((key, i), sub) for i, sub in enumerate(node[key]) if isinstance(sub, (dict, bool)))
    for key in _SUBSCHEMA_MAP:
        if isinstance(node.get(key), dict):
            # dependencies: a value is a schema or a list of property names (not walked)
            out.extend(((key, name), sub) for name, sub in node[key].items() if isinstance(sub, (dict, bool)))
    return out


def _schema_nodes(node: Any, path: tuple[Any, ...] = ()) -> Any:
    """Every schema node under ``node`` (itself included) with its path, depth first."""
    yield path, node
    for rel, sub in _subschemas(node):
        yield from _schema_nodes(sub, path + rel)


def _map_refs(node: Any, fn: Callable[[str], str]) -> Any:
    """Schema ``node`` with every ``$ref`` string replaced by ``fn(ref)`` (schema positions only).

    Copies the dicts and lists on the way to each ``$ref``; other values are shared with ``node``
    (callers pass their own deep copy)."""
    if not isinstance(node, dict):
        return node
    out = dict(node)
    if isinstance(out.get("$ref"), str):
        out["$ref"] = fn(out["$ref"])
    for key in _SUBSCHEMA_ONE:
        if isinstance(node.get(key), dict):
            out[key] = _map_refs(node[key], fn)
    for key in _SUBSCHEMA_LIST:
        if isinstance(node.get(key), list):
            out[key] = [_map_refs(sub, fn) for sub in node[key]]
    for key in _SUBSCHEMA_MAP:
        if isinstance(node.get(key), dict):
            out[key] = {name: _map_refs(sub, fn) for name, sub in node[key].items()}
    return out


def _first_segment(ref: str) -> str | None:
    """The first JSON-pointer token of a local ``#/...`` ref, decoded (``None`` for other refs)."""
    if not ref.startswith("#/"):
        return None
    return unquote(ref[2:].split("/", 1)[0]).replace("~1", "/").replace("~0", "~")


def _where(path: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(p) for p in path) if path else "<root>"


def _root_resolver(schema: dict[str, Any], cls: type[Validator]) -> Any:
    """A ``referencing`` resolver at ``schema``'s root (its draft): ``lookup(ref)`` as ``jsonschema`` does."""
    spec = referencing.jsonschema.specification_with(
        cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id") or "", default=referencing.jsonschema.DRAFT202012
    )
    return Registry().resolver_with_root(spec.create_resource(schema))


def _check_refs(
    schema: dict[str, Any], cls: Any, what: str
) -> None:  # the draft's class: its ID_OF is not in the stubs' Validator
    """Refuse refs the wrapper cannot carry: non-local, anchors, dynamic refs, nested ``$id``, unresolvable."""
    resolver = _root_resolver(schema, cls)
    for path, node in _schema_nodes(schema):
        if not isinstance(node, dict):
            continue
        if path and cls.ID_OF(node) is not None:
            raise WorkflowError(
                f"{what} declares an $id at {_where(path)}; only the root may have one "
                "(refs are rewritten relative to the root when the schema is wrapped)"
            )
        for key in _DYNAMIC_REFS:
            if key in node:
                raise WorkflowError(f"{what} uses {key} at {_where(path)}; only $ref is supported")
        ref = node.get("$ref")
        if not isinstance(ref, str):
            continue
        if ref != "#" and not ref.startswith("#/"):
            kind = "an anchor" if ref.startswith("#") else "a non-local"
            raise WorkflowError(
                f"{what} has {kind} $ref {ref!r} at {_where(path)}; only local refs are "
                "supported: '#' or a JSON pointer such as '#/$defs/Name' or '#/properties/a'"
            )
        try:
            target = resolver.lookup(ref).contents
        except (referencing.exceptions.Unresolvable, LookupError, ValueError) as exc:
            raise WorkflowError(
                f"{what} has a $ref {ref!r} at {_where(path)} that does not resolve ({exc.__class__.__name__})"
            ) from None
        if not isinstance(target, (dict, bool)):
            raise WorkflowError(
                f"{what} has a $ref {ref!r} at {_where(path)} that points to a {type(target).__name__}, not a schema"
            )


def check_result_schema(schema: Any) -> dict[str, Any]:
    """Check a task's result schema; returns it (a deep copy).

    Raises ``WorkflowError`` when: it is not a JSON object; it is not a valid
    JSON Schema (its own ``$schema`` draft, Draft 2020-12 by default, checked
    against the meta-schema); it is larger than ``MAX_SCHEMA_CHARS`` once
    serialized; or it has a ``$ref`` the ``submit_result`` wrapper cannot
    carry: not local (``other.json#...``), an anchor (``#name``), one that does
    not resolve or resolves to a non-schema, ``$dynamicRef`` /
    ``$recursiveRef``, or an ``$id`` below the root. Local refs are
    supported: ``#`` (recursion on the whole result), ``#/$defs/...``,
    ``#/definitions/...`` and any other pointer into the schema
    (``#/properties/a``); ``submit_result_schema`` rewrites them.
    """
    if not isinstance(schema, dict):
        raise WorkflowError("result_schema must be a JSON Schema object")
    size = len(orjson.dumps(schema))
    if size > MAX_SCHEMA_CHARS:
        raise WorkflowError(f"result_schema is {size} characters; the limit is {MAX_SCHEMA_CHARS}")
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise WorkflowError(f"result_schema is not a valid JSON Schema at {where}: {exc.message}") from None
    _check_refs(schema, cls, "result_schema")
    # the wrapper's refs must resolve too (they always should: this guards the rewriting itself)
    wrapper = submit_result_schema(schema)
    _check_refs(
        wrapper,
        jsonschema.validators.validator_for(wrapper, default=jsonschema.Draft202012Validator),
        "submit_result's wrapped schema",
    )
    return copy.deepcopy(schema)


def submit_result_schema(result_schema: dict[str, Any]) -> dict[str, Any]:
    """The raw parameters schema of ``submit_result``: the task schema wrapped under ``result``.

    Shape: ``{"type": "object", "properties": {"result": <task schema>},
    "required": ["result"], "additionalProperties": false}``. The task schema's
    ``$defs`` / ``definitions`` and ``$schema`` move to the wrapper's root (so
    ``#/$defs/...`` refs still resolve); a root ``$id`` is dropped.

    When the task schema refers to its own root (``#``, recursion on the whole
    result) or into it (``#/properties/a``...), those refs would point at the
    wrapper: the task schema then moves to the wrapper's ``$defs.result``
    (``result_1``... if the task already defines ``result``), its refs and
    the hoisted definitions' refs are rewritten (``#`` -> ``#/$defs/result``,
    ``#/properties/a`` -> ``#/$defs/result/properties/a``; ``#/$defs/X`` and
    ``#/definitions/X`` are kept), and ``properties.result`` is
    ``{"$ref": "#/$defs/result", "description": ...}``. The wrapper then
    accepts ``{"result": v}`` exactly when the task schema accepts ``v``.
    """
    inner = copy.deepcopy(result_schema)
    root: dict[str, Any] = {}
    if "$schema" in inner:
        root["$schema"] = inner.pop("$schema")
    cls = jsonschema.validators.validator_for(result_schema, default=jsonschema.Draft202012Validator)
    inner.pop("$id", None)
    # ID_OF is on every class jsonschema.validators.create builds; the stubs' Validator protocol omits it.
    if cls.ID_OF(inner) is not None:  # type: ignore[attr-defined]  # draft 3/4 "id"
        inner.pop("id", None)
    hoisted = [key for key in _HOISTED if isinstance(inner.get(key), dict)]
    for key in _HOISTED:
        if key in inner:
            root[key] = inner.pop(key)
    description = "The task's result; it must match the task's result schema."

    name = RESULT_DEF
    existing: dict[str, Any] = root["$defs"] if isinstance(root.get("$defs"), dict) else {}
    n = 0
    while name in existing:
        n += 1
        name = f"{RESULT_DEF}_{n}"
    target = f"#/$defs/{name}"

    def rewrite(ref: str) -> str:
        if ref == "#":
            return target
        first = _first_segment(ref)
        if first is None or first in hoisted:
            return ref
        return target + ref[1:]

    refs = [
        node["$ref"]
        for _, node in _schema_nodes({**inner, **{k: root[k] for k in hoisted}})
        if isinstance(node, dict) and isinstance(node.get("$ref"), str)
    ]
    if any(rewrite(r) != r for r in refs):
        for key in hoisted:
            root[key] = {d: _map_refs(sub, rewrite) for d, sub in root[key].items()}
        inner = _map_refs(inner, rewrite)
        root["$defs"] = {**root.get("$defs", {}), name: inner}
        # the description sits next to the $ref only (not on every recursive occurrence)
        result: dict[str, Any] = {"$ref": target, "description": inner.get("description", description)}
    else:
        inner.setdefault("description", description)
        result = inner
    root.update(
        {"type": "object", "properties": {"result": result}, "required": ["result"], "additionalProperties": False}
    )
    return root


def strict_plan(result_schema: dict[str, Any], provider: str | None = None) -> tuple[bool, str | None]:
    """Whether ``submit_result`` can be sent in strict mode under ``provider`` (default: the
    profile in use, ``AGENT_MODEL_PROVIDER``): ``(True, None)`` or ``(False, reason)``.

    The reason is ``worker.tooling.strict``'s error (it names the field and the
    strict-mode rule, e.g. an open map ``dict[str, X]``), or the profile's
    (``worker.tooling.wire_profiles.strict_refusal``: ``gemini`` and ``any`` carry no strict mode).
    Raises ``WorkflowError`` when the tool cannot be sent without strict mode either: the profile
    in use refuses the schema (e.g. a recursive one under ``any`` or ``gemini``, rule G3), so the
    task is refused at start rather than failing at its first step.
    """
    from worker.tooling.schemas import current_provider
    from worker.tooling.strict import to_strict_schema
    from worker.tooling.wire_profiles import strict_refusal

    try:
        to_strict_schema(submit_result_schema(result_schema), tool_name=FINISH_TOOL)
    except ToolDefinitionError as exc:
        _check_sendable(result_schema)
        return False, str(exc)
    refusal = strict_refusal(FINISH_TOOL, provider or current_provider())
    if refusal:
        _check_sendable(result_schema)
        return False, refusal
    return True, None


def _check_sendable(result_schema: dict[str, Any]) -> None:
    """``submit_result`` defined not strict under the profile in use, else ``WorkflowError``."""
    from worker.tooling.contract import ToolResult, define_worker_tool

    try:
        define_worker_tool(
            name=FINISH_TOOL,
            description="Submit the result.",
            execute=lambda params, ctx: ToolResult("ok"),
            json_schema=submit_result_schema(result_schema),
            strict=False,
        )
    except ToolDefinitionError as exc:
        raise WorkflowError(f"result_schema cannot be sent to the model: {exc}") from None


def _loc(parts: Iterable[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "<root>"


def result_errors(result_schema: dict[str, Any], value: Any) -> list[str]:
    """Validate ``value`` against ``result_schema`` itself, unwrapped (``jsonschema``, the schema's draft,
    formats checked).

    Returns ``[]`` when valid, else one ``"<field>: <message>"`` per failure,
    sorted (``<root>`` for the value itself).
    """
    cls = jsonschema.validators.validator_for(result_schema, default=jsonschema.Draft202012Validator)
    validator = cls(result_schema, format_checker=cls.FORMAT_CHECKER)
    errors = []
    for e in validator.iter_errors(value):
        errors.append(f"{_loc(list(e.absolute_path))}: {e.message}")
    return sorted(errors)
