"""Model-chosen values too big to keep: the caps at the edge, and the short placeholders that stand
for what is refused (docs/arguments.md, "Size").

A reply's function calls carry values the model chose: ``arguments``, ``call_id``, the tool
``name``, item ``id``s. A value over its cap is refused, and nothing of it is kept whole: not in
the step's memo, the turn's items, its plan, its results or its events. What stays is a
placeholder that says how big the value was and its SHA-256 (to tell two refusals apart, or match
one against a provider's log), built the same way every time, so a redelivered step that plans the
memoized reply again refuses it with the same words:

- arguments over ``AGENT_MAX_ARGUMENTS_BYTES``: ``[arguments not kept: <n> bytes, over the <cap>-byte
  cap; sha256 <hex>]``, which ``validate_tool_arguments`` refuses as ``too_large``;
- a ``call_id`` over ``MAX_CALL_ID_CHARS``: ``call_cut_<24 hex>_<n>``; the call does not run and
  its output tells the model why (``worker.turn.planning``); its ``function_call`` and that output
  pair under the short id;
- a tool ``name`` over ``MAX_TOOL_NAME_CHARS`` (the API's own limit): its beginning and ``~cut``,
  an unknown tool;
- an item ``id`` over ``MAX_ITEM_ID_CHARS``: dropped (ids are optional in the API's input items).

The history sent back to the model holds the placeholders: the API is never sent a refused value
whole, and every ``function_call`` still has its ``function_call_output``.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, NamedTuple

import orjson

__all__ = [
    "MAX_CALL_ID_CHARS",
    "MAX_ITEM_ID_CHARS",
    "MAX_RESULT_JSON_BYTES",
    "MAX_TOOL_NAME_CHARS",
    "HeldArguments",
    "arguments_placeholder",
    "compact_output",
    "cut_call_id",
    "cut_call_id_length",
    "cut_name",
    "held_arguments",
    "kept_json",
    "too_large_reason",
    "utf8_size",
]

MAX_CALL_ID_CHARS = 256
"""A ``call_id`` longer than this is refused (the APIs' own ids are a few dozen characters)."""
MAX_ITEM_ID_CHARS = 256
"""An output item's ``id`` longer than this is dropped."""
MAX_TOOL_NAME_CHARS = 64
"""The Responses API's limit on a function's name (``^[A-Za-z0-9_-]{1,64}$``)."""

_HELD = re.compile(r"\[arguments not kept: ([\d,]+) bytes, over the ([\d,]+)-byte cap; sha256 ([0-9a-f]{64})\]")
_CUT_ID = re.compile(r"call_cut_[0-9a-f]{24}_(\d+)(?:~\d+)?")


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return repr(value)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def utf8_size(text: str, cap: int) -> int | None:
    """The UTF-8 size of ``text`` when it is over ``cap`` bytes, else None (encoded only when the
    character count could exceed the cap: 4 bytes per character at most)."""
    if len(text) <= cap // 4:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    return size if size > cap else None


def too_large_reason(size: int, cap: int) -> str:
    """Why arguments of ``size`` bytes are refused (what the model reads)."""
    return (
        f"your arguments are {size:,} bytes; this runtime takes at most {cap:,} bytes of arguments in one call "
        "(setting AGENT_MAX_ARGUMENTS_BYTES); nothing was run: do the work in smaller calls (for example, "
        "write a long file in parts)"
    )


def arguments_placeholder(size: int, cap: int, sha256: str) -> str:
    """What is kept of arguments of ``size`` UTF-8 bytes over ``cap``, whose SHA-256 is ``sha256``."""
    return f"[arguments not kept: {size:,} bytes, over the {cap:,}-byte cap; sha256 {sha256}]"


class HeldArguments(NamedTuple):
    """What an arguments placeholder says: the original's size (UTF-8 bytes) and the cap."""

    size: int
    cap: int


def held_arguments(raw: str) -> HeldArguments | None:
    """The size and cap an ``arguments_placeholder`` stands for, or None for any other text."""
    if len(raw) > 200 or not raw.startswith("[arguments not kept: "):
        return None
    m = _HELD.fullmatch(raw)
    return HeldArguments(int(m.group(1).replace(",", "")), int(m.group(2).replace(",", ""))) if m else None


def cut_call_id(call_id: str) -> str:
    """``call_id`` as kept: itself up to ``MAX_CALL_ID_CHARS``, else ``call_cut_<hash>_<length>``
    (the same for the same id, so a redelivery and the stream's deltas name it alike)."""
    if len(call_id) <= MAX_CALL_ID_CHARS:
        return call_id
    return f"call_cut_{_sha256(call_id)[:24]}_{len(call_id)}"


def cut_call_id_length(call_id: str) -> int | None:
    """The length of the ``call_id`` a ``cut_call_id`` stands for (also with the ``~n`` a repeated
    id is given), or None for any other id."""
    if not call_id.startswith("call_cut_"):
        return None
    m = _CUT_ID.fullmatch(call_id)
    return int(m.group(1)) if m else None


def cut_name(name: str) -> str:
    """A tool ``name`` as kept: itself up to ``MAX_TOOL_NAME_CHARS``, else its beginning and
    ``~cut`` (no tool has that name: the call is an unknown tool's)."""
    return name if len(name) <= MAX_TOOL_NAME_CHARS else name[:40] + "~cut"


MAX_RESULT_JSON_BYTES = 64 * 1024
"""A tool result's ``details``, and its ``presentation_events``, over this many bytes as JSON are
kept as a placeholder (the model reads ``content``, capped by ``AGENT_MAX_OUTPUT_CHARS``)."""


def kept_json(value: Any, cap: int = MAX_RESULT_JSON_BYTES) -> Any:
    """``value`` when its JSON is at most ``cap`` bytes, else ``{"not_kept": {"bytes", "cap",
    "sha256"}}`` (a value that is not JSON is measured as its ``repr``)."""
    text = _json(value)
    size = utf8_size(text, cap)
    if size is None:
        return value
    return {"not_kept": {"bytes": size, "cap": cap, "sha256": _sha256(text)}}


def compact_output(items: list[dict[str, Any]], max_arguments_bytes: int) -> list[dict[str, Any]] | None:
    """A reply's output items with every value over its cap replaced (see the module docstring),
    or None when every value is within its cap (the common case: nothing is copied)."""
    out: list[dict[str, Any]] | None = None
    for i, item in enumerate(items):
        kept = _compact_item(item, max_arguments_bytes)
        if kept is not item:
            out = list(items) if out is None else out
            out[i] = kept
    return out


def _compact_item(item: dict[str, Any], cap: int) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    item_id = item.get("id")
    if isinstance(item_id, str) and len(item_id) > MAX_ITEM_ID_CHARS:
        changes["id"] = None
    if item.get("type") == "function_call":
        args, call_id, name = item.get("arguments"), item.get("call_id"), item.get("name")
        text = args if isinstance(args, str) or args is None else _json(args)  # an object some servers send
        size = utf8_size(text, cap) if text is not None else None
        if text is not None and size is not None:
            changes["arguments"] = arguments_placeholder(size, cap, _sha256(text))
        if isinstance(call_id, str) and len(call_id) > MAX_CALL_ID_CHARS:
            changes["call_id"] = cut_call_id(call_id)
        if isinstance(name, str) and len(name) > MAX_TOOL_NAME_CHARS:
            changes["name"] = cut_name(name)
    if not changes:
        return item
    kept = {**item, **changes}
    if changes.get("id", "") is None:
        del kept["id"]
    return kept
