"""The one coercion rule, the same for pydantic and raw-schema tools.

A value is coerced only where the tool's own schema cannot take it as sent,
only to the JSON value the text spells, and each coercion is recorded as
``coerced:<field>``:

- a string that is exactly a JSON number (``"890"``, ``"-1.5"``, ``"2e3"``)
  where the schema takes ``integer`` or ``number`` and no string: the number
  (an integer only for an integer spelling, or a number whose value is whole
  where only ``integer`` is allowed); a spelling that a float cannot hold
  exactly (``"0.1000000000000000000001"``) is left alone;
- ``"true"`` / ``"false"`` (exactly) where the schema takes ``boolean`` and no
  string: the boolean;
- a number with a zero fraction (``3.0``, ``3e0``) where the schema takes ``integer``
  and not ``number``: the integer, for pydantic and raw-schema tools alike. A strict
  pydantic ``int`` refuses ``3.0``, so the rule applies after that refusal; JSON Schema
  counts ``3.0`` as an integer, so a raw-schema tool's validation passes it and the rule
  applies after validation (``whole_numbers``), else the tool would receive a float
  (Gemini through several SDKs sends ``3.0``: case D03). ``3.5`` stays a validation error.

Nothing else: no ``"yes"``/``1`` to booleans, no numbers to strings, no
``"null"`` to null, no trimming. Pydantic tools validate in strict mode
(``worker.tooling.param_validation``), so lax-mode conversions do not apply to
them either: this rule is the only one (docs/arguments.md, "The coercion rule"). Source: the
``get_pull_request`` ``"890"`` case (``tests/fixtures/cases/malformed-arguments-2.json``, B09).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from worker.tooling.strict_nulls import pick_branch

_INT = re.compile(r"-?(?:0|[1-9][0-9]*)")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_MAX_STEPS = 4 * 128


def schema_types(schema: Any, resolve: Callable[[Any], Any], steps: int = 0) -> set[str] | None:
    """The JSON types a schema can take (through ``$ref``, ``anyOf``/``oneOf``/``allOf``), or
    ``None`` when it takes any type (no ``type`` anywhere). ``enum``/``const`` give their values' types."""
    schema = resolve(schema)
    if steps > 32 or not isinstance(schema, dict):
        return None
    types: set[str] = set()
    t = schema.get("type")
    if isinstance(t, str):
        types.add(t)
    elif isinstance(t, list):
        types.update(x for x in t if isinstance(x, str))
    for key in ("enum", "const"):
        if key in schema:
            values = schema[key] if key == "enum" and isinstance(schema[key], list) else [schema[key]]
            types.update(_json_type(v) for v in values)
    branches = [b for key in ("anyOf", "oneOf") for b in (schema.get(key) or [])]
    for b in branches:
        sub = schema_types(b, resolve, steps + 1)
        if sub is None:
            return None
        types |= sub
    if not types and not branches:
        for b in schema.get("allOf") or []:
            sub = schema_types(b, resolve, steps + 1)
            if sub is not None:
                types |= sub
    if not types:
        return None
    if "integer" in types and "number" in types:
        types.discard("integer")
    return types


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


_UNCHANGED = object()


def _scalar(value: Any, types: set[str] | None, floats_only: bool = False) -> Any:
    """The coerced scalar, or ``_UNCHANGED`` (``floats_only``: only the integral-float rule)."""
    if types is None or floats_only and type(value) is not float:
        return _UNCHANGED
    if isinstance(value, str):
        if "string" in types:
            return _UNCHANGED
        if ("integer" in types or "number" in types) and _NUMBER.fullmatch(value):
            if _INT.fullmatch(value):
                return int(value)
            f = float(value)
            try:
                exact = Decimal(repr(f)) == Decimal(value)
            except InvalidOperation:
                exact = False
            if not exact:
                return _UNCHANGED
            if "number" not in types:
                return int(f) if f.is_integer() else _UNCHANGED
            return f
        if "boolean" in types and value in ("true", "false"):
            return value == "true"
        return _UNCHANGED
    if isinstance(value, float) and "integer" in types and "number" not in types and value.is_integer():
        return int(value)
    return _UNCHANGED


