"""Text rungs of the repair ladder: fences, the string-aware normalizing scan, what follows the object.

``normalize`` is one regex token scan (strings first, so their content is left
alone) that fixes, outside strings: over-escaped value quotes, literal ``\\n``
between tokens, Python literals, trailing commas; inside strings: single quotes,
raw control characters and invalid escapes (``invalid_escapes``); and closes
unclosed delimiters at a complete value. ``handle_tail`` decides what may follow
the first object. See ``worker.tooling.repair`` for the order and the policy.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

from worker.tooling.json_checks import CTRL, DECODER, NotJson, Refused, check_depth, loads_once, preview
from worker.tooling.stream_rungs import is_cut_copy

# An opening Markdown fence: ``` or ~~~ (3+), an optional language tag (also after a space:
# "``` json"), then a newline or the start of the JSON text on the same line.
_FENCE_OPEN = re.compile(r"(`{3,}+|~{3,}+)[ \t]*+[A-Za-z0-9_+.-]*+[ \t]*+(?:\r?\n|(?=[{\[\"]))")
JSON_HEADER = re.compile(r"\A\s*json\s*(?=[{\[\"])", re.I)


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
PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_CLOSER = {"{": "}", "[": "]"}
_TRAILING_COMMA = re.compile(r"\s*[}\]]")


class Mismatch(NotJson):
    """A closer that does not match the innermost open bracket: where, which, and the open brackets then."""

    def __init__(self, pos: int, closer: str, stack: list[str], opened: list[int]):
        super().__init__(f"unexpected {closer!r} at {pos}")
        self.pos, self.closer, self.stack, self.opened = pos, closer, stack, opened


# One escape inside a double-quoted string: valid (\" \\ \/ \b \f \n \r \t \uXXXX), a short \u, or another.
_ESCAPE = re.compile(r'\\(?:(["\\/bfnrt]|u[0-9A-Fa-f]{4})|(u)|(.))', re.S)


def fix_escapes(tok: str, at: int, names: set[str]) -> str:
    """A double-quoted string token with JSON's invalid escapes handled (rung ``invalid_escapes``).

    A backslash before punctuation or a space that JSON never escapes (``\\-``,
    ``\\.``, ``\\#``, ``\\ ``, ``\\*``, ``\\'``...: Markdown and regex habits) is
    dropped, which is what the model meant by it in a JSON string (the JSON5 and
    JavaScript reading). Refused (``Refused``, naming the position in the text):
    a ``\\u`` without four hex digits (the code point would be guessed) and a
    backslash before a letter or digit that JSON does not escape (``C:\\Users``,
    ``\\d``: a Windows path or a regex class, where dropping it changes the value).
    """

    def one(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return m.group()
        where = at + m.start()
        if m.group(2) is not None:
            raise Refused(
                f"a string in your arguments has a \\u escape without four hex digits at character {where} "
                f"({tok[m.start() : m.start() + 6]!r}); nothing was run (a character is never guessed): "
                "write the character itself or a full \\uXXXX escape"
            )
        c = m.group(3)
        if c.isalnum():
            raise Refused(
                f"a string in your arguments has the invalid escape {m.group()!r} at character {where}; JSON has "
                "no such escape and dropping the backslash would change the value; nothing was run: write a "
                "literal backslash as \\\\ (for example C:\\\\Users)"
            )
        names.add("invalid_escapes")
        return c

    return _ESCAPE.sub(one, tok)


def normalize(text: str, start: int, repairs: list[str]) -> tuple[str, int, bool]:
    """Scan one JSON value starting at ``text[start]`` (a ``{``).

    Returns ``(normalized_json, end_index, balanced)`` where ``end_index`` is
    where the first top-level value ended in ``text`` and ``balanced`` is
    false when closers were appended. Raises ``Refused`` for a cut string, a
    key without a value or a number at the cut, ``NotJson`` for mismatched
    delimiters.
    """
    out: list[str] = []
    stack: list[str] = []
    opened: list[int] = []  # where each open bracket of ``stack`` stands in ``text``
    sig: list[str | None] = ["", ""]  # kinds of the last two significant tokens
    names: set[str] = set()
    pos = start
    n = len(text)
    finditer = _TOKEN.finditer(text, start)
    for m in finditer:
        kind = m.lastgroup
        tok = m.group()
        pos = m.end()
        if kind in _VALUE_KINDS:
            piece, kind = _value_token(kind, tok, m, names)
            out.append(piece)
        elif kind == "ws":
            out.append(tok)
            continue
        elif kind == "open":
            stack.append(tok)
            opened.append(m.start())
            out.append(tok)
        elif kind == "close":
            if not stack or _CLOSER[stack[-1]] != tok:
                raise Mismatch(m.start(), tok, list(stack), list(opened))
            stack.pop()
            opened.pop()
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
        elif kind == "bsws":
            names.add("stray_escapes")
            out.append(" ")
            continue
        else:  # other, bsrun (a backslash outside a string: not JSON, a later rung decides)
            out.append(tok)
        sig = [sig[1], kind]
    else:
        pos = n
    balanced = not stack
    if stack:
        _close_at_the_cut(out, stack, sig)
        names.add("closed_delimiters")
    for name in (
        "single_quotes",
        "over_escaped_quotes",
        "stray_escapes",
        "python_literals",
        "trailing_comma",
        "control_characters",
        "invalid_escapes",
        "closed_delimiters",
    ):
        if name in names:
            repairs.append(name)
    return "".join(out), pos, balanced


_VALUE_KINDS = frozenset({"dq", "word", "sq", "esc", "cut"})


def _value_token(kind: str, tok: str, m: re.Match[str], names: set[str]) -> tuple[str, str]:
    """The JSON text of a string or word token (``kind`` in ``_VALUE_KINDS``) and the kind it
    counts as from then on (a repaired quote is a ``dq`` string). Raises ``Refused`` for
    ``undefined`` and for a string cut at the end of the text."""
    if kind == "dq":
        if CTRL.search(tok):
            names.add("control_characters")
        return (fix_escapes(tok, m.start(), names) if "\\" in tok else tok), kind
    if kind == "word":
        if tok == "undefined":
            raise Refused("'undefined' is not a JSON value (a value is never guessed); send the value or omit the key")
        lit = PY_LITERALS.get(tok)
        if lit is not None:
            names.add("python_literals")
            return lit, kind
        return tok, kind
    if kind == "sq":
        body = tok[1:-1].replace("\\'", "'")
        body = re.sub(r'(?<!\\)((?:\\\\)*)"', r'\1\\"', body)
        names.add("single_quotes")
        body = '"' + body + '"'
        return (fix_escapes(body, m.start(), names) if "\\" in body else body), "dq"
    if kind == "esc":
        names.add("over_escaped_quotes")
        return '"' + m.group(4) + '"', "dq"
    raise Refused(  # cut
        "a string in your arguments is not closed (the text ends inside it); nothing was run: send the complete value"
    )


def _close_at_the_cut(out: list[str], stack: list[str], sig: list[str | None]) -> None:
    """Append the closers of ``stack`` to ``out`` (the text ended inside them), after dropping a
    trailing comma. Raises ``Refused`` when the cut may have taken a value: after a key, right
    after an opening bracket, or after a number (``sig``: the last two significant kinds)."""
    last, before = sig[1], sig[0]
    if last == "colon" or (last == "dq" and stack[-1] == "{" and before in ("open", "comma")):
        raise Refused(
            "your arguments end with a key that has no value; nothing was run "
            "(a value is never guessed): send the complete arguments"
        )
    if last == "open":
        raise Refused(
            "your arguments end right after an opening bracket, so its content is missing; send the complete arguments"
        )
    if last == "num":
        raise Refused(
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


def parse_first_object(text: str, start: int, repairs: list[str]) -> tuple[Any, int, bool, str]:
    """Normalize and decode the value at ``start``; returns (value, end, balanced, normalized)."""
    normalized, end, balanced = normalize(text, start, repairs)
    try:
        value = DECODER.decode(normalized)
    except json.JSONDecodeError as exc:
        raise NotJson(exc.msg) from exc
    return value, end, balanced, normalized


def handle_tail(text: str, end: int, first: object, repairs: list[str]) -> None:
    """Handle what follows the first object.

    - nothing: done;
    - identical copies of the object: collapsed (``duplicate_objects_collapsed``, A25);
    - a cut-off copy of the object's own beginning at the end (after any identical copies):
      dropped (``truncated_copy_dropped``, ``worker.tooling.stream_rungs``);
    - a different object or value: refused (A26), never one of them picked; a different
      object that is also cut off is refused as such (not as "a key that has no value");
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
        _glued_copies(text, pos, end, first, repairs)
        return
    if not stripped.strip("}] \t\r\n"):
        repairs.append("redundant_closers")
        return
    if not rest[:1].isspace():
        raise Refused(f"text is glued to the end of the JSON object ({preview(rest, 30)}); send only the object")
    if stripped[0] in ",:" or _KEY_RE.search(stripped):
        raise Refused(
            "the JSON object closes before the end of your arguments (more keys follow it); send one well-formed object"
        )
    if "<" in stripped and re.search(r"<\s*/?\s*[A-Za-z_][\w:-]*[^>]*>|<[|\uff5c]", stripped):
        raise Refused("your arguments are followed by markup (e.g. <function_calls>); send only the JSON object")
    repairs.append("trailing_text")


_SPACE = re.compile(r"\s*")
_COMMAS_SPACE = re.compile(r",*\s*")


def _skip(pattern: re.Pattern[str], text: str, pos: int) -> int:
    """The position after what ``pattern`` matches at ``pos`` (no slice of the text is made)."""
    m = pattern.match(text, pos)
    return m.end() if m else pos


_KEY_RE = re.compile(r'"((?:[^"\\]|\\.){1,200})"\s*:')


def _glued_copies(text: str, pos: int, end: int, first: object, repairs: list[str]) -> None:
    """The objects glued after the first one (``text[:end]``), from ``pos``: identical copies are
    collapsed, a cut copy of its beginning at the end is dropped, anything else is refused."""
    copies = 0
    while True:
        if text[pos] != "{":
            raise Refused("arguments contain several JSON values; send exactly one JSON object per call")
        scratch: list[str] = []
        try:
            value, end2, balanced, _ = parse_first_object(text, pos, scratch)
        except (Refused, NotJson) as exc:
            if is_cut_copy(text[pos:].rstrip(), text[:end]):
                repairs.extend((["duplicate_objects_collapsed"] if copies else []) + ["truncated_copy_dropped"])
                return
            if isinstance(exc, Refused):
                raise Refused(
                    "arguments contain several JSON objects glued together, and the last one is cut off "
                    f"({exc}); nothing was run: send one complete object per call"
                ) from exc
            raise Refused(
                "arguments contain several JSON objects glued together and one of them is not valid JSON; "
                "send one object per call"
            ) from exc
        if not balanced and is_cut_copy(text[pos:].rstrip(), text[:end]):
            repairs.extend((["duplicate_objects_collapsed"] if copies else []) + ["truncated_copy_dropped"])
            return
        if value != first or not balanced:
            raise Refused(
                "arguments contain several different JSON objects glued together; nothing was run "
                "(one of them is never picked): make one call per object"
            )
        copies += 1
        pos = _skip(_SPACE, text, end2)
        if pos == len(text):
            repairs.append("duplicate_objects_collapsed")
            return
        pos = _skip(_COMMAS_SPACE, text, pos)
        if text[pos : pos + 1] not in ("{", "["):
            raise Refused("arguments contain repeated JSON objects followed by other text; send one object")


def strip_fence(text: str) -> str | None:
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
            raise Refused(
                "your arguments open a Markdown code fence that is never closed (the text may be cut); "
                "nothing was run: send only the JSON object, without a fence"
            )
        return body.rstrip(char).rstrip()
    if s[:1] in ("{", "[") and (s.endswith("```") or s.endswith("~~~")) and not s.startswith(("```", "~~~")):
        return s.rstrip(s[-1]).rstrip()
    return None


class EncodedObjectText(Exception):
    """The arguments are a JSON string whose content starts an object but is not valid JSON:
    the content goes down the ladder once more (``double_encoded``, then the other rungs)."""

    def __init__(self, inner: str):
        super().__init__("double-encoded object text")
        self.inner = inner


def double_encoded(text: str, repairs: list[str]) -> Any:
    """Rung ``double_encoded``: the whole text is a JSON string holding a JSON object (decoded once).

    Raises ``EncodedObjectText`` when the content starts an object but needs repair
    itself, ``Refused`` when the string is not closed or holds no object.
    """
    try:
        inner = json.loads(text, strict=False)
    except json.JSONDecodeError:
        raise Refused("arguments are a JSON string that is not closed or not valid; send a JSON object") from None
    if not isinstance(inner, str):
        return inner
    depth = check_depth(inner)
    if depth:
        raise Refused(depth)
    try:
        value = loads_once(inner)
    except orjson.JSONDecodeError:
        try:
            value = DECODER.decode(inner)
        except json.JSONDecodeError:
            if inner.lstrip().startswith("{"):
                raise EncodedObjectText(inner.strip()) from None
            raise Refused(
                "arguments are a JSON string, not a JSON object; send the object itself, not encoded as a string"
            ) from None
    if not isinstance(value, dict):
        raise Refused("arguments are a JSON string whose content is not an object; send a JSON object")
    repairs.append("double_encoded")
    return value
