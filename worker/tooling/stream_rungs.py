"""Stream artifacts: what an argument accumulator leaves around the one object the model sent.

A client or proxy that concatenates streamed ``arguments`` deltas can end up with more than
the object: an empty object sent as the first delta (``{}{"query":"value"}``), the whole
arguments sent again after the deltas (identical copies, ``duplicate_objects_collapsed`` in
``worker.tooling.text_rungs.handle_tail``), a provider that resends the arguments-so-far in
every chunk (``{"q{"query{"query":"v"}``), or a replay of the beginning after the complete
object (``{"query":"value"}{"query":"va``). Each of these carries nothing beyond the one
complete object, so keeping that object loses no call and guesses nothing:

- ``leading_empty_object``: ``{}`` (one or more) before an object is dropped;
- ``truncated_copy_dropped``: a cut-off copy of the object's own beginning, before it (a
  cumulative resend) or after it, is dropped; the copy must be a prefix of the complete
  object's text (ignoring whitespace between tokens), else the text is refused.

Sources: unslothai/unsloth PR 10275, openai/openai-agents-js PR 712, BerriAI/litellm issue
4537 (a leading ``{}``); NousResearch/hermes-agent PR 35718, veryfront/veryfront-code PR 1079
(cumulative resends); 64bit/async-openai issue 427, cline/kanban issue 339, elizaOS/eliza PR
16973 (the arguments repeated after the deltas).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from worker.tooling.json_checks import Refused, loads_once

_LEADING_EMPTY = re.compile(r"\A(?:\{\s*\}\s*,?\s*)+(?=\{)")
# The object's opening up to the quote of its first key: what every copy of its beginning
# starts with (a chunk may cut the copy inside the key itself: ``{"q{"query{"query": ...``).
_HEAD = re.compile(r'\{\s*"')
# Whitespace outside strings (strings kept, an unterminated one at the end too).
_STRING_OR_SPACE = re.compile(r'("(?:[^"\\]|\\.)*"?)|\s+', re.S)
_MAX_STARTS = 1024  # copies considered at most (a longer run is refused, not searched)
_MAX_TRIES = 64  # candidate starts of the complete object tried (each decode stops at the first fault)


def drop_leading_empty(text: str, repairs: list[str]) -> str:
    """``text`` without the empty objects a stream left before the real one (``leading_empty_object``)."""
    m = _LEADING_EMPTY.match(text)
    if m is None:
        return text
    repairs.append("leading_empty_object")
    return text[m.end() :]


def squash(text: str) -> str:
    """``text`` without whitespace between JSON tokens (strings kept as they are). Linear."""
    return _STRING_OR_SPACE.sub(lambda m: m.group(1) or "", text)


def is_cut_copy(tail: str, whole: str) -> bool:
    """True when ``tail`` is a strict, non-empty prefix of ``whole`` (whitespace between tokens
    ignored): a replay of the object's beginning that the stream cut off."""
    t, w = squash(tail), squash(whole)
    return 0 < len(t) < len(w) and w.startswith(t)


def cumulative_copies(text: str) -> tuple[dict[str, Any], list[str]] | None:
    """The one object of a text made of cut copies of its beginning followed by it (a provider
    that resends the arguments-so-far in every chunk, accumulated with ``+=``), with the repairs
    (``truncated_copy_dropped``, and ``duplicate_objects_collapsed`` when whole copies stand
    among them); ``None`` when ``text`` is not such a run. At least one copy must be cut: plain
    identical copies are the text ladder's (``handle_tail``). Bounded: ``_MAX_STARTS`` starts,
    ``_MAX_TRIES`` decodes, each stopping at the first fault of its text.
    """
    head = _HEAD.match(text)
    if head is None:
        return None
    starts = _starts(text, head.group())
    if not starts:
        return None
    for s in starts[:_MAX_TRIES]:
        # the first start from which the rest is one complete object is the object's own start
        try:
            value = loads_once(text[s:])
        except (orjson.JSONDecodeError, Refused):
            continue
        if not isinstance(value, dict):
            return None
        kinds = _segments(text, [0] + [p for p in starts if p < s] + [s], text[s:])
        if kinds is None or "cut" not in kinds:
            return None
        names = ["truncated_copy_dropped"] + (["duplicate_objects_collapsed"] if "whole" in kinds else [])
        return value, names
    return None


def _starts(text: str, head: str) -> list[int]:
    out: list[int] = []
    i = text.find(head, 1)
    while i != -1:
        if len(out) >= _MAX_STARTS:
            return []
        out.append(i)
        i = text.find(head, i + 1)
    return out


def _segments(text: str, bounds: list[int], whole: str) -> set[str] | None:
    """Split ``text[:bounds[-1]]`` into copies of ``whole``'s beginning, each cut at one of
    ``bounds``: ``{"cut", "whole"}`` (the kinds found), or ``None`` when a piece is not one.
    A piece runs to the farthest bound that keeps it a prefix (prefixes are closed downwards,
    so the scan stops at the first bound that does not)."""
    end = bounds[-1]
    kinds: set[str] = set()
    i = 0
    while bounds[i] < end:
        pos, best = bounds[i], None
        j = i + 1
        while j < len(bounds) and whole.startswith(text[pos : bounds[j]]):
            best = j
            j += 1
        if best is None:
            return None
        kinds.add("whole" if bounds[best] - pos == len(whole) else "cut")
        i = best
    return kinds
