"""Attacks on P1's fast paths: Celery's events written with orjson (``json_dumps``)."""

from __future__ import annotations

from datetime import datetime

import pytest
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from tasks.serialization import json_dumps

# Float keys: kombu (the standard library's json) writes ``repr``-style text ("1e-05", "NaN"),
# orjson its own ("0.00001", "null"). A key is a string once decoded, so the text is the data.
FLOAT_KEYS = [1e-05, 1e-07, float("nan"), float("inf"), float("-inf")]


@pytest.mark.parametrize("key", FLOAT_KEYS, ids=repr)
def test_a_float_key_reads_back_as_kombu_writes_it(key):
    value = {"fields": {key: "v"}}
    assert kombu_loads(json_dumps(value)) == kombu_loads(kombu_dumps(value))


def test_nan_and_none_keys_stay_two_keys():
    value = {float("nan"): 1, None: 2}
    assert kombu_loads(json_dumps(value)) == {"NaN": 1, "null": 2}


def test_a_key_kombu_cannot_write_raises_type_error():
    """The docstring's promise: ``TypeError`` for what kombu's encoder cannot write either."""
    value = {datetime(2026, 12, 3): 1}
    with pytest.raises(TypeError):
        kombu_dumps(value)
    with pytest.raises(TypeError):
        json_dumps(value)
