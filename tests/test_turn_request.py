"""The turn request model and its published JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.turn import TurnRequest

ROOT = Path(__file__).resolve().parent.parent


def test_published_schema_is_current():
    published = json.loads((ROOT / "docs" / "turn-request.schema.json").read_text())
    assert published == TurnRequest.model_json_schema(), "run: agent-runtime schema > docs/turn-request.schema.json"


@pytest.mark.parametrize("bad, field", [
    ({"input": "x", "agent_id": "../../etc"}, "agent_id"),
    ({"input": "x", "max_model_calls": 0}, "max_model_calls"),
    ({"input": "x", "queue": "default"}, "queue"),
    ({"input": "x", "unknown": 1}, "unknown"),
    ({}, "input"),
])
def test_bad_requests_name_the_field(bad, field):
    with pytest.raises(ValidationError) as exc:
        TurnRequest.model_validate(bad)
    assert field in str(exc.value)
