"""The repair ladder for malformed function-call ``arguments`` strings.

``worker.tooling.arguments`` parses strictly first; this module only runs when that
fails. Policy (``tests/fixtures/cases/README.md``, DESIGN-NOTES section 6):

- never invent a value: a key without a value, a string or number cut at the
  end of the text, or a repair library's guess is refused;
- refuse every repair when the response stopped at the output-token limit
  (``response_status == "incomplete"``): the model is told its arguments
  were cut off;
- refuse non-objects, markup/prose instead of JSON, distinct concatenated
  objects, duplicate keys (on every path: ``worker.tooling.arguments`` refuses them
  on the strict path too, ``duplicate_key_error``), call envelopes
  (``{"function": {"name", "arguments"}}``, A18) and the hallucinated
  ``multi_tool_use`` shape (A38);
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
3. ``_normalize``: one string-aware regex scan that fixes, outside strings:
   over-escaped value quotes (``\\\\"foo\\\\"``, A24), literal ``\\n``/``\\t``
   between tokens (A33), Python ``True``/``False``/``None``, trailing commas;
   inside: single-quoted strings (A19), raw control characters (A35); and
   closes unclosed ``{``/``[`` when the text ends at a complete value (A29,
   A30). After the first object: identical copies are collapsed (A25),
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

Object rungs (``repair_object``, need the tool's schema): ``decoded_field``
for an array/object field sent as a JSON-encoded string (A20) and
``unwrapped:<key>`` for an undeclared single wrapper key (A37), each kept
only when the result validates.

Bounds: every rung is one or a few linear passes (compiled regexes without
backtracking over runs: possessive quantifiers for backslash runs and
comments; plain string operations for fences; the json decoders); input above
``MAX_REPAIR_CHARS`` (1 MiB) is refused without trying, so the ladder costs
O(n) with n <= 1 MiB (``tests/test_repair_cases.py`` times adversarial shapes
at 20k and 200k characters).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Callable

import orjson

MAX_REPAIR_CHARS = 1_048_576
"""Arguments longer than this (characters) are not repaired: the call is refused."""

MAX_NESTING_DEPTH = 128
"""Arguments nesting objects/arrays deeper than this are refused before any recursive parser runs.

