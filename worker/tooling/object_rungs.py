"""Object rungs: repairs of a decoded JSON object, guided by the tool's schema.

Envelopes and wrappers around the arguments, fields sent as JSON-encoded strings or as
Python literals (markup in keys and values: ``worker.tooling.markup``). ``worker.tooling.arguments`` composes them in a fixed order.
"""

from __future__ import annotations

import ast
from typing import Any, Callable

import orjson

from worker.tooling.coercion import schema_types
from worker.tooling.json_checks import MAX_REPAIR_CHARS, Refused, check_depth, check_values, loads_once
from worker.tooling.strict_nulls import pick_branch

_ENVELOPE_EXTRA = frozenset({"id", "type", "call_id", "index"})
_NAME_KEYS = ("name", "tool", "tool_name", "function_name", "recipient_name")
_ARG_KEYS = ("arguments", "parameters", "input", "args", "tool_input")
_CALL_KEYS = ("function", "function_call")  # {"function": {"name", "arguments"}}
_LIST_KEYS = ("tool_uses", "tool_calls")  # multi_tool_use.parallel, a whole tool_calls array
ENVELOPE_KEYS = frozenset(_ARG_KEYS + _CALL_KEYS + _LIST_KEYS)
"""An object can be an envelope (``unwrap_envelope``) only with one of these keys at its top level."""


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


# ---- object rungs (schema-guided) ------------------------------------------------------------


_UNCHANGED: Any = object()
_MAX_DECODE_STEPS = 4 * 128  # schema steps along one path ($ref / composition chains)


def decode_encoded_fields(
    data: dict[str, Any], schema: Any, resolve: Callable[[Any], Any] = lambda s: s
) -> tuple[dict[str, Any], list[str]]:
    """Decode string values, at any depth, whose schema takes only an object or an array (A20).

    A value is decoded only where the schema does not also take a string, and only to the
    declared JSON type: JSON text first (``decoded_field:<loc>``), else a Python literal
    (``"{'theme': 'dark', 'size': 14}"``, ``"['a', 'b']"``, with ``True``/``None``: a model that
    sent ``str(value)``; ``decoded_python_literal:<loc>``), read by ``ast.literal_eval`` and kept
    only when it is JSON data (string keys, finite numbers, no tuples, sets or bytes).
    ``loc`` is the field's path (``settings``, ``items[0].meta``). Returns ``(new_data, names)``
    (the same ``data`` and ``[]`` when nothing applied).
    """
    names: list[str] = []
    out = _decode(data, schema, resolve, names, "", 0)
    return out, names


def _decode(value: Any, schema: Any, resolve: Callable[[Any], Any], names: list[str], loc: str, steps: int) -> Any:
    if steps > _MAX_DECODE_STEPS:
        return value
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return value
    if isinstance(value, str):
        new, name = _decoded_text(value, schema_types(schema, resolve))
        if new is _UNCHANGED:
            return value
        names.append(f"{name}:{loc or '<root>'}")
        return new
    if not isinstance(value, (dict, list)):
        return value
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            branch = pick_branch(value, branches, resolve)
            if branch is not None:
                value = _decode(value, branch, resolve, names, loc, steps + 1)
    for sub in schema.get("allOf") or []:
        value = _decode(value, sub, resolve, names, loc, steps + 1)
    if isinstance(value, dict):
        return _decode_object(value, schema, resolve, names, loc, steps)
    return _decode_array(value, schema, resolve, names, loc, steps)


def _decode_object(
    value: dict[str, Any], schema: dict[str, Any], resolve: Callable[[Any], Any], names: list[str], loc: str, steps: int
) -> dict[str, Any]:
    found = schema.get("properties")
    props: dict[str, Any] = found if isinstance(found, dict) else {}
    extra = schema.get("additionalProperties") if isinstance(schema.get("additionalProperties"), dict) else None
    out = None
    for key, v in value.items():
        sub = props.get(key, extra)
        if sub is None:
            continue
        nv = _decode(v, sub, resolve, names, f"{loc}.{key}" if loc else key, steps + 1)
        if nv is not v:
            out = dict(value) if out is None else out
            out[key] = nv
    return value if out is None else out


def _decode_array(
    value: list[Any], schema: dict[str, Any], resolve: Callable[[Any], Any], names: list[str], loc: str, steps: int
) -> list[Any]:
    found = schema.get("prefixItems")
    prefix: list[Any] = found if isinstance(found, list) else []
    items = schema.get("items") if isinstance(schema.get("items"), dict) else None
    out = None
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is None:
            continue
        nv = _decode(v, sub, resolve, names, f"{loc}[{i}]", steps + 1)
        if nv is not v:
            out = list(value) if out is None else out
            out[i] = nv
    return value if out is None else out


def _decoded_text(text: str, types: set[str] | None) -> tuple[Any, str]:
    """``(value, repair name)`` for a string that spells the object or array its schema takes,
    else ``(_UNCHANGED, "")``."""
    if types is None or "string" in types or not types & {"array", "object"}:
        return _UNCHANGED, ""
    s = text.strip()
    if not s or s[0] not in "[{" or len(s) > MAX_REPAIR_CHARS or check_depth(s):
        return _UNCHANGED, ""
    try:
        decoded, name = loads_once(s), "decoded_field"
    except orjson.JSONDecodeError:
        decoded, name = _python_literal(s), "decoded_python_literal"
    except Refused:
        return _UNCHANGED, ""
    if (isinstance(decoded, list) and "array" in types) or (isinstance(decoded, dict) and "object" in types):
        return decoded, name
    return _UNCHANGED, ""


def _python_literal(text: str) -> Any:
    """The JSON data a Python literal spells (``ast.literal_eval``: no code runs), or ``_UNCHANGED``
    when it is not one, or holds what JSON cannot (tuples, sets, bytes, non-string keys, NaN)."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNCHANGED
    if not _is_json_data(value) or check_values(value):
        return _UNCHANGED
    return value


def _is_json_data(value: Any) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif v is not None and not isinstance(v, (str, int, float, bool)):
            return False
    return True


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
