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
   Stream artifacts (``worker.tooling.stream_rungs``): empty objects before the object are
   dropped (``leading_empty_object``); a run of cut copies of the object's beginning before
   it (a provider resending the arguments-so-far) keeps the one complete object
   (``truncated_copy_dropped``).
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
   a cut copy of its beginning is dropped (``truncated_copy_dropped``), distinct ones refused
   (A26), prose is dropped (``trailing_text``, A02).
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
O(n) with n <= 1 MiB (``tests/unit/tooling/test_repair_cases.py`` times adversarial shapes
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
from worker.tooling.stream_rungs import cumulative_copies, drop_leading_empty
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
    ladder = _Ladder(raw)
    try:
        value = ladder.climb()
    except Refused as exc:
        return RepairOutcome(ok=False, error=str(exc), repairs=ladder.repairs)
    except NotJson:
        return RepairOutcome(ok=False, error=not_json_error(raw), repairs=ladder.repairs)
    except RecursionError:  # defence in depth: check_depth runs before every recursive decoder
        return RepairOutcome(ok=False, error=too_deep_error(), repairs=ladder.repairs)
    if not isinstance(value, dict):
        return RepairOutcome(ok=False, error=non_object_error(value), repairs=ladder.repairs)
    bad = check_values(value)
    if bad:
        return RepairOutcome(ok=False, error=bad, repairs=ladder.repairs)
    return RepairOutcome(ok=True, value=value, repairs=ladder.repairs)


def _refuse_too_deep(text: str) -> None:
    depth = check_depth(text)
    if depth:
        raise Refused(depth)


class _Ladder:
    """One climb of the text ladder (the module docstring's rungs 1 to 4) over ``raw``: ``text`` is
    the text as the rungs so far left it, ``repairs`` the rungs applied, in order (also after a
    refusal, for the error's record). Each step either answers the value or hands a text on."""

    def __init__(self, raw: str):
        self.raw = raw
        self.text = raw
        self.repairs: list[str] = []

    def climb(self) -> Any:
        """The value read out of the text (any JSON value: the caller refuses a non-object).
        Raises ``Refused`` (with the reason for the model) or ``NotJson``."""
        _refuse_too_deep(self.raw)
        self._unwrap()
        if not self.text:
            return {}
        if self.text != self.raw:  # the wrapping was all that was wrong
            try:
                return loads_once(self.text)
            except orjson.JSONDecodeError:
                pass
        if self.text[0] == '"':
            return self._double_encoded()
        if self.text.startswith('{\\"'):
            value = self._escaped_object()
            if value is not None:
                return value
        if self.text[0] != "{":
            return self._not_an_object()
        return self._object()

    def _unwrap(self) -> None:
        """Rung 1 (a fence or a leaked ``json`` header) and the stream's leading empty objects."""
        fenced = strip_fence(self.text)
        if fenced is not None:
            self.text = fenced
            self.repairs.append("code_fence")
        elif h := JSON_HEADER.match(self.text):
            self.text = self.text[h.end() :]
            self.repairs.append("json_header")
        self.text = drop_leading_empty(self.text.strip(), self.repairs)

    def _double_encoded(self) -> Any:
        """Rung 2, a JSON string holding an object: decoded once; when the content needs repair
        itself, it climbs the object rungs (composes once: never decoded twice)."""
        try:
            return double_encoded(self.text, self.repairs)
        except EncodedObjectText as exc:
            self.repairs.append("double_encoded")
            self.text = exc.inner
            return self._object()

    def _escaped_object(self) -> dict[str, Any] | None:
        """Rung 2, an object with every quote escaped one level; None when that reading fails."""
        try:
            inner = json.loads('"' + self.text + '"')
            _refuse_too_deep(inner)
            value: dict[str, Any] = loads_once(inner)  # it starts with "{": an object or an error
        except (json.JSONDecodeError, orjson.JSONDecodeError):
            return None
        self.repairs.append("escaped_object")
        return value

    def _not_an_object(self) -> Any:
        """A lone Python literal or JSON scalar is still a value (refused as a non-object by the
        caller); anything else is not JSON."""
        if self.text in PY_LITERALS:
            return None if self.text == "None" else self.text == "True"
        try:
            return loads_once(self.text)
        except orjson.JSONDecodeError:
            raise NotJson("not an object") from None

    def _object(self) -> Any:
        """Text that starts an object: cut copies before it, else rung 3 (``normalize``, or the
        ``mismatched_closer`` rung), else rung 4 (``json_repair``) when its delimiters balance;
        then what follows the first object (``handle_tail``)."""
        text = self.text
        copies = cumulative_copies(text)
        if copies is not None:
            value, names = copies
            self.repairs.extend(names)
            return value
        scratch: list[str] = []
        try:
            normalized, end, balanced = normalize(text, 0, scratch)
        except Mismatch as exc:
            value, names = _mismatched_closer(text, exc)
            self.repairs.extend(names)
            return value
        try:
            value = DECODER.decode(normalized)
        except json.JSONDecodeError:
            if not balanced:
                raise NotJson("not JSON after closing delimiters") from None
            value = json_repair_rung(text[:end])  # its delimiters balance: nothing was cut
            self.repairs.append("json_repair")
        else:
            self.repairs.extend(scratch)
        handle_tail(text, end, value, self.repairs)
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
