"""What argument validation needs to know about a pydantic tool's model, computed once per model.

- ``fast_path_eligible(model, raw)``: whether a call may take the one-pass happy path of
  ``worker.tooling.arguments`` (no field that takes a float; a model with open maps only when the
  text has no markup hint; text nested deeper than ``MAX_NESTING_DEPTH`` never, which a model whose
  schema bounds the depth proves without counting the text's brackets);
- ``accepted_names(model)``: every top-level key the model takes (field names and aliases), so a
  field name beside its alias is never taken for a respelled parameter.
"""

from __future__ import annotations

import functools
from typing import Any

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


_FLAGS: dict[type, tuple[bool, bool, bool]] = {}


def fast_path_eligible(model: type, raw: str) -> bool:
    """Whether ``raw`` may take the one-pass happy path for ``model`` (after the text tests):
    the model has no field that takes a float, and when it has open maps (keys it does not
    declare are valid there, so ``extra="forbid"`` does not see them) the text has no markup hint."""
    flags = _FLAGS.get(model)
    if flags is None:
        if len(_FLAGS) > 4096:
            _FLAGS.clear()
        flags = _FLAGS[model] = (_no_float_fields(model), _open_keys(model), _bounded_depth(model))
    if not flags[0] or flags[1] and markup_hinted(raw):
        return False
    # Nesting over the limit must reach the checked path (which refuses it): a model whose values
    # cannot nest that deep refuses such text itself, else the text's brackets bound its depth.
    return flags[2] or len(raw) <= MAX_NESTING_DEPTH or raw.count("[") + raw.count("{") <= MAX_NESTING_DEPTH


def _bounded_depth(model: type) -> bool:
    """True when no JSON value nested deeper than ``MAX_NESTING_DEPTH`` can validate against
    ``model``: its schema has no recursion (a ``$ref`` reached again), no value that takes anything
    (``Any``, ``true``, an untyped node, ``additionalProperties: true``), and its own depth is
    within the limit. Cached per model class (``_FLAGS``)."""
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
    Cached per model class (``_FLAGS``)."""

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
