"""A pydantic model from a JSON Schema (the subset the argument cases use), so a case can run on a
raw-schema tool and on a pydantic tool with the same fields."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, create_model


def _py_type(s: dict[str, Any], name: str, open_extra: str | None) -> Any:
    if "anyOf" in s:
        types = [_py_type(b, name, open_extra) for b in s["anyOf"] if b.get("type") != "null"]
        t = types[0] if len(types) == 1 else Union[tuple(types)]
        return Optional[t] if any(b.get("type") == "null" for b in s["anyOf"]) else t
    if "enum" in s:
        return Literal[tuple(s["enum"])]
    t = s.get("type")
    if isinstance(t, list):
        inner = [x for x in t if x != "null"]
        base = _py_type({**s, "type": inner[0]}, name, open_extra)
        return Optional[base] if "null" in t else base
    if t == "array":
        return list[_py_type(s["items"], name, open_extra)] if "items" in s else list[Any]
    if t == "object":
        return model_from_schema(s, name.title(), open_extra) if s.get("properties") else dict[str, Any]
    return {"string": str, "integer": int, "number": float, "boolean": bool}[t]


def model_from_schema(schema: dict[str, Any], name: str = "Args", open_extra: str | None = "allow") -> type[BaseModel]:
    """A model with the schema's fields (required ones required, the others ``Optional`` with
    ``None``). ``additionalProperties: false`` gives ``extra="forbid"``; an open object gives
    ``extra=open_extra`` (``None``: pydantic's default, which ignores unknown keys)."""
    required = set(schema.get("required", []))
    fields: dict[str, Any] = {}
    for key, sub in schema.get("properties", {}).items():
        typ = _py_type(sub, key, open_extra)
        fields[key] = (typ, ...) if key in required else (Optional[typ], None)
    if schema.get("additionalProperties") is False:
        config = ConfigDict(extra="forbid")
    elif open_extra is not None:
        config = ConfigDict(extra=open_extra)  # type: ignore[typeddict-item]
    else:
        config = ConfigDict()
    return create_model(name, __config__=config, **fields)
