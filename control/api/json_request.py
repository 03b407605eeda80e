"""How the API's routes read a JSON body: ``JsonRoute``, the ``/v1`` router's route class.

FastAPI reads a body with Python's ``json.loads``, which takes what JSON does not have, and
answers some bodies before any route's token check. Its routes read through ``strict_loads``:

- ``NaN``, ``Infinity`` and ``-Infinity`` are refused as invalid JSON, and so is a number beyond a
  double's range (``1e400``, read as infinity): taken, they were stored as ``null`` (the stored
  JSON has no such numbers), a value changed without a word (orjson, the edge's, refuses them);
- a body nested deeper than the parser's recursion allows (about a thousand levels) is invalid
  JSON too, and so are bytes that are not text: they raised ``RecursionError`` or
  ``UnicodeDecodeError``, which FastAPI answered with a bare 400 before the route's own checks
  (the enqueue answers the token's refusals, 401 and 429, before a body's).

Both are a ``json.JSONDecodeError``: FastAPI's validation error (``json_invalid``), whose
handler (``errors.install``) puts the enqueue's token check first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Coroutine

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response


class _NotANumber(ValueError):
    pass


def _constant(name: str) -> float:
    raise _NotANumber(f"{name} is not a JSON number")


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NotANumber(f"{text[:40]} is beyond a double's range")
    return value


def strict_loads(body: bytes) -> object:
    """``json.loads(body)``, raising ``json.JSONDecodeError`` for ``NaN``/``Infinity`` (given, or a
    number beyond a double's range), for bytes that are not text (UTF-8, or UTF-16/32 as
    ``json.loads`` reads bytes) and for nesting beyond the parser's recursion."""
    try:
        return json.loads(body, parse_constant=_constant, parse_float=_float)
    except _NotANumber as exc:
        problem = str(exc)
    except UnicodeDecodeError:
        problem = "the body is not UTF-8 text"
    except RecursionError:
        problem = "nested too deeply"
    raise json.JSONDecodeError(problem, body.decode("utf-8", "replace"), 0) from None


class JsonRequest(Request):
    """A ``Request`` whose ``json()`` is ``strict_loads``'s."""

    async def json(self) -> object:
        """The body as JSON (``strict_loads``: raises ``json.JSONDecodeError``), read once."""
        if not hasattr(self, "_json"):
            self._json = strict_loads(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """An ``APIRoute`` handing its endpoint a ``JsonRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[object, object, Response]]:
        """FastAPI's handler for this route, given each request as a ``JsonRequest``."""
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(JsonRequest(request.scope, request.receive))

        return route
