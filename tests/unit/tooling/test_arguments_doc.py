"""Every example of the argument policy (docs/arguments.md) is what the runtime does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import ToolResult, define_worker_tool

DOC = Path(__file__).resolve().parents[3] / "docs" / "arguments.md"
README = Path(__file__).resolve().parents[3] / "README.md"
SCHEMAS = {
    "open": {"type": "object"},
    "path": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
        "additionalProperties": False,
    },
    "tags": {
        "type": "object",
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["tags"],
    },
    "numbers": {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "b": {"type": "boolean"}},
    },
    "mode": {
        "type": "object",
        "properties": {"mode": {"enum": ["fast", "safe", "dry-run", "verbose", "quiet", "strict", "lenient"]}},
    },
}
ROW = re.compile(r"^\| (?P<name>.+?) \| (?P<schema>\w+) \| `` (?P<raw>\".*\") `` \| (?P<res>.*) \|$")
OK = re.compile(r"^`` (?P<data>.*) `` repairs `` (?P<repairs>.*) ``$")
ROWS = [m.groupdict() for m in map(ROW.match, DOC.read_text().splitlines()) if m]
SECTIONS = re.findall(r"^## (.+)$", DOC.read_text(), re.M)


@pytest.mark.parametrize("row", ROWS, ids=[r["name"] for r in ROWS])
def test_doc_example(row):
    tool = define_worker_tool(
        name="write_file", description="d", execute=lambda p, c: ToolResult("ok"), json_schema=SCHEMAS[row["schema"]]
    )
    status = "incomplete" if "incomplete" in row["name"] else "completed"
    out = validate_tool_arguments(tool, json.loads(row["raw"]), response_status=status)
    if row["res"].startswith("refused: "):
        assert not out.ok and row["res"][len("refused: ") :] in out.error.replace("|", "/"), out.error
    else:
        m = OK.match(row["res"])
        assert m, row["res"]
        assert out.ok, out.error
        assert out.data == json.loads(m["data"]) and out.repairs == json.loads(m["repairs"])


def test_doc_lists_every_rung_the_coercion_rule_and_the_refusals():
    names = {r["name"] for r in ROWS}
    rungs = {
        "code_fence",
        "json_header",
        "double_encoded",
        "escaped_object",
        "over_escaped_quotes",
        "stray_escapes",
        "python_literals",
        "trailing_comma",
        "single_quotes",
        "control_characters",
        "invalid_escapes",
        "closed_delimiters",
        "mismatched_closer",
        "duplicate_objects_collapsed",
        "redundant_closers",
        "trailing_text",
        "json_repair",
        "leading_empty_object",
        "truncated_copy_dropped",
        "unwrapped_envelope:<key>",
        "decoded_python_literal:<field>",
        "decoded_field:<field>",
        "unwrapped:<key>",
        "coerced:<field>",
    }
    assert rungs <= names, rungs - names
    assert len(names - rungs) >= 20  # the refusals
    assert {"Text rungs", "Object rungs", "Keys and markup", "The coercion rule", "Refusals"} <= set(SECTIONS)
    for refusal in ("markup in a value", "respelled parameter", "second object cut off", "cut off, a field missing"):
        assert any(n.startswith(refusal) for n in names), refusal
    assert "docs/arguments.md" in README.read_text()  # the README links the policy
