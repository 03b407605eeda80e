"""Responses API input/output items the runtime writes and reads.

Shapes follow the OpenAI Responses API:
- user message: ``{"type": "message", "role": "user", "content": "..."}``
- function call (from the model): ``{"type": "function_call", "call_id", "name", "arguments"}``
- function call output (ours): ``{"type": "function_call_output", "call_id", "output": "<string>"}``

Every ``function_call`` in the history must get exactly one
``function_call_output`` before the next request, or the API answers HTTP 400
"No tool output found for function call ..." (cases E01/E03).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

TRUNCATION_MARKER = "\n[output truncated: {cut} of {total} characters cut]"


def user_message(text: str) -> dict[str, Any]:
    """A user input message item."""
    return {"type": "message", "role": "user", "content": text}


def output_text(content: Any) -> str:
    """The string form of a tool's content: strings pass through, anything else is JSON-encoded.

    The Responses API requires ``function_call_output.output`` to be a string
    (or content parts); a dict or number makes the request fail (case E-series,
    non-string outputs).
    """
    if isinstance(content, str):
        return content
    if hasattr(content, "model_dump_json"):  # pydantic models: JSON, never str() (case E13)
        return str(content.model_dump_json())
    return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS).decode()


def cap_output(text: str, max_chars: int) -> tuple[str, int]:
    """Cap ``text`` to ``max_chars`` characters (the marker included).

    Returns ``(text, cut)`` where ``cut`` is how many characters were removed
    (0 when untouched). The marker says how much was cut so the model can ask
    for less (e.g. read a file in pages).
    """
    if len(text) <= max_chars:
        return text, 0
    total = len(text)
    # Reserve room for the marker so the result never exceeds max_chars.
    marker_room = len(TRUNCATION_MARKER.format(cut=total, total=total))
    keep = max(0, max_chars - marker_room)
    cut = total - keep
    return text[:keep] + TRUNCATION_MARKER.format(cut=cut, total=total), cut


def function_call_output(call_id: str, content: Any, *, max_chars: int) -> tuple[dict[str, Any], int]:
    """Build the ``function_call_output`` item for ``call_id``.

    Returns ``(item, cut_chars)``; ``output`` is always a string no longer than ``max_chars``.
    """
    text, cut = cap_output(output_text(content), max_chars)
    return {"type": "function_call_output", "call_id": call_id, "output": text}, cut


def function_calls(output_items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``function_call`` items of a response's ``output``, in emitted order."""
    return [it for it in output_items if it.get("type") == "function_call"]


def assistant_text(output_items: list[dict[str, Any]]) -> str:
    """Concatenated ``output_text`` parts of the assistant ``message`` items."""
    parts: list[str] = []
    for it in output_items:
        if it.get("type") == "message" and it.get("role", "assistant") == "assistant":
            for c in it.get("content") or []:
                if isinstance(c, dict) and c.get("type") == "output_text":
                    parts.append(c.get("text", ""))
    return "".join(parts)


def unanswered_call_ids(items: list[dict[str, Any]]) -> list[str]:
    """``call_id``s of ``function_call`` items without a ``function_call_output`` (in order)."""
    answered = {it.get("call_id") for it in items if it.get("type") == "function_call_output"}
    return [it["call_id"] for it in items if it.get("type") == "function_call" and it.get("call_id") not in answered]


_NAME_OK = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]")


def _encoded(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):
        return repr(value)  # not JSON data: validation refuses it, naming what arrived


def normalize_reply_calls(
    output_items: list[dict[str, Any]], history_call_ids: set[str], step: int = 0
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Make a reply's ``function_call`` items safe to record and replay.

    Returns ``(items_to_record, calls)``. ``calls`` are the reply's calls in
    emitted order, each with the (possibly renamed) ``call_id``, the name the
    model used, and ``duplicate_of`` when its ``call_id`` was already used.

    Rules (``tests/fixtures/cases/parallel-tool-calls.json``):
    - a ``call_id`` repeated within the reply or the turn (E06, E07) is
      renamed pairwise (``<id>~2``) so each call gets its own output; the copy
      does not run;
    - a name the API would refuse when echoed back (E18, ``multi_tool_use.parallel``)
      is recorded with invalid characters replaced by ``_``;
    - ``arguments`` missing or ``null`` (Gemini omits a no-argument call's ``args``) is recorded
      as ``""``, which validation reads as ``{}``; an object sent in place of the string is
      recorded JSON-encoded (the API takes only a string back).
    """
    seen = set(history_call_ids)
    items: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for item in output_items:
        if item.get("type") != "function_call":
            items.append(item)
            continue
        item = dict(item)
        args = item.get("arguments")
        if not isinstance(args, str):
            item["arguments"] = "" if args is None else _encoded(args)
        # A call without call_id gets one unique in the turn (and the same on a redelivery).
        original = item.get("call_id") or f"call_missing_s{step}_{len(calls)}"
        call_id, n = original, 1
        while call_id in seen:
            n += 1
            call_id = f"{original}~{n}"
        seen.add(call_id)
        call = {
            "call_id": call_id,
            "name": item.get("name", ""),
            "arguments": item["arguments"],
            "duplicate_of": original if call_id != original else None,
        }
        if item.get("text_call"):  # read from the reply's text (worker.model.text_calls)
            call["text_call"] = item["text_call"]
        item["call_id"] = call_id
        name = str(item.get("name", ""))
        if not _NAME_OK.match(name):
            item["name"] = (_NAME_BAD_CHARS.sub("_", name) or "unnamed")[:64]
        items.append(item)
        calls.append(call)
    return items, calls


def cut_replayed_arguments(items: list[dict[str, Any]], call_ids: set[str], max_chars: int) -> list[dict[str, Any]]:
    """Cut the ``arguments`` of the given calls (ones that never ran) to ``max_chars`` with a marker.

    Case E16: a model can emit arguments longer than the API accepts back; the
    history must stay replayable. Calls that ran keep their arguments as sent.
    """
    out = []
    for item in items:
        args = item.get("arguments")
        if (
            item.get("type") == "function_call"
            and item.get("call_id") in call_ids
            and isinstance(args, str)
            and len(args) > max_chars
        ):
            item = {**item, "arguments": args[:max_chars] + f"...[cut: {len(args)} characters in all]"}
        out.append(item)
    return out


def storable(value: Any) -> Any:
    """``value`` made JSON-storable: returned as is when orjson can encode it; otherwise a copy
    where strings with lone surrogates (e.g. file names that are not UTF-8) keep them as
    ``\\udcff`` text, integers beyond 64 bits become strings, and other objects their ``str``.
    """
    try:
        orjson.dumps(value)
        return value
    except TypeError:
        pass

    def fix(v: Any) -> Any:
        if isinstance(v, str):
            return v.encode("utf-8", "backslashreplace").decode("utf-8")
        if isinstance(v, bool) or v is None or isinstance(v, float):
            return v
        if isinstance(v, int):
            return v if -(2**63) <= v < 2**64 else str(v)
        if isinstance(v, dict):
            return {fix(str(k)): fix(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [fix(x) for x in v]
        return fix(str(v))

    return fix(value)
