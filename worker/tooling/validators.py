"""Compiled JSON Schema validators for raw-schema tools, and the failing-field shape.

A raw-schema tool (every MCP tool) validates each call with a validator compiled
once per tool (``compile_validator``): ``jsonschema-rs`` (Rust; Draft 4, 6, 7,
2019-09 and 2020-12, local ``$ref`` resolved at compile time, format checking
on, remote retrieval off), about 10x faster than the pure-Python ``jsonschema``
on a schema with ``$defs``. A schema ``jsonschema-rs`` cannot compile (Draft 3,
a regex its engine refuses) falls back to ``jsonschema`` with the same draft and
format checking; ``CompiledValidator.engine`` says which one runs and why
(``worker.tooling.schemas.ValidationInfo.engine``).

Both engines report every failing field as a ``FieldError`` whose ``loc`` is
the instance path (``todos[0].status``); a missing required property is
reported at its own location (``files[0].path``).
"""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import jsonschema.protocols
import jsonschema_rs

from worker.tooling.wire import presence_only, presence_words

RUST_ENGINE = "jsonschema-rs"


class FieldError:
    """One failing field: ``loc`` is a dotted/indexed path (``todos[0].status``), ``msg`` the reason."""

    __slots__ = ("loc", "msg")

    def __init__(self, loc: str, msg: str):
        self.loc = loc
        self.msg = msg

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldError) and (self.loc, self.msg) == (other.loc, other.msg)

    def __hash__(self) -> int:
        return hash((self.loc, self.msg))

    def __repr__(self) -> str:
        return f"FieldError(loc={self.loc!r}, msg={self.msg!r})"


def loc_of(parts: Any) -> str:
    """``["todos", 0, "status"]`` -> ``"todos[0].status"``; an empty path is ``"<root>"``."""
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "<root>"


REQUIRED_MSG = "required property is missing"
_PY_REQUIRED = re.compile(r"^'(.+)' is a required property$")

MAX_LISTED_VALUES = 100
"""An enum refusal lists every allowed value up to this many (and ``MAX_LISTED_CHARS`` of text): the
model can pick the right one only from the list (a refusal that shows 2 of 7 and "5 other candidates"
left a model guessing again; the list is what a wrong guess needs)."""
MAX_LISTED_CHARS = 4_000

ARRAY_HINT = (
    '; this field takes a JSON array: send the value as an array (e.g. ["a", "b"]), not as a string that looks like one'
)


def enum_message(instance: Any, options: list[Any]) -> str:
    """The refusal of ``instance`` for an ``enum`` of ``options``: every allowed value, as JSON, up to
    ``MAX_LISTED_VALUES`` values and ``MAX_LISTED_CHARS`` characters, then how many more there are."""
    shown: list[str] = []
    size = 0
    for value in options:
        text = json.dumps(value, ensure_ascii=False)
        if len(shown) == MAX_LISTED_VALUES or size + len(text) > MAX_LISTED_CHARS:
            break
        shown.append(text)
        size += len(text) + 2
    listed = ", ".join(shown)
    more = len(options) - len(shown)
    tail = f", and {more} more (the parameter's schema lists them all)" if more else ""
    return f"{json.dumps(instance, ensure_ascii=False)[:200]} is not one of the allowed values: {listed}{tail}"


def looks_like_array(value: Any) -> bool:
    """A string that reads as a bracket list (``"[a, b]"``, ``"['x']"``) where an array is expected:
    the model wrote the array as text (it is decoded when it is JSON or a Python literal; otherwise
    the refusal says to send a JSON array)."""
    if not isinstance(value, str):
        return False
    text = value.strip()
    return len(text) >= 2 and text[0] == "[" and text[-1] == "]"


class CompiledValidator:
    """``is_valid(data) -> bool`` and ``field_errors(data) -> list[FieldError]`` (sorted by ``loc``).

    ``engine`` is ``"jsonschema-rs"`` or ``"jsonschema (fallback: <reason>)"``.
    Both methods may raise for a schema that cannot be applied; callers turn
    that into an error output.
    """

    __slots__ = ("engine", "_rs", "_py", "is_valid", "presence")

    def __init__(
        self,
        engine: str,
        rs: jsonschema_rs.Validator | None = None,
        py: jsonschema.protocols.Validator | None = None,
        presence: str | None = None,
    ):
        self.engine = engine
        self._rs = rs
        self._py = py
        compiled = rs or py
        assert compiled is not None, "one engine's validator"
        self.is_valid = compiled.is_valid
        self.presence = presence  # P5's words for a root "at least one of these fields" (worker.tooling.wire)

    def field_errors(self, data: Any) -> list[FieldError]:
        errors: list[FieldError] = []
        if self._rs is not None:
            for e in self._rs.iter_errors(data):
                path = list(e.instance_path)
                prop = getattr(e.kind, "property", None) if type(e.kind).__name__ == "Required" else None
                if isinstance(prop, str):
                    errors.append(FieldError(loc_of(path + [prop]), REQUIRED_MSG))
                elif self.presence and not path and list(e.schema_path)[:1] in (["anyOf"], ["oneOf"]):
                    errors.append(FieldError("<root>", self.presence))
                else:
                    errors.append(FieldError(loc_of(path), _message(e)))
        elif self._py is not None:
            for pe in self._py.iter_errors(data):
                path = list(pe.absolute_path)
                m = _PY_REQUIRED.match(pe.message) if pe.validator == "required" else None
                if m:
                    errors.append(FieldError(loc_of(path + [m.group(1)]), REQUIRED_MSG))
                else:
                    errors.append(FieldError(loc_of(path), _py_message(pe)))
        errors.sort(key=lambda f: f.loc)
        return errors


def _message(e: jsonschema_rs.ValidationError) -> str:
    """A jsonschema-rs error as the model reads it: an ``enum`` lists every allowed value
    (``enum_message``), an array sent as bracket text gets ``ARRAY_HINT``."""
    kind = type(e.kind).__name__
    if kind == "Enum":
        options = getattr(e.kind, "options", None)
        if isinstance(options, list):
            return enum_message(e.instance, options)
    elif kind == "Type" and looks_like_array(e.instance) and "array" in str(getattr(e.kind, "types", "")):
        return str(e.message) + ARRAY_HINT
    return str(e.message)


def _py_message(e: jsonschema.ValidationError) -> str:
    """The same for the ``jsonschema`` fallback."""
    if e.validator == "enum" and isinstance(e.validator_value, list):
        return enum_message(e.instance, e.validator_value)
    if e.validator == "type" and looks_like_array(e.instance) and "array" in str(e.validator_value):
        return str(e.message) + ARRAY_HINT
    return str(e.message)


def compile_validator(schema: dict[str, Any]) -> CompiledValidator:
    """A validator for ``schema`` (already checked at definition: valid, local refs only).

    ``jsonschema-rs`` first (``validate_formats=True``, ``offline=True``: nothing is
    ever fetched); when it cannot compile the schema, ``jsonschema`` with the
    schema's own draft (Draft 2020-12 by default) and its format checker.
    """
    key = presence_only(schema)
    presence = presence_words(schema, key) if key else None
    try:
        rs = jsonschema_rs.validator_for(schema, validate_formats=True, offline=True)
        return CompiledValidator(RUST_ENGINE, rs=rs, presence=presence)
    except Exception as exc:  # jsonschema-rs raises ValidationError/ValueError for what it cannot compile
        reason = str(exc).split("\n", 1)[0][:200]
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    py = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return CompiledValidator(
        f"jsonschema (fallback: jsonschema-rs cannot compile this schema: {reason})", py=py, presence=presence
    )
