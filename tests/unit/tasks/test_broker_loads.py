"""``tasks.broker.loads``: kombu's Redis transport decodes what it pops and restores with orjson,
to the same values as kombu's own decoding, whatever the text."""

from __future__ import annotations

import math

import pytest
from kombu.transport import redis as kombu_redis
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from tasks import broker

ENVELOPE = (
    '{"body": "W1siYSIsIDBdLCB7fSwgeyJjYWxsYmFja3MiOiBudWxsfV0=", "content-encoding": "utf-8", '
    '"content-type": "application/x-orjson", "headers": {"lang": "py", "task": "tasks.turns.turn_step", '
    '"id": "5c1c5d0e", "retries": 0, "timelimit": [null, null], "eta": null}, "properties": '
    '{"delivery_info": {"exchange": "", "routing_key": "turns"}, "priority": 0, "delivery_tag": "t-1"}}'
)
TYPED = kombu_dumps({"when": __import__("datetime").datetime(2026, 12, 5, 7, 0), "n": 1})


@pytest.mark.parametrize(
    "text", [ENVELOPE, f'[{ENVELOPE}, "", "turns"]', TYPED, "[1, 2.5, true, null]", str(2**70), '["ü日本"]', "{}"]
)
def test_the_same_values_as_kombus_decoding(text):
    assert broker.loads(text) == kombu_loads(text)
    assert broker.loads(text.encode()) == kombu_loads(text)


def test_what_orjson_refuses_goes_to_kombus_decoding():
    assert math.isnan(broker.loads("[NaN]")[0])
    assert broker.loads(str(2**70)) == 2**70 and isinstance(broker.loads(str(2**70)), int)


@pytest.mark.parametrize("n", [2**64, -(2**63) - 1, 10**19, 10**30])
def test_an_integer_beyond_64_bits_keeps_its_exact_value(n):
    text = f'{{"headers": {{"n": {n}}}, "body": "W1siYSIsIDBdLCB7fSwgeyJjYWxsYmFja3MiOiBudWxsfV0="}}'
    assert broker.loads(text)["headers"]["n"] == n and isinstance(broker.loads(text)["headers"]["n"], int)


def test_kombus_redis_transport_decodes_with_it():
    assert kombu_redis.loads is broker.loads
