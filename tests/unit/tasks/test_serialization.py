"""The wire formats: Celery's events stay ``application/json`` as kombu's own encoder writes them,
though orjson writes them (``tasks.serialization.json_dumps``)."""

from __future__ import annotations

import enum
import math
import uuid
from datetime import date, datetime, timezone
from decimal import Decimal

import pytest
from celery.utils.collections import AttributeDict
from kombu import serialization
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from tasks.serialization import json_dumps, register_json_encoder

EVENT = {
    "hostname": "gen12@node-a",
    "utcoffset": 0,
    "pid": 1234,
    "clock": 55,
    "uuid": "4910eb0a-1147-429d-95a0-fbdbabfeeb62",
    "name": "tasks.turns.tool_call",
    "args": "read_thing agent=a turn=t step=3 call=c",
    "kwargs": "{}",
    "retries": 0,
    "eta": None,
    "expires": None,
    "timestamp": 1796281325.0468998,
    "type": "task-sent",
    "runtime": 0.0125,
    "result": "{'action': 'advanced'}",
}

SAME_AS_KOMBU = [
    EVENT,
    [EVENT, {**EVENT, "type": "task-received"}],  # a worker's batch (task.multi)
    {"text": 'naïve café ✓ \u2028 "quoted" \\ back', "n": -(2**63), "big": 2**64 - 1},
    {"when": datetime(2026, 12, 3, 7, 0, tzinfo=timezone.utc), "day": date(2026, 12, 3)},
    {"amount": Decimal("1.10"), "raw": b"bytes", "bin": b"\xff\x00"},
    {"huge": 2**70, "tuple": (1, 2, [3, {"x": None}])},
    {1: "int key", "nested": {2: True}},
    AttributeDict(EVENT),  # what Celery's event dispatcher sends
    {"mode": enum.IntEnum("Mode", "A B").B, "kind": enum.Enum("Kind", {"X": "x"}, type=str).X},
    {"nan": float("nan")},
    {"deep": [[{"inf": float("inf")}]]},
]


@pytest.mark.parametrize("value", SAME_AS_KOMBU, ids=range(len(SAME_AS_KOMBU)))
def test_json_dumps_reads_back_as_kombus_own_encoder_writes(value):
    ours, theirs = kombu_loads(json_dumps(value)), kombu_loads(kombu_dumps(value))
    if isinstance(value, dict) and ("nan" in value or "deep" in value):
        # the non-finite floats go through kombu's own encoder: NaN stays NaN, not null
        assert json_dumps(value) == kombu_dumps(value)
        assert math.isnan(ours["nan"]) if "nan" in value else math.isinf(ours["deep"][0][0]["inf"])
        return
    assert ours == theirs


def test_celerys_events_are_written_by_orjson(monkeypatch):
    """The point of ``json_dumps``: an event batch (``AttributeDict``s, strings, numbers, None)
    never falls back to kombu's standard-library encoder."""
    import tasks.serialization as module

    def refused(obj):
        raise AssertionError(f"fell back to kombu's encoder for {obj!r}")

    monkeypatch.setattr(module, "kombu_dumps", refused)
    batch = [AttributeDict(EVENT), AttributeDict({**EVENT, "type": "task-succeeded", "result": None})]
    assert kombu_loads(module.json_dumps(batch)) == batch


def test_typed_values_keep_kombus_envelope():
    text = json_dumps({"when": datetime(2026, 12, 3, tzinfo=timezone.utc), "raw": b"x"})
    assert '"__type__"' in text
    assert kombu_loads(text)["when"] == datetime(2026, 12, 3, tzinfo=timezone.utc)


def test_a_uuid_is_written_as_its_string():
    """The one documented difference besides UTF-8: kombu wraps a ``uuid.UUID`` in an envelope."""
    u = uuid.uuid4()
    assert kombu_loads(json_dumps({"id": u})) == {"id": str(u)}


def test_what_neither_encoder_can_write_raises_type_error():
    with pytest.raises(TypeError):
        json_dumps({"s": {1, 2}})
    with pytest.raises(TypeError):
        kombu_dumps({"s": {1, 2}})


def test_the_json_serializer_keeps_its_content_type_and_decoder():
    register_json_encoder()
    content_type, encoding, body = serialization.dumps(EVENT, serializer="json")
    assert (content_type, encoding) == ("application/json", "utf-8")
    assert body == json_dumps(EVENT)
    # any consumer decodes it with kombu's own json (Flower does)
    assert serialization.loads(body, content_type, encoding) == EVENT
