"""The repair ladder for malformed function-call ``arguments`` strings.

``worker.tooling.arguments`` parses strictly first; this module only runs when that
fails. Policy (docs/arguments.md, ``tests/fixtures/cases/README.md``):

- never invent a value: a key without a value, a string or number cut at the
  end of the text, or a repair library's guess is refused;
- refuse every repair when the response stopped at the output-token limit
  (``response_status == "incomplete"``): the model is told its arguments
  were cut off;
- refuse non-objects, markup/prose instead of JSON, distinct concatenated
  objects, duplicate keys in repaired text (``duplicate_key_error``); call
  envelopes and markup in keys are object checks made on every call, repaired
  or not (``worker.tooling.object_rungs``, driven by ``worker.tooling.arguments``);
- refuse values JSON or storage cannot hold (``check_values``): lone UTF-16
  surrogates (refused, not replaced with U+FFFD: the text would no longer be
  what the model sent), ``NaN``/``Infinity``/``1e400``, integers beyond 64 bits;
- refuse nesting deeper than ``MAX_NESTING_DEPTH`` (128), checked linearly
  (``check_depth``) before any recursive decoder runs.

Text rungs, in order (``repair_arguments``), each named in ``repairs`` when
applied:

1. ``code_fence`` / ``json_header``: one surrounding Markdown fence (``` or
   ~~~, optional tag, also ``"``` json"``), a closing fence alone after the
   object, or a leaked leading ``json`` language tag (A01, A04). An opening
   fence that is never closed is refused (the text may be cut).
2. ``double_encoded``: the whole text is a JSON string whose content is a
   JSON *object*; decoded once (A21, A23). ``escaped_object``: the text is an
   object with every quote escaped one level (``{\\"a\\": 1}``).
3. ``normalize``: one string-aware regex scan that fixes, outside strings:
   over-escaped value quotes (``\\\\"foo\\\\"``, A24), literal ``\\n``/``\\t``
   between tokens (A33), Python ``True``/``False``/``None``, trailing commas;
   inside: single-quoted strings (A19), raw control characters (A35), invalid
   escapes (``invalid_escapes``: a backslash before punctuation JSON never
   escapes is dropped; a short ``\\u`` or a backslash before a letter is
   refused, naming the position); and closes unclosed ``{``/``[`` when the text
   ends at a complete value (A29, A30). A closer that does not match the
   innermost open bracket goes to ``mismatched_closer`` (``_mismatched_closer``:
   kept only when exactly one reading closes the root at the end). After the first object: identical copies are collapsed (A25),
   distinct ones refused (A26), prose is dropped (``trailing_text``, A02).
4. ``json_repair``: the ``json-repair`` package in strict mode, as a last
   rung (unescaped inner quotes, A36; comments; tuples; curly quotes; missing
   commas), only when rung 3 saw balanced delimiters, and only if its output
   passes ``_no_invention``: walked in document order next to the input,
   every token of the input (key, value, bare word, bracket) reappears in the
   output and every output token is the input's own, with only whitespace,
   commas, colons and comments between them. Kept (rather than removed)
   because the rungs above do not cover those kinds and the check makes it
   unable to drop or invent data.

Object rungs (need the tool's schema; ``worker.tooling.object_rungs`` and
``worker.tooling.coercion``, composed in a fixed order by ``worker.tooling.arguments``):
``unwrapped_envelope:<key>``, ``decoded_field:<f>``, ``unwrapped:<k>`` (with
``double_encoded:<k>``), ``coerced:<f>``, each kept only when the result validates.
The whole policy, with an example of every rung and refusal: ``docs/arguments.md``.

Bounds: every rung is one or a few linear passes (compiled regexes without
backtracking over runs: possessive quantifiers for backslash runs and
comments; plain string operations for fences; the json decoders); input above
``MAX_REPAIR_CHARS`` (1 MiB) is refused without trying, so the ladder costs
O(n) with n <= 1 MiB (``tests/test_repair_cases.py`` times adversarial shapes
at 20k and 200k characters).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.tooling.json_checks import (
    CUT_OFF_ERROR,
    DECODER,
    MAX_NESTING_DEPTH,
    MAX_REPAIR_CHARS,
    NotJson,
    Refused,
    check_depth,
    check_values,
    loads_once,
    non_object_error,
    not_json_error,
    too_deep_error,
)
from worker.tooling.json_repair_rung import json_repair_rung
from worker.tooling.text_rungs import (
    JSON_HEADER,
    PY_LITERALS,
    EncodedObjectText,
    Mismatch,
    double_encoded,
    handle_tail,
    normalize,
    strip_fence,
)

__all__ = ["CUT_OFF_ERROR", "MAX_NESTING_DEPTH", "MAX_REPAIR_CHARS", "RepairOutcome", "repair_arguments"]


@dataclass
class RepairOutcome:
    """``ok`` with ``value`` (a dict) and the applied ``repairs``; or ``error`` (text for the model)."""

    ok: bool
    value: Any = None
    repairs: list[str] = field(default_factory=list)
    error: str | None = None


def repair_arguments(raw: str, *, response_status: str = "completed") -> RepairOutcome:
    """Climb the text ladder for an ``arguments`` string that did not parse as a JSON object.

    Returns ``RepairOutcome(ok=True, value=<dict>, repairs=[...])`` or
    ``RepairOutcome(ok=False, error=<text for the model>)``. Never raises.
    ``response_status == "incomplete"`` refuses every repair (OpenAI
    Responses ``status: incomplete`` = stopped at ``max_output_tokens``).
    Envelopes and markup keys are object checks, made by ``worker.tooling.arguments``
    for every call (``worker.tooling.object_rungs``).
    """
    if response_status == "incomplete":
        return RepairOutcome(ok=False, error=CUT_OFF_ERROR)
    if len(raw) > MAX_REPAIR_CHARS:
        return RepairOutcome(
            ok=False,
            error=(
                f"arguments are not valid JSON and are too large to repair ({len(raw)} characters, "
                f"limit {MAX_REPAIR_CHARS}); send valid JSON"
            ),
        )
    repairs: list[str] = []
    try:
        value = _ladder(raw, repairs)
    except Refused as exc:
        return RepairOutcome(ok=False, error=str(exc), repairs=repairs)
    except NotJson:
        return RepairOutcome(ok=False, error=not_json_error(raw), repairs=repairs)
    except RecursionError:  # defence in depth: check_depth runs before every recursive decoder
        return RepairOutcome(ok=False, error=too_deep_error(), repairs=repairs)
    if not isinstance(value, dict):
        return RepairOutcome(ok=False, error=non_object_error(value), repairs=repairs)
    bad = check_values(value)
    if bad:
        return RepairOutcome(ok=False, error=bad, repairs=repairs)
    return RepairOutcome(ok=True, value=value, repairs=repairs)


def _ladder(raw: str, repairs: list[str]) -> Any:
    text = raw
    depth = check_depth(raw)
    if depth:
        raise Refused(depth)
    fenced = strip_fence(text)
    if fenced is not None:
        text = fenced
        repairs.append("code_fence")
    else:
        h = JSON_HEADER.match(text)
        if h:
            text = text[h.end() :]
            repairs.append("json_header")
    text = text.strip()
    if not text:
        return {}
    if text != raw:
        try:
            return loads_once(text)
        except orjson.JSONDecodeError:
            pass
    first = text[0]
    if first == '"':
        try:
            return double_encoded(text, repairs)
        except EncodedObjectText as exc:  # composes once: the decoded text climbs the rest of the ladder
            repairs.append("double_encoded")
            text = first_text = exc.inner
            first = "{"
    else:
        first_text = None
    if first_text is None and text.startswith('{\\"'):
        try:
            inner = json.loads('"' + text + '"')
            depth = check_depth(inner)
            if depth:
                raise Refused(depth)
            value = loads_once(inner)
        except (json.JSONDecodeError, orjson.JSONDecodeError):
            pass
        else:
            repairs.append("escaped_object")
            return value
    if first != "{":
        # A lone Python literal or JSON scalar is still a non-object; anything else is not JSON.
        if text in PY_LITERALS:
            return None if text == "None" else text == "True"
        try:
            return loads_once(text)
        except orjson.JSONDecodeError:
            raise NotJson("not an object") from None
    scratch: list[str] = []
    try:
        normalized, end, balanced = normalize(text, 0, scratch)
    except Mismatch as exc:
        value, names = _mismatched_closer(text, exc)
        repairs.extend(names)
        return value
    try:
        value = DECODER.decode(normalized)
    except json.JSONDecodeError:
        if not balanced:
            raise NotJson("not JSON after closing delimiters") from None
        # Rung 4: json-repair on the first value, only when its delimiters balance (no truncation).
        value = json_repair_rung(text[:end])
        repairs.append("json_repair")
        handle_tail(text, end, value, repairs)
        return value
    repairs.extend(scratch)
    handle_tail(text, end, value, repairs)
    return value


def _mismatched_closer(text: str, exc: Mismatch) -> tuple[Any, list[str]]:
    """Rung ``mismatched_closer``: a ``]`` or ``}`` that does not close the innermost open bracket.

    Two readings are tried, each only at that position and without inventing a
    value: a closer was lost before it (insert the closers of the brackets open
    above the one it matches: ``{"a": [{"b": 1]}`` -> ``{"a": [{"b": 1}]}``), or
    it is the wrong closer (replace it: ``{"a": {"b": [1}}}`` -> ``{"a": {"b": [1]}}``).
    A reading counts when the rest of the text then closes the root object
    exactly at its end, with no other fault and no further repair. Exactly one
    such reading is kept; none or both are refused, naming the position. Two
    more linear scans at most. (The response is complete here: an incomplete
    one never reaches the ladder.)
    """
    pos, closer = exc.pos, exc.closer
    readings: list[str | None] = []
    inner = exc.stack.index(_OPENER[closer], 0) if _OPENER[closer] in exc.stack else -1
    if inner >= 0:
        last = max(i for i, c in enumerate(exc.stack) if c == _OPENER[closer])
        lost = "".join(_CLOSER_OF[c] for c in reversed(exc.stack[last + 1 :]))
        readings.append(text[:pos] + lost + text[pos:])
    readings.append(text[:pos] + _CLOSER_OF[exc.stack[-1]] + text[pos + 1 :] if exc.stack else None)
    found = []
    for cand in readings:
        if cand is None:
            continue
        scratch: list[str] = []
        try:
            normalized, end, balanced = normalize(cand, 0, scratch)
            if not balanced or cand[end:].strip():
                continue
            value = DECODER.decode(normalized)
        except (NotJson, Refused, json.JSONDecodeError):
            continue
        found.append((value, scratch))
    opener_at = exc.opened[-1] if exc.opened else 0
    if len(found) == 1:
        value, scratch = found[0]
        return value, ["mismatched_closer"] + scratch
    why = "can be read more than one way" if found else "cannot be closed without guessing"
    raise Refused(
        f"the {closer!r} at character {pos} does not close the {exc.stack[-1] if exc.stack else ''!r} opened at "
        f"character {opener_at}, and the bracket structure {why}; nothing was run: send the complete, "
        "well-formed JSON object"
    )


_OPENER = {"}": "{", "]": "["}
_CLOSER_OF = {"{": "}", "[": "]"}
