"""Keys the model sent that the tool does not declare: one rule, whatever declares the schema.

A pydantic model ignores an unknown key by default and a raw schema without
``additionalProperties: false`` passes it to the tool, so an unknown key would be treated
two ways. The runtime makes the same checks on both before validation
(``worker.tooling.arguments``):

- a key holding markup is refused (``worker.tooling.markup``);
- a key that differs from a declared parameter only in case or separators
  (``threadId``, ``Thread-ID`` for ``thread_id``), sent without that parameter, is refused
  naming both (``near_miss_error``): the call would otherwise run without the value the
  model meant (an optional parameter) or fail naming only the parameter it did not send;
- any other unknown key is the tool's own schema's business: refused where the schema is
  closed (``additionalProperties: false``, ``extra="forbid"``), passed on where it is open,
  dropped by a pydantic model that ignores extras.

Where validation then reports a missing required property, ``name_sent_keys`` adds the
keys the model did send at that place that the schema does not declare (``"file_path"`` for a
missing ``path``), so the error names the key the model sent, not only the one it did not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Callable

from worker.tooling.validators import REQUIRED_MSG, FieldError

_SEPARATORS = re.compile(r"[\s_\-.]+")
_LOC_PART = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _norm(key: str) -> str:
    return _SEPARATORS.sub("", key).casefold()


def near_miss_error(data: dict[str, Any], properties: dict[str, Any], accepted: Iterable[str] = ()) -> str | None:
    """An error for the first top-level key that is not a parameter but spells one the call
    lacks (case and ``_``/``-``/``.``/space ignored), else ``None``.

    ``properties``: the schema's top-level properties; ``accepted``: other names the tool
    takes (a pydantic field's name beside its alias). Cost: one dict lookup per key when
    every key is declared.
    """
    if not properties or data.keys() <= properties.keys():
        return None  # every key declared (one C-level set comparison)
    extra = [k for k in data if k not in properties and k not in accepted]
    if not extra:
        return None
    by_norm = {_norm(p): p for p in properties}
    for key in extra:
        meant = by_norm.get(_norm(key)) if isinstance(key, str) else None
        if meant is not None and meant not in data:
            return (
                f"the key {key!r} in your arguments is not a parameter of this tool; the parameter is "
                f"named {meant!r}; nothing was run: send the call again with {meant!r} spelled exactly"
            )
    return None


def name_sent_keys(errors: list[FieldError], data: Any, schema: Any, resolve: Callable[[Any], Any]) -> list[FieldError]:
    """``errors`` with each "required property is missing" extended by the undeclared keys the
    model sent in the same object (``path: required property is missing; your arguments have
    'file_path' there, which is not a parameter``). Other errors are returned unchanged."""
    out = []
    for e in errors:
        if e.msg == REQUIRED_MSG:
            parts = _loc_parts(e.loc)[:-1]
            sent = _undeclared_at(data, schema, resolve, parts)
            if sent:
                names = ", ".join(repr(k) for k in sent[:5])
                e = FieldError(e.loc, f"{e.msg}; your arguments have {names} there, which is not a parameter")
        out.append(e)
    return out


def _loc_parts(loc: str) -> list[str | int]:
    return [int(m.group(2)) if m.group(2) is not None else m.group(1) for m in _LOC_PART.finditer(loc)]


def _undeclared_at(data: Any, schema: Any, resolve: Callable[[Any], Any], parts: list[str | int]) -> list[str]:
    """The keys of the object at ``parts`` in ``data`` that its schema does not declare."""
    node = data
    for part in parts:
        schema = _child_schema(schema, part, resolve)
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return []
    if not isinstance(node, dict):
        return []
    declared = _properties(schema, resolve)
    return [k for k in node if k not in declared]


def _child_schema(schema: Any, part: str | int, resolve: Callable[[Any], Any]) -> Any:
    for node in _branches(schema, resolve):
        if isinstance(part, int):
            items = node.get("items")
            if isinstance(items, dict):
                return items
        else:
            props = node.get("properties")
            if isinstance(props, dict) and part in props:
                return props[part]
    return {}


def _properties(schema: Any, resolve: Callable[[Any], Any]) -> set[str]:
    names: set[str] = set()
    for node in _branches(schema, resolve):
        props = node.get("properties")
        if isinstance(props, dict):
            names.update(props)
    return names


def _branches(schema: Any, resolve: Callable[[Any], Any], depth: int = 0) -> list[dict[str, Any]]:
    """``schema`` and the branches of its ``anyOf``/``oneOf``/``allOf`` (``$ref`` resolved), flat."""
    schema = resolve(schema)
    if not isinstance(schema, dict) or depth > 8:
        return []
    out = [schema]
    for key in ("anyOf", "oneOf", "allOf"):
        for b in schema.get(key) or []:
            out.extend(_branches(b, resolve, depth + 1))
    return out
