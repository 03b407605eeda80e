"""orjson as the Celery/kombu serializer: JSON on the wire, never pickle.

Registered under the name ``orjson`` with content type
``application/x-orjson``; bodies are UTF-8 JSON text, so any JSON reader can
decode them.
"""

from __future__ import annotations

from typing import Any

import orjson
from kombu.serialization import register

SERIALIZER = "orjson"
CONTENT_TYPE = "application/x-orjson"


def _dumps(obj: Any) -> str:
    # OPT_NON_STR_KEYS: Celery headers may hold int keys; default=str keeps exotic
    # values (datetimes in ETA fields are already ISO strings) readable.
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def _loads(data: str | bytes) -> Any:
    return orjson.loads(data)


def register_orjson() -> None:
    """Register the ``orjson`` serializer with kombu (idempotent)."""
    register(SERIALIZER, _dumps, _loads, content_type=CONTENT_TYPE, content_encoding="utf-8")
