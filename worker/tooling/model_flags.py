"""What argument validation needs to know about a pydantic tool's model, computed once per model.

- ``fast_path(model)``: what the one-pass happy path of ``worker.tooling.arguments`` needs of the
  model, as ``(validate_json, open_keys, bounded_depth)``: ``validate_json`` is ``None`` when a field
  takes a float (the path is never taken), ``open_keys`` that a call takes it only without a markup
  hint, ``bounded_depth`` that the model's schema bounds the nesting (else the text's brackets are
  counted: text nested deeper than ``MAX_NESTING_DEPTH`` must reach the checked path);
- ``accepted_names(model)``: every top-level key the model takes (field names and aliases), so a
  field name beside its alias is never taken for a respelled parameter.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from worker.tooling.json_checks import MAX_NESTING_DEPTH
from worker.tooling.markup import markup_hinted


@functools.lru_cache(maxsize=1024)
def accepted_names(model: type) -> frozenset[str]:
    """Every top-level key a pydantic ``model`` takes: field names, aliases and validation aliases."""
    names: set[str] = set()
    for name, field in getattr(model, "model_fields", {}).items():
        names.add(name)
        if isinstance(field.alias, str):
            names.add(field.alias)
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        else:
            for choice in getattr(alias, "choices", ()) or ():
                if isinstance(choice, str):
                    names.add(choice)
    return frozenset(names)


FastPath = tuple[Callable[..., Any] | None, bool, bool]
"""``(validate_json, open_keys, bounded_depth)``: see ``fast_path``."""

FAST_PATHS: dict[type, FastPath] = {}
"""``fast_path``'s cache, read directly on every call (``FAST_PATHS.get(model) or fast_path(model)``)."""


def fast_path(model: type) -> FastPath:
    """What the one-pass happy path needs of ``model``, computed once per model class:

    - ``validate_json``: the model's own ``__pydantic_validator__.validate_json`` (bound), or
      ``None`` when a field can take a float: pydantic-core accepts what JSON forbids (``NaN``,
      ``Infinity``, ``1e400``) there, so every call takes the checked path, which parses with orjson;
    - ``open_keys``: some object takes keys it does not declare, so ``extra="forbid"`` does not see a
      markup key there: a call takes the path only when its text has no markup hint;
    - ``bounded_depth``: no value nested deeper than ``MAX_NESTING_DEPTH`` can validate, so the
      text's brackets need not be counted (``_bounded_depth``).
    """
    found = FAST_PATHS.get(model)
    if found is None:
        if len(FAST_PATHS) > 4096:
            FAST_PATHS.clear()
        validate = model.__pydantic_validator__.validate_json if _no_float_fields(model) else None  # type: ignore[attr-defined]
        found = FAST_PATHS[model] = (validate, _open_keys(model), _bounded_depth(model))
    return found


def fast_path_eligible(model: type, raw: str) -> bool:
    """Whether ``raw`` may take the one-pass happy path for ``model`` (after the text tests of
    ``worker.tooling.arguments``): the model has no field that takes a float, a model with open
    maps only when the text has no markup hint, and nesting within ``MAX_NESTING_DEPTH`` (proved by
    the model's schema, or by the text's brackets). ``validate_tool_arguments`` inlines this test."""
    validate, open_keys, bounded = FAST_PATHS.get(model) or fast_path(model)
    if validate is None or open_keys and markup_hinted(raw):
        return False
    return bounded or len(raw) <= MAX_NESTING_DEPTH or raw.count("[") + raw.count("{") <= MAX_NESTING_DEPTH


def _bounded_depth(model: type) -> bool:
    """True when no JSON value nested deeper than ``MAX_NESTING_DEPTH`` can validate against
    ``model``: its schema has no recursion (a ``$ref`` reached again), no value that takes anything
    (``Any``, ``true``, an untyped node, ``additionalProperties: true``), and its own depth is
    within the limit. Cached per model class (``FAST_PATHS``)."""
    try:
        schema = model.model_json_schema()  # type: ignore[attr-defined]  # a pydantic model class
    except Exception:
        return False
    defs = schema.get("$defs") or {}

    def depth(node: Any, refs: frozenset[str]) -> int | None:
        if node is True or not isinstance(node, dict):
            return None if node is True else 0
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name in refs or name not in defs:
                return None  # recursion (or a ref not into $defs): no bound
            return depth(defs[name], refs | {name})
        t = node.get("type")
        if t is None and not any(k in node for k in ("anyOf", "oneOf", "allOf", "enum", "const")):
            return None  # untyped: any value, any depth
        subs = list((node.get("properties") or {}).values()) + list((node.get("patternProperties") or {}).values())
        subs += [node[k] for k in ("items", "additionalProperties") if k in node and node[k] is not False]
        subs += [v for k in ("anyOf", "oneOf", "allOf", "prefixItems") for v in node.get(k) or []]
        deepest = 0
        for sub in subs:
            d = depth(sub, refs)
            if d is None:
                return None
            deepest = max(deepest, d)
        return deepest + (1 if t in ("object", "array") or isinstance(t, list) else 0)

    found = depth(schema, frozenset())
    return found is not None and found <= MAX_NESTING_DEPTH


def _open_keys(model: type) -> bool:
    """True when some object of ``model`` takes keys it does not declare (``extra="allow"``,
    ``dict[str, X]``, ``patternProperties``): markup keys there pass ``extra="forbid"``."""
    try:
        schema = model.model_json_schema()  # type: ignore[attr-defined]
    except Exception:
        return True
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            extra = node.get("additionalProperties")
            if extra is True or isinstance(extra, dict) or "patternProperties" in node:
                return True
            if node.get("type") == "object" and "properties" not in node and extra is not False:
                return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def _no_float_fields(model: type) -> bool:
    """True when no field of ``model`` (at any depth) can take a float: no ``number``
    type and no schema that accepts anything (``Any``, ``true``, open ``additionalProperties``).
    Cached per model class (``FAST_PATHS``)."""

    def walk(node: Any) -> bool:
        if node is True:
            return False  # accepts anything
        if not isinstance(node, dict):
            return True
        t = node.get("type")
        if t == "number" or (isinstance(t, list) and "number" in t):
            return False
        if t is None and not any(k in node for k in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not")):
            return False  # untyped: Any
        for key in ("properties", "$defs", "definitions", "patternProperties"):
            if not all(walk(v) for v in (node.get(key) or {}).values()):
                return False
        for key in ("items", "additionalProperties", "contains"):
            if key in node and not walk(node[key]):
                return False
        return all(walk(v) for key in ("anyOf", "oneOf", "allOf", "prefixItems") for v in node.get(key) or [])

    try:
        return walk(model.model_json_schema())  # type: ignore[attr-defined]  # a pydantic model class
    except Exception:
        return False