128 stays below every recursive consumer: pydantic-core's JSON parser (about 200
levels), ``orjson.dumps`` (254, the turn store), ``jsonschema`` (its Python
recursion overflows near 250 levels) and the ``json`` decoder of the ladder."""

CUT_OFF_ERROR = (
    "your arguments were cut off at the output-token limit (the response is incomplete), "
    "so the call did not run; send the call again with complete arguments, shorter if needed"
)


@dataclass
class RepairOutcome:
    """``ok`` with ``value`` (a dict) and the applied ``repairs``; or ``error`` (text for the model)."""

    ok: bool
    value: Any = None
    repairs: list[str] = field(default_factory=list)
    error: str | None = None


class _Refused(Exception):
    """A policy refusal: the message goes to the model; no further rung is tried."""


class _Syntax(Exception):
    """The normalized text is still not JSON; a later rung may try."""


# An opening Markdown fence: ``` or ~~~ (3+), an optional language tag (also after a space:
# "``` json"), then a newline or the start of the JSON text on the same line.
_FENCE_OPEN = re.compile(r"(`{3,}+|~{3,}+)[ \t]*+[A-Za-z0-9_+.-]*+[ \t]*+(?:\r?\n|(?=[{\[\"]))")
_JSON_HEADER = re.compile(r"\A\s*json\s*(?=[{\[\"])", re.I)
_CTRL = re.compile(r"[\x00-\x1f]")

# One token per match; ``lastgroup`` names its kind. Strings come first so that
# everything inside them is left alone (string-aware, cf. case A41).
_TOKEN = re.compile(
    r"""
    (?P<dq>"(?:[^"\\]|\\.)*")
  | (?P<esc>(\\++)"([^"\\]*)\3")
  | (?P<sq>'(?:[^'\\]|\\.)*')
  | (?P<cut>["'])
  | (?P<bsws>\\[nrt])
  | (?P<bsrun>\\++)
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<num>-?[0-9][0-9.eE+\-]*)
  | (?P<comma>,)
  | (?P<open>[{\[])
  | (?P<close>[}\]])
  | (?P<colon>:)
  | (?P<ws>\s+)
  | (?P<other>.)
    """,
    re.S | re.X,
)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_CLOSER = {"{": "}", "[": "]"}
_TRAILING_COMMA = re.compile(r"\s*[}\]]")


def _no_dup_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if _CTRL.search(k):
            raise _Refused(f"the key {k!r} in your arguments contains a raw control character; send valid JSON")
        if k in out:
            raise _Refused(f"arguments repeat the key {k!r}; send one object with each key once")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON value; send a number, a string or null")


_DECODER = json.JSONDecoder(strict=False, object_pairs_hook=_no_dup_pairs, parse_constant=_no_constants)


class _Duplicate(Exception):
    pass


def _dup_only(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(k)
            seen.add(k)
    return out


_DUP_DECODER = json.JSONDecoder(object_pairs_hook=_dup_only)


def duplicate_key_error(raw: str, parsed: Any) -> str | None:
    """An error text when the JSON text ``raw`` repeats a key inside one object, else ``None``.

    ``parsed`` is ``orjson.loads(raw)``: orjson (like pydantic-core) keeps the last
    value of a repeated key, so ``{"path": "a", "path": "/etc/x"}`` would run on
    ``/etc/x``. Duplicate keys are always refused (the ladder's decoder refuses
    them too). Cheap test first: every key contributes one ``:`` outside strings,
    and string content keeps its ``:`` in ``orjson.dumps(parsed)``, so without
    ``\\u`` escapes (``\\u003a``) equal ``:`` counts prove there is no duplicate
    (two C-level passes). Only otherwise the text is decoded again with a
    duplicate-detecting hook (Python ``json``; depth already bounded).
    """
    if "\\u" not in raw and raw.count(":") == orjson.dumps(parsed).count(b":"):
        return None
    try:
        _DUP_DECODER.decode(raw)
    except _Duplicate as exc:
        return f"arguments repeat the key {exc.args[0]!r}; send one object with each key once"
    except (ValueError, RecursionError):
        return None
    return None


def _loads_once(text: str) -> Any:
    """``orjson.loads`` that refuses repeated keys (``_Refused``); ``orjson.JSONDecodeError`` passes through."""
    value = orjson.loads(text)
    dup = duplicate_key_error(text, value)
    if dup:
        raise _Refused(dup)
    return value


def _normalize(text: str, start: int, repairs: list[str]) -> tuple[str, int, bool]:
    """Scan one JSON value starting at ``text[start]`` (a ``{``).

    Returns ``(normalized_json, end_index, balanced)`` where ``end_index`` is
    where the first top-level value ended in ``text`` and ``balanced`` is
    false when closers were appended. Raises ``_Refused`` for a cut string, a
    key without a value or a number at the cut, ``_Syntax`` for mismatched
    delimiters.
    """
    out: list[str] = []
    stack: list[str] = []
    sig: list[str] = ["", ""]  # kinds of the last two significant tokens
    names: set[str] = set()
    pos = start
    n = len(text)
    finditer = _TOKEN.finditer(text, start)
    for m in finditer:
        kind = m.lastgroup
        tok = m.group()
        pos = m.end()
        if kind == "dq":
            if _CTRL.search(tok):
                names.add("control_characters")
            out.append(tok)
        elif kind == "ws":
            out.append(tok)
            continue
        elif kind == "open":
            stack.append(tok)
            out.append(tok)
        elif kind == "close":
            if not stack or _CLOSER[stack[-1]] != tok:
                raise _Syntax(f"unexpected {tok!r} at {m.start()}")
            stack.pop()
            out.append(tok)
            if not stack:
                sig = [sig[1], kind]
                break
        elif kind == "comma":
            if _TRAILING_COMMA.match(text, pos):
                names.add("trailing_comma")
                continue
            out.append(tok)
        elif kind == "colon" or kind == "num":
            out.append(tok)
        elif kind == "word":
            lit = _PY_LITERALS.get(tok)
            if tok == "undefined":
                raise _Refused(
                    "'undefined' is not a JSON value (a value is never guessed); send the value or omit the key"
                )
            if lit is not None:
                names.add("python_literals")
                out.append(lit)
            else:
                out.append(tok)
        elif kind == "sq":
            body = tok[1:-1].replace("\\'", "'")
            body = re.sub(r'(?<!\\)((?:\\\\)*)"', r'\1\\"', body)
            names.add("single_quotes")
            out.append('"' + body + '"')
            kind = "dq"
        elif kind == "esc":
            names.add("over_escaped_quotes")
            out.append('"' + m.group(4) + '"')
            kind = "dq"
        elif kind == "bsws":
            names.add("stray_escapes")
            out.append(" ")
            continue
        elif kind == "cut":
            raise _Refused(
                "a string in your arguments is not closed (the text ends inside it); "
                "nothing was run: send the complete value"
            )
        else:  # other, bsrun (a backslash outside a string: not JSON, a later rung decides)
            out.append(tok)
        sig = [sig[1], kind]
    else:
        pos = n
    balanced = not stack
    if stack:
        last, before = sig[1], sig[0]
        if last == "colon" or (last == "dq" and stack[-1] == "{" and before in ("open", "comma")):
            raise _Refused(
                "your arguments end with a key that has no value; nothing was run "
                "(a value is never guessed): send the complete arguments"
            )
        if last == "open":
            raise _Refused(
                "your arguments end right after an opening bracket, so its content is missing; "
                "send the complete arguments"
            )
        if last == "num":
            raise _Refused(
                "your arguments end with a number and an unclosed object, so the number may be cut; "
                "send the complete arguments"
            )
        if last == "comma":
            # the comma before the cut is dropped; every value before it is complete
            for i in range(len(out) - 1, -1, -1):
                if out[i] == ",":
                    del out[i]
                    break
        out.extend(_CLOSER[c] for c in reversed(stack))
        names.add("closed_delimiters")
    for name in (
        "single_quotes",
        "over_escaped_quotes",
        "stray_escapes",
        "python_literals",
        "trailing_comma",
        "control_characters",
        "closed_delimiters",
    ):
        if name in names:
            repairs.append(name)
    return "".join(out), pos, balanced


def _parse_first_object(text: str, start: int, repairs: list[str]) -> tuple[Any, int, bool, str]:
    """Normalize and decode the value at ``start``; returns (value, end, balanced, normalized)."""
    normalized, end, balanced = _normalize(text, start, repairs)
    try:
        value = _DECODER.decode(normalized)
    except json.JSONDecodeError as exc:
        raise _Syntax(exc.msg) from exc
    return value, end, balanced, normalized


def _tail(text: str, end: int, first: Any, repairs: list[str]) -> None:
    """Handle what follows the first object.

    - nothing: done;
    - identical copies of the object: collapsed (``duplicate_objects_collapsed``, A25);
    - a different object or value: refused (A26), never one of them picked;
    - only surplus ``}``/``]``: dropped (``redundant_closers``);
    - prose separated by whitespace: dropped (``trailing_text``, A02); but text
      glued to the object, text that continues the object (``, "key": ...``)
      and markup are refused.
    """
    rest = text[end:]
    stripped = rest.strip()
    if not stripped:
        return
    if stripped.lstrip(",").lstrip()[:1] in ("{", "["):
        pos = len(text) - len(stripped.lstrip(",").lstrip())
        while True:
            if text[pos] != "{":
                raise _Refused("arguments contain several JSON values; send exactly one JSON object per call")
            scratch: list[str] = []
            try:
                value, end2, balanced, _ = _parse_first_object(text, pos, scratch)
            except _Syntax as exc:
                raise _Refused(
                    "arguments contain several JSON objects glued together and one of them is not valid JSON; "
                    "send one object per call"
                ) from exc
            if value != first or not balanced:
                raise _Refused(
                    "arguments contain several different JSON objects glued together; nothing was run "
                    "(one of them is never picked): make one call per object"
                )
            nxt = text[end2:].strip()
            if not nxt:
                repairs.append("duplicate_objects_collapsed")
                return
            nxt = nxt.lstrip(",").lstrip()
            if nxt[:1] not in ("{", "["):
                raise _Refused("arguments contain repeated JSON objects followed by other text; send one object")
            pos = len(text) - len(nxt)
    if not stripped.strip("}] \t\r\n"):
        repairs.append("redundant_closers")
        return
    if not rest[:1].isspace():
        raise _Refused(f"text is glued to the end of the JSON object ({_preview(rest, 30)}); send only the object")
    if stripped[0] in ",:" or _KEY_RE.search(stripped):
        raise _Refused(
            "the JSON object closes before the end of your arguments (more keys follow it); send one well-formed object"
        )
    if "<" in stripped and re.search(r"<\s*/?\s*[A-Za-z_][\w:-]*[^>]*>", stripped):
        raise _Refused("your arguments are followed by markup (e.g. <function_calls>); send only the JSON object")
    repairs.append("trailing_text")


_KEY_RE = re.compile(r'"((?:[^"\\]|\\.){1,200})"\s*:')

# What may sit between two tokens of a json-repair result in its input: whitespace, commas,
# colons, comments and stray ``\n``/``\t`` escapes. Brackets and quotes are tokens themselves.
_GAP = re.compile(r"(?:[\s:,]++|/\*[^*]*+\*++(?:[^/*][^*]*+\*++)*+/|//[^\n]*+|\\[nrt])*+")
_NUMBER = re.compile(r"-?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?")
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
_OPENERS = {"dict": "{", "list": "[("}
_CLOSERS = {"dict": "}", "list": "])"}
_LITERALS = {True: ("true", "True"), False: ("false", "False"), None: ("null", "None")}


def _tokens(value: Any):
    """The tokens of a JSON value in document order: ("open"/"close", kind) and ("key"/"leaf", v)."""
    stack: list[Any] = [("value", value)]
    while stack:
        what, v = stack.pop()
        if what != "value":
            yield what, v
        elif isinstance(v, dict):
            yield "open", "dict"
            stack.append(("close", "dict"))
            for k, sub in reversed(list(v.items())):
                stack.append(("value", sub))
                stack.append(("key", k))
        elif isinstance(v, list):
            yield "open", "list"
            stack.append(("close", "list"))
            for sub in reversed(v):
                stack.append(("value", sub))
        else:
            yield "leaf", v


def _string_forms(s: str) -> list[str]:
    escaped = json.dumps(s, ensure_ascii=False)[1:-1]
    forms = ['"' + escaped + '"']
    for q1, q2 in _QUOTE_PAIRS:
        forms.append(q1 + s + q2)
    forms.append('"' + json.dumps(s)[1:-1] + '"')
    forms.append("'" + escaped.replace('\\"', '"').replace("'", "\\'") + "'")
    return forms


def _no_invention(source: str, value: Any) -> bool:
    """Check a json-repair result against its input: nothing dropped, nothing made up.

    The result is walked in document order next to the input, one token at a
    time (``{``, ``[``, a key, a value, ``]``, ``}``); between two tokens the
    input may only hold whitespace, ``,``, ``:``, comments and stray ``\\n``.
    So every key, value and bare word of the input must reappear in the
    output in the same order (nothing dropped: ``{"a": 1, "b"}``,
    ``{"a": 12 34}``, ``{"a": 1 garbage}`` are refused), every string of the
    output is a quoted string of the input (raw or JSON-escaped; an unquoted
    word turned into a string, or an invented ``""``, is refused), and numbers,
    booleans and null are the input's own tokens. One pass: O(len(source)).
    """
    pos = 0
    for kind, tok in _tokens(value):
        pos = _GAP.match(source, pos).end()
        if kind == "open" or kind == "close":
            chars = (_OPENERS if kind == "open" else _CLOSERS)[tok]
            if pos >= len(source) or source[pos] not in chars:
                return False
            pos += 1
        elif isinstance(tok, str):
            for form in _string_forms(tok):
                if source.startswith(form, pos):
                    pos += len(form)
                    break
            else:
                return False
        elif isinstance(tok, bool) or tok is None:
            for lit in _LITERALS[tok]:
                if source.startswith(lit, pos):
                    pos += len(lit)
                    break
            else:
                return False
        elif isinstance(tok, (int, float)):
            m = _NUMBER.match(source, pos)
            if not m:
                return False
            text = m.group()
            try:
                if isinstance(tok, int):
                    if any(c in text for c in ".eE") or int(text) != tok:
                        return False
                elif float(text) != tok:
                    return False
            except ValueError:
                return False
            pos = m.end()
            if pos < len(source) and (source[pos].isalnum() or source[pos] in "._"):
                return False
        else:
            return False
    return _GAP.match(source, pos).end() == len(source)


def _json_repair_rung(text: str) -> Any:
    import json_repair

    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True, strict=True)
    except RecursionError:
        raise
    except Exception as exc:  # json-repair strict mode raises ValueError for ambiguous input
        raise _Syntax(str(exc)) from exc
    if not isinstance(value, dict) or not value or not _no_invention(text, value):
        raise _Syntax("json-repair output rejected (not an object, or it drops or invents a token of the input)")
    return value


def _envelope_error(value: dict[str, Any], declared: Callable[[str], bool]) -> str | None:
    """Refuse call envelopes instead of the tool's arguments (A18, A38)."""
    uses = value.get("tool_uses")
    if (
        isinstance(uses, list)
        and not declared("tool_uses")
        and any(isinstance(u, dict) and "recipient_name" in u for u in uses)
    ):
        return (
            "these arguments use the internal multi_tool_use.parallel shape (tool_uses/recipient_name); "
            "nothing was run: call each tool directly, one function call per tool"
        )
    fn = value.get("function")
    if isinstance(fn, dict) and "name" in fn and ("arguments" in fn or "parameters" in fn) and not declared("function"):
        return (
            "these arguments are a whole tool-call envelope ({'function': {'name', 'arguments'}}), "
            "not the tool's arguments; nothing was run: send only the arguments object"
        )
    return None


