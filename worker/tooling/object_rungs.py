"""Object rungs: repairs of a decoded JSON object, guided by the tool's schema.

Envelopes and wrappers around the arguments, markup in keys, fields sent as
JSON-encoded strings. ``worker.tooling.arguments`` composes them in a fixed order.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import orjson

from worker.tooling.json_checks import Refused, check_depth, loads_once

_ENVELOPE_EXTRA = frozenset({"id", "type", "call_id", "index"})
_NAME_KEYS = ("name", "tool", "tool_name", "function_name", "recipient_name")
_ARG_KEYS = ("arguments", "parameters", "input", "args", "tool_input")
_CALL_KEYS = ("function", "function_call")  # {"function": {"name", "arguments"}}
_LIST_KEYS = ("tool_uses", "tool_calls")  # multi_tool_use.parallel, a whole tool_calls array


def _names_tool(name: Any, tool_name: str) -> bool:
    """``name`` is this tool's name, bare or behind a prefix (``functions.x``, ``ns.x``)."""
    return isinstance(name, str) and (name == tool_name or name.rsplit(".", 1)[-1] == tool_name)


def _call(value: Any, declared: Any) -> tuple[Any, str, Any, str] | None:
    """``(name, name_key, arguments, arguments_key)`` when ``value`` has the shape of one tool call:
    one name key and one arguments key (an object or a string), besides only ``id``/``type``/
    ``call_id``/``index``; or a ``function``/``function_call`` object of that shape. Keys the
    tool declares (``declared``) are never taken for envelope keys, except the name key."""
    if not isinstance(value, dict):
        return None
    for key in _CALL_KEYS:
        inner = value.get(key)
        if isinstance(inner, dict) and key not in declared and set(value) - {key} <= _ENVELOPE_EXTRA:
            found = _call(inner, ())
            if found is not None:
                return found[0], found[1], found[2], f"{key}.{found[3]}"
    names = [k for k in _NAME_KEYS if k in value]
    args = [k for k in _ARG_KEYS if k in value]
    if len(names) != 1 or len(args) != 1 or args[0] in declared:
        return None
    if not isinstance(value[args[0]], (dict, str)) or set(value) - {names[0], args[0]} - _ENVELOPE_EXTRA:
        return None
    if set(value) & set(declared) - {names[0]}:
        return None
    return value[names[0]], names[0], value[args[0]], args[0]


def _envelope_args(value: Any, key: str) -> dict[str, Any]:
    """An envelope's arguments: an object, or a JSON string holding one (decoded once)."""
    if isinstance(value, str):
        s = value.strip()
        if not s:
            return {}
        if check_depth(s):
            raise Refused(f"the {key!r} string of the call envelope nests too deeply; send a flat JSON object")
        try:
            value = loads_once(s)
        except orjson.JSONDecodeError:
            value = None
    if not isinstance(value, dict):
        raise Refused(
            f"these arguments are a call envelope whose {key!r} is not a JSON object; nothing was run: "
            "send only the arguments object"
        )
    return value


def unwrap_envelope(value: dict[str, Any], tool_name: str, declared: Any) -> tuple[dict[str, Any], list[str]] | None:
    """Arguments sent inside a call envelope (A18, A38, B13): ``(inner, repairs)`` or ``None``.

    An envelope has the shape of a whole tool call, recognised only where the
    tool's schema does not declare the envelope's keys (``declared``: its
    top-level property names):

    - a name (``name``, ``tool``, ``tool_name``, ``function_name``,
      ``recipient_name``) and arguments (``arguments``, ``parameters``,
      ``input``, ``args``, ``tool_input``), with at most ``id``/``type``/
      ``call_id``/``index`` besides (OpenAI, Llama, Anthropic ``tool_use`` shapes);
    - that shape inside ``function`` or ``function_call``;
    - a list of such calls under ``tool_uses`` (``multi_tool_use.parallel``) or ``tool_calls``.

    One call naming this tool (``x``, ``functions.x``): its arguments (an object,
    or a JSON string of one, decoded once) are the arguments, recorded as
    ``unwrapped_envelope:<key>`` (and ``double_encoded:<key>``). Any other envelope
    (another tool's name, several calls, arguments that are not an object) raises
    ``Refused``: running it would run the wrong call, or one of several. Same rule
    for pydantic and raw-schema tools.
    """
    declared = declared or ()
    for key in _LIST_KEYS:
        calls = value.get(key)
        if key in declared or not isinstance(calls, list) or not calls:
            continue
        parts = [p for c in calls if (p := _call(c, ())) is not None]
        if len(parts) != len(calls):
            continue
        if len(parts) == 1 and set(value) - {key} <= _ENVELOPE_EXTRA and _names_tool(parts[0][0], tool_name):
            return _unwrapped(parts[0][2], key, parts[0][3].split(".")[-1])
        raise Refused(
            f"these arguments hold {len(parts)} tool call(s) under {key!r} (e.g. the internal "
            "multi_tool_use.parallel shape, tool_uses/recipient_name) instead of this tool's arguments; "
            "nothing was run: call each tool directly, one function call per tool"
        )
    found = _call(value, declared)
    if found is None:
        return None
    name, name_key, args, args_key = found
    where = args_key.split(".")[0]
    if _names_tool(name, tool_name):
        return _unwrapped(args, where, args_key.split(".")[-1])
    if name_key not in declared or "." in args_key:
        raise Refused(_other_tool(name))
    return None


