"""Argument validation: from the model's ``arguments`` string to validated params.

``validate_tool_arguments(tool, raw)`` parses strictly first, climbs the repair
ladder (``worker.repair``) only on failure, then validates against the tool's
pydantic model or, for a raw schema, with ``jsonschema``. It never raises for
bad input: the outcome carries either validated params or an error text for
the model naming each failing field.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jsonschema
import orjson
from pydantic import ValidationError

from worker.contract import WorkerTool


@dataclass(frozen=True)
class FieldError:
    """One failing field: ``loc`` is a dotted/indexed path (``todos[0].status``), ``msg`` the reason."""

    loc: str
    msg: str


@dataclass
class ArgumentsOutcome:
    """Result of ``validate_tool_arguments``.

    - ``ok``: params validated; ``params`` is the model instance (or dict for a raw schema).
    - ``data``: the JSON object that validated (after repairs), JSON-serialisable.
    - ``repairs``: names of the repairs applied, in order (empty when the string parsed as is).
    - ``error``: when not ok, the text sent back to the model.
    - ``errors``: when validation failed, each failing field.
    """

    ok: bool
    params: Any = None
    data: dict[str, Any] | None = None
    repairs: list[str] = field(default_factory=list)
    error: str | None = None
    errors: list[FieldError] = field(default_factory=list)


def _loc(parts: Any) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "<root>"


def validate_params(tool: WorkerTool, data: dict[str, Any]) -> tuple[Any, list[FieldError]]:
    """Validate a decoded JSON object against the tool's own schema.

    Returns ``(params, [])`` on success or ``(None, errors)``.
    """
    if tool.input_model is not None:
        try:
            return tool.input_model.model_validate(data), []
        except ValidationError as exc:
            return None, [FieldError(_loc(e["loc"]), e["msg"]) for e in exc.errors()]
    schema = tool.json_schema if tool.json_schema is not None else {"type": "object"}
    validator_cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    validator = validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER)
    errors = [
        FieldError(_loc(e.absolute_path), e.message)
        for e in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if errors:
        return None, errors
    return data, []


def params_to_data(tool: WorkerTool, params: Any) -> dict[str, Any]:
    """JSON-ready form of validated params (for storage and the wire)."""
    if tool.input_model is not None:
        return params.model_dump(mode="json")
    return params


def validate_tool_arguments(tool: WorkerTool, raw: str, *, response_status: str = "completed") -> ArgumentsOutcome:
    """Parse, repair if needed, and validate a function call's ``arguments``.

    ``response_status`` is the Responses status of the reply that carried the
    call: when it is ``"incomplete"`` (output-token limit), no repair is
    applied and a call that does not parse as is gets a "cut off" error.
    Never raises for bad input.
    """
    raw = raw if isinstance(raw, str) else orjson.dumps(raw).decode()
    repairs: list[str] = []
    if raw.strip() == "":
        data: Any = {}
    else:
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            from worker.repair import repair_arguments

            repaired = repair_arguments(raw, tool=tool, response_status=response_status)
            if not repaired.ok:
                return ArgumentsOutcome(ok=False, error=repaired.error)
            data, repairs = repaired.value, repaired.repairs
    if not isinstance(data, dict):
        return ArgumentsOutcome(
            ok=False,
            error=f"arguments must be a JSON object, got {type(data).__name__ if data is not None else 'null'}",
        )
    params, errors = validate_params(tool, data)
    if errors:
        lines = "; ".join(f"{e.loc}: {e.msg}" for e in errors)
        return ArgumentsOutcome(ok=False, data=data, repairs=repairs, errors=errors,
                                error=f"invalid arguments for {tool.name}: {lines}")
    return ArgumentsOutcome(ok=True, params=params, data=params_to_data(tool, params), repairs=repairs)
