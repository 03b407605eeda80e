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

from worker.tooling.contract import WorkerTool
from worker.tooling.json_checks import too_deep_error
from worker.tooling.schemas import validation_info
from worker.tooling.validators import FieldError, loc_of


def pydantic_errors(exc: ValidationError) -> list[FieldError]:
    """Each failing field of a pydantic ``ValidationError``."""
    return [FieldError(loc_of(e["loc"]), e["msg"]) for e in exc.errors()]


def validate_params(tool: WorkerTool[Any], data: dict[str, Any]) -> tuple[Any, list[FieldError]]:
    """Validate a decoded JSON object against the tool's own schema.

    Pydantic tools: the model in strict JSON mode; raw-schema tools: the cached
    compiled validator (the schema's own draft, Draft 2020-12 by default, with
    format checking), so ``minimum``, ``maximum``, ``pattern``, ``minItems``
    and every other keyword hold even when the provider got a strict or wire
    copy. Returns ``(params, [])`` on success or ``(None, errors)`` where each
    ``FieldError.loc`` names the field (a missing required field is reported at
    its own location, e.g. ``files[0].path``). Never raises for bad data: a
    schema that cannot be applied becomes a ``<root>`` error naming the tool's fault.
    """
    if tool.input_model is not None:
        try:
            raw = orjson.dumps(data)
        except (TypeError, orjson.JSONEncodeError) as exc:
            return None, [FieldError("<root>", f"the arguments are not JSON data ({exc})")]
        try:
            return tool.input_model.__pydantic_validator__.validate_json(raw, strict=True), []
        except ValidationError as exc:
            return None, pydantic_errors(exc)
    validator = validation_info(tool).validator
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
