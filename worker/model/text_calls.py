"""Tool calls a model wrote as text, read on the client (docs/real-model.md, "Calls written as text").

An open model's server turns the call markup of the model's chat template into ``tool_calls``
with its own parser. When the model strays from that markup, real servers differ: vLLM's
parsers (``--tool-call-parser hermes``, ...) and Ollama return the text as the message's
content; llama.cpp's ``llama-server`` fails the request ("The model produced output that does
not match the expected ... format") unless it runs with ``--skip-chat-parsing``, which returns
every reply as content. Either way the runtime then holds the model's own text, and reads the
open models' known call forms from it here; each call's arguments then go through the same
repair ladder and schema validation as any ``function_call`` (``worker.tooling.arguments``).

Forms, named in the call's repairs as ``text_call:<form>``:

- ``tool_call_tag``: Hermes and Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  (the closing tag may be missing before the next tag or at the end). When any tag is present,
  only tags are read;
- ``json``: a bare call object ``{"name": ..., "arguments": ...}`` in the text (``parameters``
  for ``arguments`` too), what Qwen2.5 writes without its tags;
- ``fenced_json``: such an object inside a Markdown code fence;
- ``fenced_arguments``: a fence holding only arguments, read as a call of the one offered tool
  whose own schema they fit (every key declared, every required key present). When no tool or
  several fit, the fence stays text: a tool is never guessed.

What is not strict JSON is read as the repair ladder reads arguments (``repair_arguments``) to
find a call's name or fit a schema, and is then handed to the ladder as written, which repairs it
again and names its repairs. A tag whose body the ladder cannot read still becomes a call when its
name can be read (the ladder then refuses the arguments with a message the model reads); without a readable name it becomes a
call of the tool ``""``, which the model is told does not exist, with the tools it has. Text
outside the calls is kept as the reply's message, before them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from worker.tooling.repair import repair_arguments

TEXT_CALL_REPAIR = "text_call"
"""The prefix of the repair that names a call's form (``text_call:tool_call_tag``)."""

_TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|(?=<tool_call>)|\Z)", re.DOTALL)
_FENCE = re.compile(r"```[ \t]*[A-Za-z0-9_+-]*[ \t]*\n(.*?)\n?[ \t]*```", re.DOTALL)
_OBJECT_START = re.compile(r"\{\s*\"(?:name|arguments|parameters)\"\s*:")
_NAME = re.compile(r"\"name\"\s*:\s*\"([^\"\\]{1,128})\"")
_ARG_KEYS = ("arguments", "parameters")
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class TextCall:
    """A call read from text: the tool's ``name``, its ``arguments`` as text (for the repair
    ladder), and the ``form`` it was written in (module docstring)."""

    name: str
    arguments: str
    form: str


def _envelope(value: Any) -> tuple[str, str] | None:
    """``(name, arguments text)`` when ``value`` is a call object: a string ``name`` and one of
    ``arguments``/``parameters`` (an object or a string), and nothing else."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    keys = [k for k in _ARG_KEYS if k in value]
    if len(keys) != 1 or set(value) != {"name", keys[0]}:
        return None
    args = value[keys[0]]
    if isinstance(args, str):
        return value["name"], args
    if isinstance(args, dict):
        return value["name"], orjson.dumps(args).decode()
    return None


def _decoded(text: str) -> tuple[Any, bool]:
    """``(value, repaired)``: ``text`` as strict JSON, else as the repair ladder reads it
    (``repair_arguments``), else ``(None, False)``."""
    try:
        return orjson.loads(text), False
    except orjson.JSONDecodeError:
        pass
    repaired = repair_arguments(text)
    return (repaired.value, True) if repaired.ok else (None, False)


def _tag_call(body: str) -> TextCall:
    """The call of one ``<tool_call>`` body. Its arguments are the envelope's when the body is
    strict JSON; otherwise the body itself, for the ladder to repair and unwrap (and name its
    repairs), with the name read from it."""
    body = body.strip()
    fenced = _FENCE.fullmatch(body)
    inner = fenced.group(1).strip() if fenced else body
    value, repaired = _decoded(inner)
    found = _envelope(value)
    if found is not None:
        return TextCall(found[0], body if repaired else found[1], "tool_call_tag")
    name = _NAME.search(inner)
    return TextCall(name.group(1) if name else "", body, "tool_call_tag")


def fits_schema(value: Any, schema: Mapping[str, Any]) -> bool:
    """Whether ``value`` (decoded JSON) has the shape of ``schema``'s arguments: a non-empty
    object whose every key the schema declares (``properties``) and which holds every key the
    schema requires. Types are the validator's business, after the ladder."""
    if not isinstance(value, dict) or not value:
        return False
    declared = schema.get("properties")
    if not isinstance(declared, dict):
        return False
    required = schema.get("required") or []
    return set(value) <= set(declared) and set(required) <= set(value)


