"""What every step and every call reads again is parsed or checked once per process: the stored
request (``worker.turn.request.stored_request``) and a tool definition (``define_worker_tool``,
raw schemas included, by their content)."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from worker.tooling.contract import define_worker_tool
from worker.tooling.errors import ToolDefinitionError
from worker.turn import request as request_module
from worker.turn.request import TurnRequest, stored_request
from worker.turn.state import TurnState


def _raw(**fields) -> bytes:
    return orjson.dumps({"input": "hi", "agent_id": "alice", **fields})


def test_the_same_stored_bytes_give_the_same_request_once_validated():
    raw = _raw(metadata={"k": "v"})
    first = stored_request(raw)
    assert isinstance(first, TurnRequest) and first.metadata == {"k": "v"}
    assert stored_request(bytes(raw)) is first  # equal bytes, another object: still one parse
    assert stored_request(_raw(metadata={"k": "w"})) is not first


def test_a_shared_request_cannot_be_changed():
    shared = stored_request(_raw())
    with pytest.raises(ValidationError):
        shared.agent_id = "mallory"  # type: ignore[misc]
    assert stored_request(_raw()).agent_id == "alice"


def test_an_invalid_stored_request_raises_every_time_and_is_not_kept():
    raw = _raw(agent_id="../escape")
    for _ in range(2):
        with pytest.raises(ValidationError):
            stored_request(raw)
    assert raw not in request_module._PARSED


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(request_module, "_PARSED", request_module._Kept())
    monkeypatch.setattr(request_module, "_PARSED_MAX", 3)
    raws = [_raw(metadata={"n": i}) for i in range(5)]
    for raw in raws:
        stored_request(raw)
    assert list(request_module._PARSED) == raws[2:]  # the oldest went first


def test_a_state_read_from_the_hash_parses_its_request_through_the_cache():
    raw = _raw(toolset="testing")
    state = TurnState.from_hash("t1", {b"request": raw, b"status": b"running", b"step": b"2"})
    assert state.turn_request() is stored_request(raw)
    built = TurnState("t2", state.status, 0, "model", 0, {"input": "x"}, "agent")  # not from a hash
    assert built.turn_request().input == "x"


def _echo(params, ctx):
    return "ok"


def test_a_raw_schema_is_checked_again_when_its_content_changes():
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    for _ in range(2):  # the second definition is the cached one
        assert define_worker_tool(name="raw_q", description="Q.", json_schema=schema, execute=_echo).name == "raw_q"
    schema["properties"]["q"]["$ref"] = "https://example.com/remote.json"  # the same dict, now broken
    with pytest.raises(ToolDefinitionError):
        define_worker_tool(name="raw_q", description="Q.", json_schema=schema, execute=_echo)
    with pytest.raises(ToolDefinitionError):  # and refused every time, never cached
        define_worker_tool(name="raw_q", description="Q.", json_schema=schema, execute=_echo)


def test_a_raw_schema_that_is_not_json_is_refused_every_time():
    schema = {"type": "object", "properties": {"q": {"enum": {1, 2}}}}
    for _ in range(2):
        with pytest.raises(ToolDefinitionError):
            define_worker_tool(name="raw_set", description="S.", json_schema=schema, execute=_echo)
