"""The runtime rules of ``fixtures/cases/parallel-tool-calls.json``, each checked through a real worker.

Cases about other wires (E02 chat, E04 Anthropic) or features we do not use
(E03 history trimming, E05 previous_response_id replay, E15 Assistants) are listed
in NOT_APPLICABLE with the reason, so the table stays complete.
"""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from tests.support.scripts import fc
from worker.turn.request import TurnStatus

CASES = {
    c["id"]: c
    for c in json.loads(
        (Path(__file__).resolve().parents[1] / "fixtures" / "cases" / "parallel-tool-calls.json").read_text()
    )
}

NOT_APPLICABLE = {
    "E02-missing-output-chat": "Chat Completions wire; the runtime speaks Responses only (E01 covers the rule)",
    "E03-orphan-output": "the runtime never trims or summarizes history",
    "E04-anthropic-missing-result": "Anthropic wire; not spoken here",
    "E05-duplicate-item-id": "the runtime sends full input with store=false, never previous_response_id",
    "E15-output-too-large-assistants": "Assistants API; per-output caps (E14) apply on Responses",
}
COVERED = {
    "E01-missing-output-responses",
    "E06-duplicate-call-id",
    "E07-duplicate-call-id-silent",
    "E08-wrong-id-prefix",
    "E09-order-anthropic",
    "E10-order-gemini",
    "E11-order-silent",
    "E12-output-not-string-dict",
    "E13-output-python-repr",
    "E14-output-too-large-chat",
    "E16-arguments-too-large-replay",
    "E17-concatenated-parallel",
    "E18-hallucinated-parallel-wrapper",
}


def test_every_case_is_covered_or_explained():
    assert set(CASES) == COVERED | set(NOT_APPLICABLE)
    for case in CASES.values():
        assert case["sources"] and case["runtime_rule"]


@pytest.fixture
def turn(control, gateway, script_name):
    def run(steps):
        gateway.add_script(script_name, steps + [{"output": [{"type": "message", "text": "ok"}]}])
        turn_id = control.enqueue({"input": "go", "model": script_name, "toolset": "testing"})
        view = control.wait(turn_id, timeout=60)
        # the gateway answers 400 like the API if any call lacks its output: completing proves E01
        assert view.status == TurnStatus.completed, view
        return control.items(turn_id)

    return run


def pairs(items):
    calls = [i for i in items if i["type"] == "function_call"]
    outs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    return [(c, outs[c["call_id"]]) for c in calls]


def test_E01_E17_E18_every_call_gets_one_output_even_when_refused(turn):
    items = turn(
        [
            {
                "output": [
                    fc("read_thing", '{"label": "a"}{"label": "b"}'),  # E17: distinct glued objects: refused
                    fc("multi_tool_use.parallel", '{"tool_uses": [{"recipient_name": "functions.read_thing"}]}'),  # E18
                    fc("read_thing", '{"label": "ok"}'),
                ]
            }
        ]
    )
    got = pairs(items)
    assert len(got) == 3
    assert "several different JSON objects" in got[0][1] and "corrected call" in got[0][1]
    assert got[1][0]["name"] == "multi_tool_use_parallel"  # recorded with a name the API accepts back
    assert "unknown tool 'multi_tool_use.parallel'" in got[1][1]
    assert orjson.loads(got[2][1])["label"] == "ok"


def test_E06_E07_duplicate_call_ids_are_renamed_pairwise(turn):
    items = turn(
        [
            {
                "output": [
                    fc("read_thing", '{"label": "first"}', "call_same"),
                    fc("read_thing", '{"label": "second"}', "call_same"),
                ]
            },
            {"output": [fc("read_thing", '{"label": "third"}', "call_same")]},
        ]
    )
    got = pairs(items)
    ids = [c["call_id"] for c, _ in got]
    assert len(set(ids)) == 3 and ids[0] == "call_same"
    assert orjson.loads(got[0][1])["label"] == "first"
    assert "repeated call_id 'call_same'" in got[1][1]
    assert "repeated call_id 'call_same'" in got[2][1]


def test_E08_to_E11_outputs_pair_by_call_id_in_call_order(turn):
    items = turn(
        [
            {
                "output": [
                    fc("read_thing", '{"label": "slow", "ms": 150}'),
                    fc("read_thing", '{"label": "fast"}'),
                    fc("read_thing", '{"label": "mid", "ms": 40}'),
                ]
            }
        ]
    )
    calls = [i for i in items if i["type"] == "function_call"]
    outs = [i for i in items if i["type"] == "function_call_output"]
    assert [o["call_id"] for o in outs] == [c["call_id"] for c in calls]
    assert all(c["id"].startswith("fc_") and c["call_id"].startswith("call_") for c in calls)
    assert [orjson.loads(o["output"])["label"] for o in outs] == ["slow", "fast", "mid"]


def test_E12_E13_structured_output_is_json_not_repr(turn):
    items = turn([{"output": [fc("read_thing", '{"label": "x"}')]}])
    out = [i for i in items if i["type"] == "function_call_output"][0]["output"]
    assert isinstance(out, str) and orjson.loads(out) == {"label": "x", "slept_ms": 0}
    assert "'label'" not in out


def test_E14_oversized_output_is_capped_before_history(turn):
    items = turn([{"output": [fc("big_output", "{}")]}])
    out = [i for i in items if i["type"] == "function_call_output"][0]["output"]
    assert len(out) <= 32_000 and "characters cut" in out


def test_E16_oversized_arguments_of_a_refused_call_are_cut_for_replay(turn):
    huge = '{"label": "' + "x" * 50_000  # cut-off string: refused, never run
    items = turn([{"output": [fc("read_thing", huge)]}])
    call = [i for i in items if i["type"] == "function_call"][0]
    assert len(call["arguments"]) < 21_000 and "characters in all" in call["arguments"]
    out = [i for i in items if i["type"] == "function_call_output"][0]["output"]
    assert len(out) < 5_000  # the echo of the raw arguments is capped too