def _fenced_call(content: str, schemas: Mapping[str, Mapping[str, Any]]) -> TextCall | None:
    content = content.strip()
    value, repaired = _decoded(content)
    found = _envelope(value)
    if found is not None:
        return TextCall(found[0], content if repaired else found[1], "fenced_json")
    fitting = [name for name, schema in schemas.items() if fits_schema(value, schema)]
    if len(fitting) == 1:
        return TextCall(fitting[0], content, "fenced_arguments")
    return None


def _bare_calls(text: str) -> list[tuple[int, int, TextCall]]:
    """The call objects written in ``text`` outside fences: ``(start, end, call)``."""
    found: list[tuple[int, int, TextCall]] = []
    pos = 0
    while (match := _OBJECT_START.search(text, pos)) is not None:
        try:
            value, end = _DECODER.raw_decode(text, match.start())
        except ValueError:
            pos = match.end()
            continue
        call = _envelope(value)
        if call is not None:
            found.append((match.start(), end, TextCall(call[0], call[1], "json")))
        pos = end if call is not None else match.end()
    return found


def read_text_calls(text: str, schemas: Mapping[str, Mapping[str, Any]]) -> tuple[str, list[TextCall]]:
    """The calls written in ``text`` and the text left around them (stripped), in order.
    ``schemas``: the offered tools' own parameter schemas by name (for ``fenced_arguments``).
    No call: ``(text, [])``. Never raises for any text."""
    spans: list[tuple[int, int, TextCall]] = []
    tags = list(_TAG.finditer(text))
    if tags:
        spans = [(m.start(), m.end(), _tag_call(m.group(1))) for m in tags]
    else:
        fences = list(_FENCE.finditer(text))
        for m in fences:
            call = _fenced_call(m.group(1), schemas)
            if call is not None:
                spans.append((m.start(), m.end(), call))
        outside = _blank(text, [(m.start(), m.end()) for m in fences])
        spans.extend(_bare_calls(outside))
        spans.sort(key=lambda span: span[0])
    if not spans:
        return text, []
    rest = _blank(text, [(start, end) for start, end, _ in spans])
    return re.sub(r"[ \t]*\x00+[ \t]*", "", rest).strip(), [call for _, _, call in spans]


def _blank(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` with each span replaced by NULs of its length (offsets kept)."""
    chars = list(text)
    for start, end in spans:
        chars[start:end] = "\x00" * (end - start)
    return "".join(chars)


def calls_from_text(
    output: list[dict[str, Any]], schemas: Mapping[str, Mapping[str, Any]], step: int
) -> list[dict[str, Any]] | None:
    """A reply's ``output`` with the calls its assistant text holds (``read_text_calls``) as
    ``function_call`` items, each with ``text_call`` naming its form; the text left stays a
    message before them. None when the reply already has a ``function_call`` or its text holds
    none. ``call_id``s are ``call_text_s<step>_<n>``, the same on every read of a stored reply."""
    if any(item.get("type") == "function_call" for item in output):
        return None
    items: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for item in output:
        if item.get("type") != "message" or item.get("role", "assistant") != "assistant":
            items.append(item)
            continue
        text = "".join(
            part.get("text", "")
            for part in item.get("content") or []
            if isinstance(part, dict) and part.get("type") == "output_text"
        )
        rest, found = read_text_calls(text, schemas)
        if not found:
            items.append(item)
            continue
        if rest:
            items.append({**item, "content": [{"type": "output_text", "text": rest, "annotations": []}]})
        for call in found:
            n = len(calls)
            calls.append(
                {
                    "type": "function_call",
                    "id": f"fc_s{step}_text{n}",
                    "call_id": f"call_text_s{step}_{n}",
                    "name": call.name,
                    "arguments": call.arguments,
                    "status": "completed",
                    TEXT_CALL_REPAIR: call.form,
                }
            )
    return items + calls if calls else None
