"""A JSON response encoded with orjson (FastAPI's own ``ORJSONResponse`` is deprecated)."""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import Response


class JsonResponse(Response):
    """``content`` as JSON (orjson: non-string dict keys allowed, datetimes as ISO 8601)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
