"""The last text rung: the ``json-repair`` package, kept only when its output invents and drops nothing.

See ``_no_invention`` for the token-by-token check against the input.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

from worker.tooling.json_checks import NotJson

# What may sit between two tokens of a json-repair result in its input: whitespace, commas,
# colons, comments and stray ``\n``/``\t`` escapes. Brackets and quotes are tokens themselves.
_GAP = re.compile(r"(?:[\s:,]++|/\*[^*]*+\*++(?:[^/*][^*]*+\*++)*+/|//[^\n]*+|\\[nrt])*+")
_NUMBER = re.compile(r"-?(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?")
_QUOTE_PAIRS = (('"', '"'), ("'", "'"), ("\u201c", "\u201d"), ("\u2018", "\u2019"))
_OPENERS = {"dict": "{", "list": "[("}
_CLOSERS = {"dict": "}", "list": "])"}
_LITERALS = {True: ("true", "True"), False: ("false", "False"), None: ("null", "None")}


def _gap_end(source: str, pos: int) -> int:
    """Where the gap (whitespace, ``:``/``,``, comments) starting at ``pos`` ends."""
    m = _GAP.match(source, pos)
    assert m is not None  # every part of _GAP is optional: it matches the empty string
    return m.end()


def _tokens(value: Any) -> Iterator[tuple[str, Any]]:
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
        pos = _gap_end(source, pos)
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
    return _gap_end(source, pos) == len(source)


def json_repair_rung(text: str) -> Any:
    import json_repair

    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True, strict=True)
    except RecursionError:
        raise
    except Exception as exc:  # json-repair strict mode raises ValueError for ambiguous input
        raise NotJson(str(exc)) from exc
    if not isinstance(value, dict) or not value or not _no_invention(text, value):
        raise NotJson("json-repair output rejected (not an object, or it drops or invents a token of the input)")
    return value