def whole_numbers(value: Any, schema: Any, resolve: Callable[[Any], Any], applied: list[str]) -> Any:
    """``value`` (already valid against ``schema``) with every integral float where the schema takes
    ``integer`` and not ``number`` made an ``int``, each location appended to ``applied``. The result
    stays valid: JSON Schema compares ``3`` and ``3.0`` as equal everywhere (``enum``, ``const``,
    ``uniqueItems``, bounds)."""
    return coerce(value, schema, resolve, applied, floats_only=True)


def has_float_token(raw: str) -> bool:
    """Whether JSON text ``raw`` may hold a float (a number with a fraction or an exponent): a cheap
    superset test (a digit before ``.``, ``e`` or ``E``: JSON's grammar puts one there in every
    number with a fraction or an exponent), so the walk of ``whole_numbers`` runs only where a
    float can be. A sentence's full stop in a string value (``"done."``) is not a float token.
    Only for valid JSON text: repaired text or a decoded Python literal may spell a float without a
    digit before the point (``.0``), so the checked path also counts any ``.``."""
    # A literal first character lets the regex engine jump from "." to "." (a character class
    # first made it test every position: 1.2 us on a 270-character call, against 0.2 us).
    if "." in raw and _FRACTION.search(raw) is not None:
        return True
    return "e" in raw and _EXP_LOWER.search(raw) is not None or "E" in raw and _EXP_UPPER.search(raw) is not None


_FRACTION = re.compile(r"\.(?<=[0-9]\.)")
_EXP_LOWER = re.compile(r"e(?<=[0-9]e)")
_EXP_UPPER = re.compile(r"E(?<=[0-9]E)")


def coerce(
    value: Any,
    schema: Any,
    resolve: Callable[[Any], Any],
    applied: list[str],
    loc: str = "",
    steps: int = 0,
    floats_only: bool = False,
) -> Any:
    """``value`` with the coercion rule applied where ``schema`` needs it; each coerced
    location appended to ``applied`` (``"todos[0].priority"``). Returns the same object
    when nothing changed. Bounded: at most ``_MAX_STEPS`` schema steps per path.
    ``floats_only``: only integral floats to integers (``whole_numbers``)."""
    if steps > _MAX_STEPS:
        return value
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return value
    if not isinstance(value, (dict, list)):
        new = _scalar(value, schema_types(schema, resolve), floats_only)
        if new is _UNCHANGED:
            return value
        applied.append(loc or "<root>")
        return new
    for sub in schema.get("allOf") or []:
        value = coerce(value, sub, resolve, applied, loc, steps + 1, floats_only)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            branch = pick_branch(value, branches, resolve)
            if branch is not None:
                value = coerce(value, branch, resolve, applied, loc, steps + 1, floats_only)
    if isinstance(value, dict):
        props: dict[str, Any] = schema["properties"] if isinstance(schema.get("properties"), dict) else {}
        extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
        out = None
        for key, v in value.items():
            sub = props.get(key, extra)
            if sub is None:
                continue
            nv = coerce(v, sub, resolve, applied, f"{loc}.{key}" if loc else key, steps + 1, floats_only)
            if nv is not v:
                if out is None:
                    out = dict(value)
                out[key] = nv
        return value if out is None else out
    prefix: list[Any] = schema["prefixItems"] if isinstance(schema.get("prefixItems"), list) else []
    items = schema.get("items") if isinstance(schema.get("items"), dict) else None
    new_list = None
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is None:
            continue
        nv = coerce(v, sub, resolve, applied, f"{loc}[{i}]", steps + 1, floats_only)
        if nv is not v:
            if new_list is None:
                new_list = list(value)
            new_list[i] = nv
    return value if new_list is None else new_list
