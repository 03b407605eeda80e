"""``TurnState.from_hash`` reads every field of ``turn:{id}`` and its defaults for absent ones."""

import orjson

from worker.turn.state import TurnState, TurnStatus


def test_every_field_is_read_from_the_hash() -> None:
    h = {
        b"status": b"running", b"step": b"3", b"phase": b"tools", b"model_calls": b"2",
        b"request": orjson.dumps({"input": "hi", "queue": "q"}), b"agent_id": b"a1",
        b"final_output": b"done \xc3\xa9", b"error": b"boom", b"terminate": b"1",
        b"finish_misses": b"1", b"unread_replies": b"2", b"invalid_counts": b'{"t": 1}',
        b"loaded_tools": b'["x"]', b"created_at": b"1.5", b"updated_at": b"2.5",
        b"redrives": b"4", b"traceparent": b"00-a-b-01",
    }  # fmt: skip
    st = TurnState.from_hash("t1", h)
    assert (st.turn_id, st.status, st.step, st.phase, st.model_calls) == ("t1", TurnStatus.running, 3, "tools", 2)
    assert st.request == {"input": "hi", "queue": "q"} and st.request_raw == h[b"request"]
    assert (st.agent_id, st.final_output, st.error, st.terminate) == ("a1", "done é", "boom", True)
    assert (st.finish_misses, st.unread_replies, st.invalid_counts, st.loaded_tools) == (1, 2, {"t": 1}, ["x"])
    assert (st.created_at, st.updated_at, st.redrives, st.traceparent) == (1.5, 2.5, 4, "00-a-b-01")


def test_absent_fields_take_their_defaults() -> None:
    st = TurnState.from_hash("t2", {b"status": b"queued"})
    assert (st.step, st.phase, st.model_calls, st.request, st.agent_id) == (0, "model", 0, {}, "agent")
    assert (st.final_output, st.error, st.traceparent, st.terminate) == (None, None, None, False)
    assert (st.invalid_counts, st.loaded_tools, st.redrives, st.created_at) == ({}, [], 0, 0.0)
