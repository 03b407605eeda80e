"""Every error of the HTTP API in one JSON shape (the OpenAI API's, which clients already parse):

    {"error": {"type": "...", "message": "...", "param": "input[0].role" | null, "code": null}}

``type`` by status: 400 ``invalid_request``, 401 ``authentication``, 404 ``not_found``, 409
``conflict``, 413 ``request_too_large``, 415 ``unsupported_media_type``, 422 ``invalid_request``
(a body that does not match its schema), 429 ``rate_limited``, 500 ``server_error`` (a fault of
the API itself, logged with its traceback; the message names no internals), 503 ``unavailable``.
429 and 503 carry ``Retry-After`` (seconds).
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import kombu.exceptions
import orjson
import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from control.api.json_response import JsonResponse
from control.errors import Conflict, ControlPlaneError, ControlPlaneUnavailable, NotFound, Refused

log = logging.getLogger("agent.api")

TYPES = {
    400: "invalid_request",
    401: "authentication",
    403: "permission",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "request_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "rate_limited",
    500: "server_error",
    503: "unavailable",
}


_JSON_NAMES = {"list": "an array", "str": "a string", "int": "a number", "float": "a number", "bool": "a boolean"}


class ApiError(Exception):
    """An error answer: ``status``, ``message``, the offending ``param`` (a path) and headers."""

    def __init__(self, status: int, message: str, *, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The JSON body of an error answer."""
    return {"error": {"type": TYPES.get(status, "error"), "message": message, "param": param, "code": None}}


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JsonResponse:
    return JsonResponse(error_body(status, message, param), status_code=status, headers=headers)


def loc_path(loc: tuple[Any, ...] | list[Any]) -> str:
    """A pydantic error location as a path: ``("body", "input", 0, "role")`` -> ``input[0].role``."""
    out = ""
    for part in loc:
        if part in ("body", "query", "path", "header"):
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def first_validation_error(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """``(path, message)`` of the first pydantic error; an input-item error's own path wins
    (``worker.model.input_items`` puts it in the error's context)."""
    e = errors[0]
    ctx = e.get("ctx") or {}
    if ctx.get("path"):
        return str(ctx["path"]), str(ctx.get("detail") or e["msg"])
    path = loc_path(e.get("loc", ()))
    return path, str(e["msg"])


async def _refused(
    request: Request, authenticate_first: Callable[[Request], Awaitable[None]]
) -> JsonResponse | redis.RedisError | None:
    """The answer of ``authenticate_first`` refusing ``request`` (or the Redis error it met); None
    when the token passed."""
    try:
        await authenticate_first(request)
    except ApiError as refused:
        return error_response(refused.status, refused.message, refused.param, refused.headers)
    except redis.RedisError as failed:
        return failed
    return None


def install(
    app: FastAPI,
    retry_after: int,
    *,
    authenticate_first: Callable[[Request], Awaitable[None]] | None = None,
    self_checking: frozenset[Callable[..., Any]] = frozenset(),
) -> None:
    """Register the handlers that turn every failure into the one error shape. A request to a
    route among ``self_checking`` (endpoints that check their token themselves) refused by
    validation is first put through ``authenticate_first`` (which raises ``ApiError``): the
    token's refusal (401, 429) comes before the body's."""

    def unavailable(exc: Exception) -> JsonResponse:
        return _unavailable(exc, retry_after)

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> JsonResponse:
        return answer(exc, retry_after)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JsonResponse:
        if authenticate_first is not None and getattr(request.scope.get("route"), "endpoint", None) in self_checking:
            refused = await _refused(request, authenticate_first)
            if refused is not None:
                return refused if isinstance(refused, JsonResponse) else unavailable(refused)
        errors = list(exc.errors())
        if not errors:
            return error_response(422, "invalid request")
        path, msg = first_validation_error(errors)
        if errors[0].get("type") == "json_invalid":  # the parser's own words, in the error's context
            return error_response(
                400, f"the body is not valid JSON: {(errors[0].get('ctx') or {}).get('error') or msg}"
            )
        if tuple(errors[0].get("loc", ())) == ("body",):  # the body whole: none, or not an object
            got = type(errors[0].get("input")).__name__ if errors[0].get("input") is not None else "nothing"
            if got == "bytes":  # not read as JSON: no JSON Content-Type
                return error_response(400, "a JSON object is required as the body, with Content-Type: application/json")
            return error_response(400, f"a JSON object is required as the body (got {_JSON_NAMES.get(got, got)})")
        return error_response(422, f"{path}: {msg}" if path else msg, path or None)

    for kind in (
        StarletteHTTPException,
        ControlPlaneError,
        redis.RedisError,
        kombu.exceptions.OperationalError,
        UnicodeEncodeError,
        orjson.JSONEncodeError,
        Exception,
    ):
        app.add_exception_handler(kind, _handler(retry_after))


def _handler(retry_after: int) -> Callable[[Request, Exception], Awaitable[JsonResponse]]:
    async def handle(_: Request, exc: Exception) -> JsonResponse:
        return answer(exc, retry_after)

    return handle


def _unavailable(exc: Exception, retry_after: int) -> JsonResponse:
    log.warning("Redis unavailable: %s", exc.__class__.__name__)
    return error_response(
        503,
        "the control plane's Redis is not answering; nothing was changed, retry later",
        headers={"Retry-After": str(retry_after)},
    )


def _fault(exc: Exception) -> JsonResponse:
    log.error("unhandled error: %s", exc.__class__.__name__, exc_info=exc)
    return error_response(500, "the API failed on this request; it was logged")


def answer(exc: Exception, retry_after: int) -> JsonResponse:
    """The error answer to ``exc`` raised by a route (every kind but a request's validation
    errors): ``ApiError`` as it says, 404/409/400 for the control plane's refusals, 503 with
    ``Retry-After`` (``retry_after`` seconds) when Redis or the broker fails, 400 for text that
    is not valid Unicode, else 500 (logged with its traceback)."""
    if isinstance(exc, ApiError):
        return error_response(exc.status, exc.message, exc.param, exc.headers)
    if isinstance(exc, StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))
    if isinstance(exc, ControlPlaneError):
        if isinstance(exc, ControlPlaneUnavailable):
            return _unavailable(exc, retry_after)
        status = 404 if isinstance(exc, NotFound) else 409 if isinstance(exc, Conflict) else 400
        if not isinstance(exc, (NotFound, Conflict, Refused)):
            log.info("control-plane error: %s", exc)
        return error_response(status, str(exc))
    if isinstance(exc, (redis.RedisError, kombu.exceptions.OperationalError)):
        return _unavailable(exc, retry_after)
    if isinstance(exc, UnicodeEncodeError):
        # JSON may escape a lone surrogate (\ud800) that no UTF-8 text can hold: Redis and the
        # stored JSON refuse it when it is written, before anything is stored.
        return error_response(400, "the body holds text that is not valid Unicode (a lone surrogate)")
    if isinstance(exc, orjson.JSONEncodeError):
        if "surrogate" in str(exc) or "utf-8" in str(exc).lower():
            return error_response(400, "the body holds text that is not valid Unicode (a lone surrogate)")
    return _fault(exc)
