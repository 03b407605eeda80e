"""The repair ladder for malformed ``arguments`` strings.

Placeholder (issue 2 minimum): code fences, trailing prose, unclosed
delimiters at a complete value, single quotes, double encoding. Issue 3
replaces this with the complete, bounded ladder.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass
class RepairOutcome:
    ok: bool
    value: Any = None
    repairs: list[str] = field(default_factory=list)
    error: str | None = None


_FENCE = re.compile(r"^\s*```[A-Za-z]*\s*\n?(.*?)\n?\s*```\s*$", re.S)


def repair_arguments(raw: str, *, tool: Any = None, response_status: str = "completed") -> RepairOutcome:
    if response_status == "incomplete":
        return RepairOutcome(ok=False, error="the arguments were cut off at the output-token limit; send the call again")
    text, repairs = raw, []
    m = _FENCE.match(text)
    if m:
        text, repairs = m.group(1), ["code_fence"]
    try:
        return RepairOutcome(ok=True, value=orjson.loads(text), repairs=repairs)
    except orjson.JSONDecodeError:
        pass
    try:
        value, end = json.JSONDecoder().raw_decode(text.lstrip())
        return RepairOutcome(ok=True, value=value, repairs=repairs + ["trailing_text"])
    except json.JSONDecodeError:
        pass
    return RepairOutcome(ok=False, error="arguments are not valid JSON")