def _unwrapped(args: Any, where: str, key: str) -> tuple[dict[str, Any], list[str]]:
    inner = _envelope_args(args, key)
    return inner, [f"unwrapped_envelope:{where}"] + ([f"double_encoded:{key}"] if isinstance(args, str) else [])


def _other_tool(name: Any) -> str:
    return (
        f"these arguments are a whole tool-call envelope for the tool {str(name)[:80]!r} (name + arguments), "
        "not this tool's arguments; nothing was run: call that tool directly, and send only the arguments object"
    )


# Chat-template and XML markup that leaks from a model's tool-call format into a key: <|...|>
# delimiters (also DeepSeek's fullwidth <｜...｜>), closing tags (also unterminated: "</parameter"),
# opening tags or assignments (<arg_key>, <parameter=cmd>, <tool_call>, <a href=...>), and Mistral's
# [TOOL_CALLS]/[ARGS]/[CALL_ID] control tokens; a known tool-format tag name also when left open ("<parameter").
_MARKUP = re.compile(
    r"<[|\uff5c]|[|\uff5c]>|</\s*[A-Za-z_]|<[A-Za-z_][\w:.-]*(?:\s*/?>|=|\s+[\w:.-]+\s*=)"
    r"|<\s*(?:parameter|function|tool_calls?|tool_response|arg_key|arg_value|invoke|think)\b"
    r"|\[/?(?:TOOL_CALLS|ARGS|CALL_ID|TOOL_RESULTS)\]"
)


def markup_key_error(value: Any, declared: Any) -> str | None:
    """An error naming the first key (at any depth) that holds chat-template or XML markup, else ``None``.

    Keys the tool's schema declares at the top level are allowed. Such a key is
    a leak of the model's tool-call format into the JSON (B01: a Qwen3
    ``</parameter`` fragment became a key), never a parameter name, and a schema
    with open ``additionalProperties`` would take it as one. Iterative, O(size).
    """
    declared = declared or ()
    stack = [(value, True)]
    while stack:
        v, top = stack.pop()
        if isinstance(v, dict):
            for k, sub in v.items():
                if isinstance(k, str) and not (top and k in declared):
                    m = _MARKUP.search(k)
                    if m:
                        return (
                            f"the key {k[:80]!r} in your arguments holds chat-template or XML markup "
                            f"({m.group()!r}): a tool-call format leaked into the JSON; nothing was run: send the "
                            "arguments as one plain JSON object whose keys are the tool's parameter names"
                        )
                if isinstance(sub, (dict, list)):
                    stack.append((sub, False))
        elif isinstance(v, list):
            stack.extend((x, False) for x in v if isinstance(x, (dict, list)))
    return None


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
            decoded = loads_once(s)
        except (orjson.JSONDecodeError, Refused):
            continue
        if (isinstance(decoded, list) and "array" in types) or (isinstance(decoded, dict) and "object" in types):
            changed[key] = decoded
            names.append(f"decoded_field:{key}")
    if not changed:
        return data, []
    return {**data, **changed}, names


def unwrap_candidate(data: dict[str, Any], properties: Any) -> tuple[dict[str, Any], list[str]] | None:
    """``(inner, repairs)`` when ``data`` is a single undeclared key wrapping an object (A37), else ``None``.

    The wrapped value may be an object, or a JSON string holding one (decoded once,
    only to an object): ``{"arguments": "{\\"path\\": \\"a\\"}"}`` gives
    ``(["unwrapped:arguments", "double_encoded:arguments"])``. The caller keeps
    the result only if it validates.
    """
    if len(data) != 1:
        return None
    ((key, inner),) = data.items()
    if key in (properties or ()):
        return None
    names = [f"unwrapped:{key}"]
    if isinstance(inner, str):
        s = inner.strip()
        if not s.startswith("{") or check_depth(s):
            return None
        try:
            inner = loads_once(s)
        except (orjson.JSONDecodeError, Refused):
            return None
        names.append(f"double_encoded:{key}")
    if not isinstance(inner, dict):
        return None
    return inner, names
