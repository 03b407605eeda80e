"""Validation of a decoded JSON object against a tool's own schema (never the strict copy).

Pydantic tools validate in strict mode, on JSON (``validate_json(..., strict=True)``):
JSON's own conversions hold (an ISO string to a ``datetime``, an array to a
``tuple``, a value to an ``Enum``), lax-mode guesses do not (``"890"`` to an
``int``, ``1`` to a ``bool``): the one coercion rule of ``worker.tooling.coercion``
is applied to pydantic and raw-schema tools alike. Raw-schema tools validate
with their compiled validator (``worker.tooling.validators``).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from worker.tooling.contract import WorkerTool
from worker.tooling.json_checks import too_deep_error
from worker.tooling.schemas import ValidationInfo, validation_info
from worker.tooling.validators import ARRAY_HINT, REQUIRED_MSG, FieldError, enum_message, loc_of, looks_like_array


def pydantic_errors(exc: ValidationError, info: ValidationInfo | None = None) -> list[FieldError]:
    """Each failing field of a pydantic ``ValidationError``, in the raw-schema tools' words, so the
    model reads one text whatever declares the schema (``info``: the tool's ``ValidationInfo``, for
    the values of an ``enum``)."""
    return [FieldError(loc_of(e["loc"]), _message(e, info)) for e in exc.errors()]


def _enum_at(info: ValidationInfo, loc: tuple[Any, ...]) -> list[Any] | None:
    """The ``enum`` of the schema node at ``loc`` (through ``properties``, ``items``, ``$ref`` and
    ``anyOf``), or None."""
    node = info.resolve(info.schema)
    for part in loc:
        if not isinstance(node, dict):
            return None
        if isinstance(node.get("anyOf"), list):  # an Optional[...]: the branch that is not null
            node = next((info.resolve(b) for b in node["anyOf"] if info.resolve(b).get("type") != "null"), None)
            if not isinstance(node, dict):
                return None
        sub = (node.get("properties") or {}).get(part) if isinstance(part, str) else node.get("items")
        node = info.resolve(sub)
    values = node.get("enum") if isinstance(node, dict) else None
    return values if isinstance(values, list) else None


def _message(error: ErrorDetails, info: ValidationInfo | None) -> str:
    """Pydantic's text where the raw-schema tools' words differ: a missing field is ``REQUIRED_MSG``,
    a value outside an ``enum`` or ``Literal`` lists the allowed values as ``enum_message`` does, an
    array sent as bracket text gets ``ARRAY_HINT`` (``worker.tooling.validators``)."""
    if error["type"] == "missing":
        return REQUIRED_MSG
    if error["type"] in ("literal_error", "enum") and info is not None:
        values = _enum_at(info, tuple(error["loc"]))
        if values:
            return enum_message(error.get("input"), values)
    if error["type"] in ("list_type", "tuple_type", "set_type", "frozen_set_type") and looks_like_array(
        error.get("input")
    ):
        return str(error["msg"]) + ARRAY_HINT
    return str(error["msg"])


def validate_params(
    tool: WorkerTool[Any], data: dict[str, Any], info: ValidationInfo | None = None
) -> tuple[Any, list[FieldError]]:
    """Validate a decoded JSON object against the tool's own schema.

    Pydantic tools: the model in strict JSON mode; raw-schema tools: the cached
    compiled validator (the schema's own draft, Draft 2020-12 by default, with
    format checking), so ``minimum``, ``maximum``, ``pattern``, ``minItems``
    and every other keyword hold even when the provider got a strict or wire
    copy. Returns ``(params, [])`` on success or ``(None, errors)`` where each
    ``FieldError.loc`` names the field (a missing required field is reported at
    its own location, e.g. ``files[0].path``). Never raises for bad data: a
    schema that cannot be applied becomes a ``<root>`` error naming the tool's fault.
    ``info``: the tool's ``ValidationInfo`` when the caller has it (saves a lookup).
    """
    if tool.input_model is not None:
        try:
            raw = orjson.dumps(data)
        except (TypeError, orjson.JSONEncodeError) as exc:
            return None, [FieldError("<root>", f"the arguments are not JSON data ({exc})")]
        try:
            return tool.input_model.__pydantic_validator__.validate_json(raw, strict=True), []
        except ValidationError as exc:
            return None, pydantic_errors(exc, info or validation_info(tool))
    validator = (info or validation_info(tool)).validator
    assert validator is not None  # a raw-schema tool's (``ValidationInfo``): compiled with its info
    try:
        if validator.is_valid(data):
            return data, []
        return None, validator.field_errors(data)
    except RecursionError:
        return None, [FieldError("<root>", too_deep_error())]
    except Exception as exc:  # a schema that cannot be applied (e.g. a $ref that does not resolve)
        return None, [
            FieldError(
                "<root>",
                f"the tool's schema could not be applied "
                f"({exc.__class__.__name__}: {str(exc)[:200]}); "
                "this is a fault of the tool, not of your arguments",
            )
        ]


def params_to_data(tool: WorkerTool[Any], params: Any) -> dict[str, Any]:
    """JSON-ready form of validated params (for storage and the wire)."""
    if tool.input_model is not None:
        dumped: dict[str, Any] = params.model_dump(mode="json")
        return dumped
    data: dict[str, Any] = params
    return data
