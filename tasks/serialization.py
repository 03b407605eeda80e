"""orjson as the Celery/kombu serializer: JSON on the wire, never pickle.

Registered under the name ``orjson`` with content type
``application/x-orjson``; bodies are UTF-8 JSON text, so any JSON reader can
decode them.

Celery's events (``event_serializer``) must stay ``application/json``: Flower and any event
consumer decode them with kombu's ``json``. ``register_json_encoder`` keeps that name, content
type and decoder, and only writes them with orjson (``json_dumps``): a worker sends several
events per task, and kombu's standard-library encoder was most of their cost. What orjson
would write differently from kombu's encoder goes through kombu's own ``dumps``: kombu's typed
values (datetimes, decimals, bytes: its ``__type__`` envelope), integers beyond 64 bits,
non-finite floats and dict keys that are not strings. Two differences remain, both valid JSON:
non-ASCII text is written as UTF-8 rather than ``\\u`` escapes, and a ``uuid.UUID`` as its string
(kombu would wrap it in an envelope; Celery's ids are strings already).
"""

from __future__ import annotations

import math
from typing import Any

import orjson
from kombu.serialization import register
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

SERIALIZER = "orjson"
CONTENT_TYPE = "application/x-orjson"


def _dumps(obj: Any) -> str:
    # OPT_NON_STR_KEYS: Celery headers may hold int keys; default=str keeps exotic
    # values (datetimes in ETA fields are already ISO strings) readable.
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def _loads(data: str | bytes) -> Any:
    return orjson.loads(data)


# Types orjson would write its own way: handed to ``_refuse``, so kombu's encoder writes them.
# Subclasses of str, int, dict and list (Celery's events are ``AttributeDict``s) are written as
# their base type by both encoders, so they stay with orjson. Keys other than ``str`` go to kombu
# too (no ``OPT_NON_STR_KEYS``): orjson writes a float key its own way ("0.00001" for "1e-05",
# "null" for "NaN"), and datetime, UUID or Enum keys that kombu refuses.
_PASSTHROUGH = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS


def _refuse(obj: Any) -> Any:
    raise TypeError(type(obj).__name__)


def json_dumps(obj: Any) -> str:
    """``obj`` as JSON text, as kombu's ``json`` serializer writes it (see the module docstring
    for the two differences). Raises ``TypeError`` for what kombu's encoder cannot write either."""
    try:
        text = orjson.dumps(obj, option=_PASSTHROUGH, default=_refuse)
    except TypeError:  # orjson.JSONEncodeError: a typed value, a key not a str, an integer beyond 64 bits
        return kombu_dumps(obj)
    if b"null" in text and _has_non_finite(obj):  # orjson writes NaN and Infinity as null
        return kombu_dumps(obj)
    return text.decode()


def _has_non_finite(obj: Any) -> bool:
    # Iterative, exact types first: this walk runs for every event and envelope whose text holds a
    # null, and a recursive generator walk cost more than the encoding itself.
    stack = [obj]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or item is None or kind is bool:
            continue
        if kind is float or isinstance(item, float):
            if not math.isfinite(item):
                return True
        elif kind is dict or isinstance(item, dict):
            stack.extend(item.values())
        elif kind is list or kind is tuple or isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def register_json_encoder() -> None:
    """Write kombu's ``json`` serializer (``application/json``: Celery's events) with
    ``json_dumps``; its decoder stays kombu's (idempotent)."""
    register("json", json_dumps, kombu_loads, content_type="application/json", content_encoding="utf-8")


def register_orjson() -> None:
    """Register the ``orjson`` serializer with kombu (idempotent)."""
    register(SERIALIZER, _dumps, _loads, content_type=CONTENT_TYPE, content_encoding="utf-8")
