"""Limits and checks shared by the repair ladder and argument validation.

Bounds (``MAX_REPAIR_CHARS``, ``MAX_NESTING_DEPTH``), the refusal exceptions the
rungs raise (``Refused``: a policy refusal whose text goes to the model;
``NotJson``: still not JSON, a later rung may try), the duplicate-key-refusing
decoders, and the value checks (``check_depth``, ``check_values``). Every check
is linear in the input (no recursion over the text).
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any, NoReturn

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


class Refused(Exception):
    """A policy refusal: the message goes to the model; no further rung is tried."""


class NotJson(Exception):
    """The normalized text is still not JSON; a later rung may try."""


CTRL = re.compile(r"[\x00-\x1f]")


def _no_dup_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if CTRL.search(k):
            raise Refused(f"the key {k!r} in your arguments contains a raw control character; send valid JSON")
        if k in out:
            raise Refused(f"arguments repeat the key {k!r}; send one object with each key once")
        out[k] = v
    return out


def _no_constants(name: str) -> NoReturn:
    raise Refused(f"{name} is not a JSON value; send a number, a string or null")


DECODER = json.JSONDecoder(strict=False, object_pairs_hook=_no_dup_pairs, parse_constant=_no_constants)


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


def loads_once(text: str) -> Any:
    """``orjson.loads`` that refuses repeated keys (``Refused``); ``orjson.JSONDecodeError`` passes through."""
    value = orjson.loads(text)
    dup = duplicate_key_error(text, value)
    if dup:
        raise Refused(dup)
    return value


def preview(raw: str, limit: int = 60) -> str:
    s = raw.strip()
    return repr(s[:limit] + ("..." if len(s) > limit else ""))


def too_deep_error() -> str:
    return (
        f"arguments are nested too deeply (limit {MAX_NESTING_DEPTH} levels of objects/arrays); "
        "nothing was run: send a flatter JSON object"
    )


def not_json_error(raw: str) -> str:
    return (
        f"arguments are not valid JSON (they start with {preview(raw)}); nothing was run: "
        "send the arguments as one JSON object matching the tool's parameters"
    )


def non_object_error(value: Any) -> str:
    kind = {
        type(None): "null",
        list: "an array",
        str: "a string",
        bool: "a boolean",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)
    return f"arguments must be a JSON object, got {kind}; nothing was run: send a JSON object"


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
    return too_deep_error()


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
