"""Argument validation: from the model's ``arguments`` string to validated params.

``validate_tool_arguments(tool, raw)`` never raises for bad input. Its steps:

1. Happy path: a pydantic tool validates the raw string directly with
   ``model_validate_json`` (one pass in pydantic-core); a raw-schema tool
   parses with ``orjson`` and validates with a cached ``jsonschema``
   validator. Nothing else runs when that succeeds.
2. Otherwise: an empty string means ``{}``; a string that does not parse (or
   is a JSON string, i.e. double encoded) climbs the text repair ladder
   (``worker.repair.repair_arguments``); valid JSON that is not an object is
   refused; call envelopes (A18, A38) are refused.
3. Strict tools: OpenAI strict mode makes optional fields required and
   nullable, so a ``null`` for a field the tool's own schema marks optional
   and not nullable means "omitted" and is dropped (named
   ``null_as_omitted:<loc>`` in ``repairs``).
4. Validation against the tool's own model or raw schema (never the strict
   copy). On failure, the schema-guided object rungs are tried (a field sent
   as a JSON-encoded array/object, A20; an undeclared wrapper key, A37), each
   kept only if the result validates.

When the response stopped at the output-token limit (``response_status ==
"incomplete"``) a call that needs any repair is refused with a "cut off"
error.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from pydantic import ValidationError

from worker.contract import WorkerTool
from worker.repair import (
    CUT_OFF_ERROR,
    check_envelope,
    decode_encoded_fields,
    repair_arguments,
    unwrap_candidate,
)
from worker.schemas import validation_info
from worker.strict import _accepts_null

DEFAULT_MAX_RAW_ECHO = 2_000
"""Default cap (characters) of the raw arguments echoed back in an error (``settings.max_raw_arguments_echo``)."""


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


class ArgumentsOutcome:
    """Result of ``validate_tool_arguments``.

    - ``ok``: params validated; ``params`` is the model instance (or dict for a raw schema).
    - ``data``: the JSON object that validated (after repairs), JSON-serialisable.
      For pydantic tools it is ``params.model_dump(mode="json")``, computed on
      first access (the happy path does not pay for it).
    - ``repairs``: names of the repairs applied, in order (empty when the string parsed as is).
    - ``error``: when not ok, the text sent back to the model (failing fields,
      the capped raw arguments, and a request for a corrected call).
    - ``errors``: when validation failed, each failing field.
    - ``error_kind``: ``None`` when ok, else ``"cut_off"`` (response incomplete),
      ``"parse"`` (not a usable JSON object) or ``"validation"`` (schema
      rejected the object). The loop's per-tool retry budget can count these.
    """

    __slots__ = ("ok", "params", "_data", "repairs", "error", "errors", "error_kind", "_tool")

    def __init__(self, ok: bool, params: Any = None, data: dict[str, Any] | None = None,
                 repairs: list[str] | None = None, error: str | None = None,
                 errors: list[FieldError] | None = None, error_kind: str | None = None,
                 tool: WorkerTool | None = None):
        self.ok = ok
        self.params = params
        self._data = data
        self.repairs = repairs if repairs is not None else []
        self.error = error
        self.errors = errors if errors is not None else []
        self.error_kind = error_kind
        self._tool = tool

    @property
    def data(self) -> dict[str, Any] | None:
        if self._data is None and self.ok and self._tool is not None:
            self._data = params_to_data(self._tool, self.params)
        return self._data

    @data.setter
    def data(self, value: dict[str, Any] | None) -> None:
        self._data = value

    def __repr__(self) -> str:
        return (f"ArgumentsOutcome(ok={self.ok!r}, params={self.params!r}, data={self.data!r}, "
                f"repairs={self.repairs!r}, error={self.error!r}, errors={self.errors!r}, "
                f"error_kind={self.error_kind!r})")


def _loc(parts: Any) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "<root>"


_REQUIRED_MSG = re.compile(r"^'(.+)' is a required property$")


def _jsonschema_errors(validator: Any, data: Any) -> list[FieldError]:
    errors = []
    for e in validator.iter_errors(data):
        path = list(e.absolute_path)
        if e.validator == "required":
            m = _REQUIRED_MSG.match(e.message)
            if m:
                path.append(m.group(1))
                errors.append(FieldError(_loc(path), "required property is missing"))
                continue
        errors.append(FieldError(_loc(path), e.message))
    errors.sort(key=lambda f: f.loc)
    return errors


def validate_params(tool: WorkerTool, data: dict[str, Any]) -> tuple[Any, list[FieldError]]:
    """Validate a decoded JSON object against the tool's own schema.

    Pydantic tools use ``input_model.model_validate``; raw-schema tools use a
    cached ``jsonschema`` validator (the schema's own draft, Draft 2020-12 by
    default, with format checking), so ``minimum``, ``maximum``, ``pattern``,
    ``minItems`` and every other keyword hold even when the provider got a
    strict copy. Returns ``(params, [])`` on success or ``(None, errors)``
    where each ``FieldError.loc`` names the field (a missing required field
    is reported at its own location, e.g. ``files[0].path``).
    """
    if tool.input_model is not None:
        try:
            return tool.input_model.model_validate(data), []
        except ValidationError as exc:
            return None, [FieldError(_loc(e["loc"]), e["msg"]) for e in exc.errors()]
    validator = validation_info(tool).validator
    if validator.is_valid(data):
        return data, []
    return None, _jsonschema_errors(validator, data)


def params_to_data(tool: WorkerTool, params: Any) -> dict[str, Any]:
    """JSON-ready form of validated params (for storage and the wire)."""
    if tool.input_model is not None:
        return params.model_dump(mode="json")
    return params


def _echo(raw: str, cap: int) -> str:
    if len(raw) <= cap:
        return raw
    return f"{raw[:cap]}... [{len(raw) - cap} more characters not shown]"


def _failure(tool: WorkerTool, raw: str, kind: str, reason: str, cap: int, *,
             errors: list[FieldError] | None = None, data: Any = None,
             repairs: list[str] | None = None) -> ArgumentsOutcome:
    if kind == "validation":
        lines = "\n".join(f"- {e.loc}: {e.msg}" for e in errors or [])
        text = (f"Invalid arguments for tool {tool.name}; the call did not run.\n{lines}\n"
                f"Your arguments were: {_echo(raw, cap)}\n"
                "Send a corrected call to this tool with arguments that match its parameters.")
    else:
        text = (f"Could not use the arguments for tool {tool.name}: {reason}\n"
                f"Your arguments were: {_echo(raw, cap)}\n"
                "Send a corrected call.")
    return ArgumentsOutcome(ok=False, data=data, repairs=repairs or [], errors=errors or [],
                            error=text, error_kind=kind)


def _omit_nulls(value: Any, schema: Any, resolve: Any, loc: str, dropped: list[str], depth: int = 0) -> Any:
    """Drop ``null`` for optional, non-nullable properties (strict-mode "omitted"), recursively."""
    schema = resolve(schema)
    if depth > 64 or not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, dict):
            return value
        required = schema.get("required", ())
        out = None
        for key, v in value.items():
            sub = props.get(key)
            if sub is None:
                continue
            here = f"{loc}.{key}" if loc else key
            if v is None:
                if key not in required and not _accepts_null(resolve(sub)):
                    if out is None:
                        out = dict(value)
                    del out[key]
                    dropped.append(here)
            elif isinstance(v, (dict, list)):
                nv = _omit_nulls(v, sub, resolve, here, dropped, depth + 1)
                if nv is not v:
                    if out is None:
                        out = dict(value)
                    out[key] = nv
        return value if out is None else out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        new = [_omit_nulls(v, items, resolve, f"{loc}[{i}]", dropped, depth + 1) if isinstance(v, (dict, list)) else v
               for i, v in enumerate(value)]
        return value if all(a is b for a, b in zip(new, value)) else new
    return value


def _validate(tool: WorkerTool, data: dict[str, Any], info: Any) -> tuple[Any, list[FieldError], dict[str, Any], list[str]]:
    """Strict null handling + validation. Returns (params, errors, data_used, null_repairs)."""
    notes: list[str] = []
    if tool.strict:
        dropped: list[str] = []
        data = _omit_nulls(data, info.schema, info.resolve, "", dropped)
        notes = [f"null_as_omitted:{d}" for d in dropped]
    params, errors = validate_params(tool, data)
    return params, errors, data, notes


def validate_tool_arguments(tool: WorkerTool, raw: str, *, response_status: str = "completed",
                            max_raw_echo: int = DEFAULT_MAX_RAW_ECHO) -> ArgumentsOutcome:
    """Parse, repair if needed, and validate a function call's ``arguments``.

    ``raw`` is the ``arguments`` string of a Responses ``function_call`` item
    (a non-string is JSON-encoded first). ``response_status`` is the status
    of the response that carried the call: ``"incomplete"`` (stopped at
    ``max_output_tokens``) refuses every repair with a "cut off" error.
    ``max_raw_echo`` caps the raw arguments quoted back in ``error``
    (``settings.max_raw_arguments_echo``). Never raises for bad input; see
    the module docstring for the steps and ``worker.repair`` for the ladder.
    """
    if not isinstance(raw, str):
        raw = orjson.dumps(raw).decode()
    model = tool.input_model
    if model is not None and raw:
        try:
            return ArgumentsOutcome(ok=True, params=model.model_validate_json(raw), tool=tool)
        except ValidationError:
            pass
    info = validation_info(tool)
    props = info.properties
    repairs: list[str] = []
    if not raw or raw.isspace():
        data: Any = {}
    else:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = raw  # a str: handled by the ladder below, like a double-encoded string
        if isinstance(data, str):
            rep = repair_arguments(raw, response_status=response_status, declared_properties=props)
            if not rep.ok:
                kind = "cut_off" if rep.error == CUT_OFF_ERROR else "parse"
                return _failure(tool, raw, kind, rep.error or "not valid JSON", max_raw_echo)
            data, repairs = rep.value, rep.repairs
        elif not isinstance(data, dict):
            kind = {type(None): "null", list: "an array", bool: "a boolean"}.get(type(data), "a number")
            return _failure(tool, raw, "parse", f"arguments must be a JSON object, got {kind}; send a JSON object",
                            max_raw_echo)
        else:
            env = check_envelope(data, props)
            if env:
                return _failure(tool, raw, "parse", env, max_raw_echo)

    params, errors, used, notes = _validate(tool, data, info)
    if not errors:
        return ArgumentsOutcome(ok=True, params=params, data=None if model is not None else used,
                                repairs=repairs + notes, tool=tool)
    if response_status != "incomplete":
        decoded, names = decode_encoded_fields(data, props, info.resolve)
        if names:
            p2, e2, used2, notes2 = _validate(tool, decoded, info)
            if not e2:
                return ArgumentsOutcome(ok=True, params=p2, data=None if model is not None else used2,
                                        repairs=repairs + names + notes2, tool=tool)
        cand = unwrap_candidate(data, props)
        if cand is not None:
            key, inner = cand
            p3, e3, used3, notes3 = _validate(tool, inner, info)
            if not e3:
                return ArgumentsOutcome(ok=True, params=p3, data=None if model is not None else used3,
                                        repairs=repairs + [f"unwrapped:{key}"] + notes3, tool=tool)
    elif repairs:
        return _failure(tool, raw, "cut_off", CUT_OFF_ERROR, max_raw_echo)
    return _failure(tool, raw, "validation", "", max_raw_echo, errors=errors, data=used, repairs=repairs + notes)