def check_envelope(value: dict[str, Any], declared_properties: Any) -> str | None:
    """Public form of the envelope check: ``declared_properties`` is the schema's property names
    (a set/dict) or ``None`` when unknown. Returns an error text or ``None``."""
    props = declared_properties or ()
    return _envelope_error(value, lambda k: k in props)


def repair_arguments(
    raw: str, *, tool: Any = None, response_status: str = "completed", declared_properties: Any = None
) -> RepairOutcome:
    """Climb the text ladder for an ``arguments`` string that did not parse as a JSON object.

    Returns ``RepairOutcome(ok=True, value=<dict>, repairs=[...])`` or
    ``RepairOutcome(ok=False, error=<text for the model>)``. Never raises.
    ``response_status == "incomplete"`` refuses every repair (OpenAI
    Responses ``status: incomplete`` = stopped at ``max_output_tokens``).
    ``declared_properties`` (names the tool's schema declares) lets the
    envelope check leave a tool that really has a ``function`` field alone.
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
    except _Refused as exc:
        return RepairOutcome(ok=False, error=str(exc), repairs=repairs)
    except _Syntax:
        return RepairOutcome(ok=False, error=_not_json_error(raw), repairs=repairs)
    except RecursionError:  # defence in depth: check_depth runs before every recursive decoder
        return RepairOutcome(ok=False, error=_too_deep_error(), repairs=repairs)
    if not isinstance(value, dict):
        return RepairOutcome(ok=False, error=_non_object_error(value), repairs=repairs)
    bad = check_values(value)
    if bad:
        return RepairOutcome(ok=False, error=bad, repairs=repairs)
    env = check_envelope(value, declared_properties)
    if env:
        return RepairOutcome(ok=False, error=env, repairs=repairs)
    return RepairOutcome(ok=True, value=value, repairs=repairs)


def _preview(raw: str, limit: int = 60) -> str:
    s = raw.strip()
    return repr(s[:limit] + ("..." if len(s) > limit else ""))


def _too_deep_error() -> str:
    return (
        f"arguments are nested too deeply (limit {MAX_NESTING_DEPTH} levels of objects/arrays); "
        "nothing was run: send a flatter JSON object"
    )


def _not_json_error(raw: str) -> str:
    return (
        f"arguments are not valid JSON (they start with {_preview(raw)}); nothing was run: "
        "send the arguments as one JSON object matching the tool's parameters"
    )


def _non_object_error(value: Any) -> str:
    kind = {
        type(None): "null",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)
    return f"arguments must be a JSON object, got {kind}; nothing was run: send a JSON object"


def _strip_fence(text: str) -> str | None:
    """The content of one surrounding Markdown fence, or ``None`` when ``text`` is not fenced.

    Fences are ``` or ~~~ (three or more), with an optional language tag
    (``json``, also ``" json"``). The closing run must be the same character.
    An opening fence without a closing fence is refused (the block is
    unterminated, the text may be cut); a closing fence alone after the
    object (no opening) is dropped. Plain string operations: linear.
    """
    s = text.strip()
    m = _FENCE_OPEN.match(s)
    if m:
        char = m.group(1)[0]
        body = s[m.end() :].rstrip()
        if len(body) < 3 or not body.endswith(char * 3):
            raise _Refused(
                "your arguments open a Markdown code fence that is never closed (the text may be cut); "
                "nothing was run: send only the JSON object, without a fence"
            )
        return body.rstrip(char).rstrip()
    if s[:1] in ("{", "[") and (s.endswith("```") or s.endswith("~~~")) and not s.startswith(("```", "~~~")):
        return s.rstrip(s[-1]).rstrip()
    return None


def check_depth(text: str) -> str | None:
    """An error text when ``text`` nests arrays/objects deeper than ``MAX_NESTING_DEPTH``, else ``None``.

    Linear and cheap: a text with at most ``MAX_NESTING_DEPTH`` ``[``/``{``
    in all is accepted after two ``str.count`` calls; otherwise strings are
    removed (one regex pass) and the running depth of the remaining brackets
    is computed (C-level ``accumulate``). Brackets inside double-quoted
    strings do not count; inside single-quoted ones they do (over-counting
    only refuses, never crashes).
    """
    if len(text) <= MAX_NESTING_DEPTH or text.count("[") + text.count("{") <= MAX_NESTING_DEPTH:
        return None
    brackets = _NON_BRACKETS.sub("", _STRINGS.sub("", text))
    if max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0) <= MAX_NESTING_DEPTH:
        return None
    return _too_deep_error()


_STRINGS = re.compile(r'"(?:[^"\\]++|\\.)*+"?', re.S)
_NON_BRACKETS = re.compile(r"[^\[\]{}]++")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def check_values(value: Any) -> str | None:
    """An error text when a decoded JSON value holds what JSON (and storage) cannot: a string
    with a lone UTF-16 surrogate (``"\\ud800"``), a non-finite number (``NaN``,
    ``Infinity``, ``1e400``) or an integer outside the 64-bit range; else ``None``.

    Lone surrogates are refused, not replaced with U+FFFD: the replaced text would
    not be what the model sent (a path or a key with a changed character). Iterative
    (no recursion), O(size of the value).
    """
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not v.isascii() and _SURROGATE.search(v):
                return (
                    "a string in your arguments contains a lone UTF-16 surrogate (e.g. \\ud800), "
                    "which is not valid Unicode; nothing was run: send the text without it "
                    "(write characters outside the BMP as the character itself or as a full surrogate pair)"
                )
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif isinstance(v, float):
            if not math.isfinite(v):
                return (
                    "your arguments contain a number that is not a finite JSON number "
                    "(NaN, Infinity, or too large such as 1e400); nothing was run: send a finite number"
                )
        elif isinstance(v, int) and not isinstance(v, bool) and not (-(2**63) <= v < 2**64):
            return (
                "your arguments contain an integer outside the 64-bit range; nothing was run: "
                "send a smaller number, or a string if it is an identifier"
            )
    return None


_SURROGATE = re.compile("[\ud800-\udfff]")


def _ladder(raw: str, repairs: list[str]) -> Any:
    text = raw
    depth = check_depth(raw)
    if depth:
        raise _Refused(depth)
    fenced = _strip_fence(text)
    if fenced is not None:
        text = fenced
        repairs.append("code_fence")
    else:
        h = _JSON_HEADER.match(text)
        if h:
            text = text[h.end() :]
            repairs.append("json_header")
    text = text.strip()
    if not text:
        return {}
    if text != raw:
        try:
            return _loads_once(text)
        except orjson.JSONDecodeError:
            pass
    first = text[0]
    if first == '"':
        return _double_encoded(text, repairs)
    if text.startswith('{\\"'):
        try:
            inner = json.loads('"' + text + '"')
            depth = check_depth(inner)
            if depth:
                raise _Refused(depth)
            value = _loads_once(inner)
        except (json.JSONDecodeError, orjson.JSONDecodeError):
            pass
        else:
            repairs.append("escaped_object")
            return value
    if first != "{":
        # A lone Python literal or JSON scalar is still a non-object; anything else is not JSON.
        if text in _PY_LITERALS:
            return None if text == "None" else text == "True"
        try:
            return _loads_once(text)
        except orjson.JSONDecodeError:
            raise _Syntax("not an object") from None
    scratch: list[str] = []
    normalized, end, balanced = _normalize(text, 0, scratch)  # _Syntax: mismatched delimiters
    try:
        value = _DECODER.decode(normalized)
    except json.JSONDecodeError:
        if not balanced:
            raise _Syntax("not JSON after closing delimiters") from None
        # Rung 4: json-repair on the first value, only when its delimiters balance (no truncation).
        value = _json_repair_rung(text[:end])
        repairs.append("json_repair")
        _tail(text, end, value, repairs)
        return value
    repairs.extend(scratch)
    _tail(text, end, value, repairs)
    return value


def _double_encoded(text: str, repairs: list[str]) -> Any:
    try:
        inner = json.loads(text, strict=False)
    except json.JSONDecodeError:
        raise _Refused("arguments are a JSON string that is not closed or not valid; send a JSON object") from None
    if not isinstance(inner, str):
        return inner
    depth = check_depth(inner)
    if depth:
        raise _Refused(depth)
    try:
        value = _loads_once(inner)
    except orjson.JSONDecodeError:
        try:
            value = _DECODER.decode(inner)
        except json.JSONDecodeError:
            raise _Refused(
                "arguments are a JSON string, not a JSON object; send the object itself, not encoded as a string"
            ) from None
    if not isinstance(value, dict):
        raise _Refused("arguments are a JSON string whose content is not an object; send a JSON object")
    repairs.append("double_encoded")
    return value


# ---- object rungs (schema-guided) ------------------------------------------------------------


def _schema_types(sub: Any) -> set[str]:
    if not isinstance(sub, dict):
        return set()
    t = sub.get("type")
    types = {t} if isinstance(t, str) else set(t or [])
    for key in ("anyOf", "oneOf"):
        for b in sub.get(key, []) or []:
            types |= _schema_types(b)
    return types


def decode_encoded_fields(
    data: dict[str, Any], properties: dict[str, Any], resolve: Callable[[Any], Any] = lambda s: s
) -> tuple[dict[str, Any], list[str]]:
    """Decode top-level string values whose schema says ``array`` or ``object`` (A20).

    A value is decoded only if the schema does not also accept a string, the
    string parses strictly, and the result has the declared JSON type.
    Returns ``(new_data, ["decoded_field:<name>", ...])`` (unchanged data and
    ``[]`` when nothing applied).
    """
    changed: dict[str, Any] = {}
    names: list[str] = []
    for key, value in data.items():
        if not isinstance(value, str) or key not in properties:
            continue
        types = _schema_types(resolve(properties[key]))
        if not types & {"array", "object"} or "string" in types:
            continue
        s = value.strip()
        if not s or s[0] not in "[{":
            continue
        if check_depth(s):
            continue
        try:
            decoded = _loads_once(s)
        except (orjson.JSONDecodeError, _Refused):
            continue
        if (isinstance(decoded, list) and "array" in types) or (isinstance(decoded, dict) and "object" in types):
            changed[key] = decoded
            names.append(f"decoded_field:{key}")
    if not changed:
        return data, []
    return {**data, **changed}, names


def unwrap_candidate(data: dict[str, Any], properties: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(key, inner)`` when ``data`` is a single undeclared key wrapping an object (A37), else ``None``.

    The caller keeps the unwrapped object only if it validates.
    """
    if len(data) != 1:
        return None
    ((key, inner),) = data.items()
    if key in properties or not isinstance(inner, dict):
        return None
    return key, inner
