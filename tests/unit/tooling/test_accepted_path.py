"""The accepted path of ``validate_tool_arguments`` (the call that validates as sent) takes the same
decisions as the checked path, with less work: the raw-schema tool's happy path applies the float
rule itself, a full stop in a string is not a float, markup is still found, and the per-tool cache
lives as long as its tool (docs/arguments.md; the ratios: bench/README.md)."""

from __future__ import annotations

import gc

import pytest

from worker.tooling import schemas
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.coercion import has_float_token
from worker.tooling.contract import ToolResult, define_worker_tool
from worker.tooling.markup import markup_hinted
from worker.tooling.schemas import validation_info

NUMBERS = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "note": {"type": "string"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {"qty": {"type": "integer"}}}},
    },
}


def _raw(schema=NUMBERS, name="numbers", **kw):
    return define_worker_tool(
        name=name, description="d", execute=lambda p, c: ToolResult("ok"), json_schema=schema, **kw
    )


@pytest.mark.parametrize(
    ("raw", "params", "repairs"),
    [
        ('{"n": 3, "note": "done."}', {"n": 3, "note": "done."}, []),
        ('{"n": 3.0, "note": "done."}', {"n": 3, "note": "done."}, ["coerced:n"]),
        ('{"n": 2e3}', {"n": 2000}, ["coerced:n"]),
        ('{"n": 3, "x": 2.0}', {"n": 3, "x": 2.0}, []),
        ('{"lines": [{"qty": 2.0}, {"qty": 1}], "note": "v1.2"}', {"lines": [{"qty": 2}, {"qty": 1}], "note": "v1.2"},
         ["coerced:lines[0].qty"]),
    ],
)  # fmt: skip
def test_raw_tool_valid_call_applies_the_float_rule(raw, params, repairs):
    """An integral float where the schema takes an integer is made the integer on the happy path
    too, recorded as ``coerced:<field>``; a number field keeps its float; text with a full stop or
    a version string holds no float."""
    out = validate_tool_arguments(_raw(), raw)
    assert out.ok, out.error
    assert out.params == params and out.data == params and out.repairs == repairs
    assert [type(v) for v in out.params.values()] == [type(v) for v in params.values()]


def test_raw_tool_float_in_a_cut_off_response_is_refused():
    """The float rule is a repair: under ``status: incomplete`` the call is refused as cut off."""
    out = validate_tool_arguments(_raw(), '{"n": 3.0}', response_status="incomplete")
    assert not out.ok and out.error_kind == "cut_off"


def test_repaired_text_spelling_a_float_without_a_digit_before_the_point_is_still_coerced():
    """``.0`` (a Python literal, repaired by json-repair) is a float the JSON-only test would miss:
    the checked path counts any ``.``, so the integer field still gets an integer."""
    out = validate_tool_arguments(_raw(), "{'n': .0}")
    assert out.ok and out.params == {"n": 0} and type(out.params["n"]) is int
    assert out.repairs == ["json_repair", "coerced:n"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"note": "done. end."}', False),
        ('{"note": "take 3e"}', True),  # a digit before "e": a superset test
        ('{"x": 1.5}', True),
        ('{"x": 2e3}', True),
        ('{"x": 2E3}', True),
        ('{"n": 3}', False),
        ('{"note": "e.g. one"}', False),
    ],
)
def test_float_token_needs_a_digit_before_the_point_or_the_exponent(text, expected):
    assert has_float_token(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"a": ["x", "y"]}', False),
        ('{"a": ["S", "D"], "b": "[x]"}', False),
        ('{"a": {"[TOOL_CALLS]": 1}}', True),
        ('{"a": {"[/TOOL_CALLS]": 1}}', True),
        ('{"a": {"[ARGS]": 1}}', True),
        ('{"a": {"[CALL_ID]": 1}}', True),
        ('{"a": {"[TOOL_RESULTS]": 1}}', True),
        ('{"a": "x<y"}', True),
        ('{"a": "<|x|>"}', True),
    ],
)
def test_markup_hint_finds_every_control_token(text, expected):
    assert markup_hinted(text) is expected


def test_raw_tool_nested_control_token_key_is_refused():
    """A control token in a nested key of an open schema is refused, not taken as sent."""
    out = validate_tool_arguments(_raw({"type": "object"}, name="open"), '{"a": {"[ARGS]": 1}}')
    assert not out.ok and out.error_kind == "parse" and "[ARGS]" in (out.error or "")


def test_accepted_outcome_lists_are_its_own():
    """An accepted outcome's ``repairs`` and ``errors`` are lists made when first read: empty, and
    one outcome's list is not another's."""
    tool = _raw()
    first, second = validate_tool_arguments(tool, '{"n": 1}'), validate_tool_arguments(tool, '{"n": 2}')
    assert first.repairs == [] and first.errors == [] and second.repairs == []
    first.repairs.append("x")
    assert first.repairs == ["x"] and second.repairs == [] and first.repairs is first.repairs


def test_validation_info_lives_as_long_as_its_tool():
    """The cache of a tool's validation info is dropped with the tool; a tool made later (even one
    that reuses the address) gets its own info, never the gone tool's."""
    tool = _raw(name="short_lived")
    key = id(tool)
    info = validation_info(tool)
    assert validation_info(tool) is info and key in schemas._INFO_BY_ID
    del tool
    gc.collect()
    assert key not in schemas._INFO_BY_ID
    other = _raw({"type": "object", "properties": {"q": {"type": "string"}}}, name="other")
    assert validation_info(other).properties == {"q": {"type": "string"}}


def test_a_tool_defined_again_shares_its_compiled_validator():
    """A category creator defines its tools again for every call: the same schema (by content, a new
    dict each time) is compiled once, and a different schema gets its own validator."""
    first = _raw(dict(NUMBERS), name="again")
    second = _raw({**NUMBERS, "properties": dict(NUMBERS["properties"])}, name="again")
    assert first is not second and first.json_schema is not second.json_schema
    assert validation_info(first).validator is validation_info(second).validator
    other = _raw({"type": "object", "properties": {"n": {"type": "string"}}}, name="again")
    assert validation_info(other).validator is not validation_info(first).validator
    assert not validate_tool_arguments(other, '{"n": 3}').ok and validate_tool_arguments(second, '{"n": 3}').ok


def test_a_defined_tool_has_every_field_the_dataclass_would_set():
    """``define_worker_tool`` fills the frozen dataclass with one dict update (category creators define
    every tool again per call): the same fields and values as ``WorkerTool(...)``, nothing more."""
    import dataclasses

    from worker.tooling.contract import WorkerTool

    def run(p, c):
        return ToolResult("ok")

    kw = dict(name="every_field", description="d", execute=run, json_schema={"type": "object"}, strict=False,
              namespace="ns", namespace_description="the ns", defer_loading=True, execution_mode="sequential",
              is_read_only=False, is_destructive=True, describe_activity=lambda p: "a",
              describe_completed_activity=lambda p, r: "b", needs_approval=True, needs_computer=True)  # fmt: skip
    defined = define_worker_tool(**kw)
    assert vars(defined) == vars(WorkerTool(**kw))
    assert set(vars(defined)) == {f.name for f in dataclasses.fields(WorkerTool)}
    assert dataclasses.replace(defined, defer_loading=False).defer_loading is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        defined.name = "other"  # type: ignore[misc]
    minimal = define_worker_tool(name="minimal", description="d", execute=run)
    assert vars(minimal) == vars(WorkerTool(name="minimal", description="d", execute=run))
