"""Attacks on P1's fast paths: Celery's events written with orjson (``json_dumps``) and the stored
request parsed once per process (``stored_request``)."""

from __future__ import annotations

import sys
import threading
from datetime import datetime

import orjson
import pytest
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads
from pydantic import ValidationError

from tasks.serialization import json_dumps
from worker.turn import request as request_module
from worker.turn.request import TurnRequest

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


def test_stored_request_is_safe_from_concurrent_threads(monkeypatch):
    """A threads pool's tasks read their turns' stored requests at once; when the cache is full,
    two of them evicting the same oldest entry must not make one raise ``KeyError`` (that step
    would crash and end its turn ``failed``)."""
    monkeypatch.setattr(request_module, "_PARSED", request_module._Kept())
    monkeypatch.setattr(request_module, "_PARSED_MAX", 2)
    raws = [orjson.dumps({"input": f"m{i}", "agent_id": "alice"}) for i in range(64)]
    errors: list[BaseException] = []

    def run(offset: int) -> None:
        for n in range(2000):
            try:
                request_module.stored_request(raws[(n * 7 + offset) % len(raws)])
            except BaseException as exc:  # any error is the failure
                errors.append(exc)
                return

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    assert len(request_module._PARSED) <= 2


@pytest.mark.parametrize(
    ("part", "field", "value"),
    [("supports", "spawn_jobs", True), ("approval", "mode", "off"), ("token_budget", "total_tokens", 10**9)],
)
def test_a_shared_requests_parts_cannot_be_changed_either(part, field, value):
    """``stored_request`` shares one instance among every step, call and turn whose stored bytes
    are equal (docs/architecture.md: "the shared instance cannot be changed by one step under
    another"): its nested models are frozen too, not only the request itself. A step that set
    ``approval.mode = "off"`` would waive approvals for every turn stored with the same bytes."""
    raw = orjson.dumps({"input": "hi", "agent_id": "alice", "token_budget": {"total_tokens": 100}})
    shared = request_module.stored_request(raw)
    with pytest.raises(ValidationError):
        setattr(getattr(shared, part), field, value)
    assert request_module.stored_request(raw) == TurnRequest.model_validate_json(raw)


def test_the_request_cache_is_bounded_in_bytes(monkeypatch):
    """Requests may be up to ``AGENT_MAX_INPUT_BYTES`` (1 MB, about 5 MB once parsed): 1,024 of
    them kept by count alone held gigabytes in a worker that had run a thousand long turns."""
    monkeypatch.setattr(request_module, "_PARSED", request_module._Kept())
    monkeypatch.setattr(request_module, "_PARSED_MAX_BYTES", 10_000)
    raws = [orjson.dumps({"input": f"{i}" + "x" * 3_000, "agent_id": "alice"}) for i in range(10)]
    for raw in raws:
        assert request_module.stored_request(raw).agent_id == "alice"
        assert sum(map(len, request_module._PARSED)) == request_module._PARSED.nbytes <= 10_000
    assert list(request_module._PARSED) == raws[-3:]  # the oldest went first
    huge = orjson.dumps({"input": "y" * 20_000, "agent_id": "alice"})
    assert request_module.stored_request(huge).input == "y" * 20_000  # parsed, not kept
    assert huge not in request_module._PARSED and list(request_module._PARSED) == raws[-3:]
