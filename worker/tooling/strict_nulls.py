"""Strict-mode nulls: a ``null`` the strict copy made possible means "omitted".

OpenAI strict mode makes optional fields required and nullable
(``worker.tooling.strict``, rule D2); ``omit_nulls`` drops such a ``null`` again
before validation against the tool's own schema, at any depth.
"""

from __future__ import annotations

from typing import Any

from worker.tooling.strict import accepts_null

_MAX_NULL_WALK = 4 * 128
"""Bound on schema steps of the null walk (``$ref``/composition chains without data descent)."""


def _could_be(schema: dict[str, Any], kind: str) -> bool:
    t = schema.get("type")
    if t is not None:
        return t == kind or (isinstance(t, list) and kind in t)
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        return True
    if kind == "object":
        return "properties" in schema or "additionalProperties" in schema
    return "items" in schema or "prefixItems" in schema


def pick_branch(value: Any, branches: list[Any], resolve: Any) -> Any:
    """The ``anyOf``/``oneOf`` branch ``value`` was sent for, or ``None`` when none fits.

    A branch fits when it can have the value's JSON type and, for an object,
    declares every key the value has (the strict copy closes every object, so
    the model only sends declared keys) and agrees with every ``const``/``enum``
    property the value gives (discriminated unions). The first fitting branch wins.
    """
    kind = "object" if isinstance(value, dict) else "array"
    for b in branches:
        r = resolve(b)
        if not isinstance(r, dict) or not _could_be(r, kind):
            continue
        if kind == "object":
            props = r.get("properties")
            if isinstance(props, dict) and props:
                if not isinstance(r.get("additionalProperties"), dict) and any(k not in props for k in value):
                    continue
                clash = False
                for k, v in value.items():
                    sub = resolve(props.get(k))
                    if v is None or not isinstance(sub, dict):
                        continue
                    if ("const" in sub and sub["const"] != v) or (
                        isinstance(sub.get("enum"), list) and v not in sub["enum"]
                    ):
                        clash = True
                        break
                if clash:
                    continue
        return b
    return None


def omit_nulls(value: Any, schema: Any, resolve: Any, loc: str, dropped: list[str], steps: int = 0) -> Any:
    """Drop ``null`` for optional, non-nullable properties (strict-mode "omitted"), at any depth.

    The strict copy (``worker.tooling.strict``) makes every optional property required
    and nullable in every object it closes: top-level, nested, inside
    ``anyOf``/``oneOf``/``allOf`` branches, array ``items``/``prefixItems``,
    ``$ref`` targets in ``$defs`` and ``additionalProperties`` schemas. This
    walks the value next to the tool's own schema through all of those and
    drops a ``null`` only where that schema marks the property optional and not
    nullable (where the strict copy is what made it nullable). A union value
    follows the branch it fits (``pick_branch``). Returns the value unchanged
    (same object) when nothing was dropped.
    """
    if steps > _MAX_NULL_WALK or not isinstance(value, (dict, list)):
        return value
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return value
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for sub in all_of:
            value = omit_nulls(value, sub, resolve, loc, dropped, steps + 1)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            branch = pick_branch(value, branches, resolve)
            if branch is not None:
                value = omit_nulls(value, branch, resolve, loc, dropped, steps + 1)
    if isinstance(value, dict):
        return _omit_in_object(value, schema, resolve, loc, dropped, steps)
    return _omit_in_list(value, schema, resolve, loc, dropped, steps)


def _omit_in_object(
    value: dict[str, Any], schema: dict[str, Any], resolve: Any, loc: str, dropped: list[str], steps: int
) -> dict[str, Any]:
    """``omit_nulls`` for an object: its own optional nulls dropped, its values walked."""
    props = schema.get("properties")
    props = props if isinstance(props, dict) else {}
    extra = schema.get("additionalProperties")
    extra = extra if isinstance(extra, dict) else None
    if not props and extra is None:
        return value
    required = schema.get("required", ())
    out = None
    for key, v in value.items():
        sub = props.get(key, extra if key not in props else None)
        if sub is None:
            continue
        here = f"{loc}.{key}" if loc else key
        if v is None:
            if key in props and key not in required and not accepts_null(resolve(sub)):
                if out is None:
                    out = dict(value)
                del out[key]
                dropped.append(here)
        elif isinstance(v, (dict, list)):
            nv = omit_nulls(v, sub, resolve, here, dropped, steps + 1)
            if nv is not v:
                if out is None:
                    out = dict(value)
                out[key] = nv
    return value if out is None else out


def _omit_in_list(
    value: list[Any], schema: dict[str, Any], resolve: Any, loc: str, dropped: list[str], steps: int
) -> list[Any]:
    """``omit_nulls`` for an array: each item walked against its ``prefixItems``/``items`` schema."""
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    items = schema.get("items")
    items = items if isinstance(items, dict) else None
    if not prefix and items is None:
        return value
    new = []
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is not None and isinstance(v, (dict, list)):
            v = omit_nulls(v, sub, resolve, f"{loc}[{i}]", dropped, steps + 1)
        new.append(v)
    return value if all(a is b for a, b in zip(new, value)) else new
