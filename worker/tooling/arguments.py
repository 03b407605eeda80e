"""Argument validation: from the model's ``arguments`` string to validated params.

``validate_tool_arguments(tool, raw)`` never raises for bad input. Its steps:

0. Nesting deeper than ``worker.tooling.repair.MAX_NESTING_DEPTH`` (128) is refused
   first, by a linear count (two ``str.count`` calls unless the text has more
   than 128 brackets), so no recursive parser or validator ever sees it.
1. Happy path: a pydantic tool without float (or ``Any``) fields validates
   text free of ``\\u`` escapes directly with its validator's ``validate_json``
   (one pass; ``NaN``, ``Infinity`` and ``1e400`` cannot validate there).
   Other text is parsed with ``orjson`` first, which refuses ``NaN``,
   ``Infinity``, ``1e400`` and lone surrogate escapes that pydantic-core would
   accept (those go to the ladder, which refuses them); a raw-schema tool
   validates the parsed object with a cached ``jsonschema`` validator.
   Valid JSON as sent follows standard JSON semantics for a repeated key (the
   last value wins, as in orjson, pydantic-core, ``json`` and every peer SDK:
   the value validated is the value the tool receives, so nothing can be
   smuggled past validation). Text that needs any repair is held to more:
   there a repeated key is refused (``worker.tooling.repair``: merging guesses).
2. Otherwise: an empty string means ``{}``; a string that does not parse (or
   is a JSON string, i.e. double encoded) climbs the text repair ladder
   (``worker.tooling.repair.repair_arguments``, which also refuses lone surrogates,
   non-finite numbers and duplicate keys); valid JSON that is not an object
   is refused; call envelopes (A18, A38) are refused.
3. Strict tools: OpenAI strict mode makes optional fields required and
   nullable, so a ``null`` for a field the tool's own schema marks optional
   and not nullable means "omitted" and is dropped (named
   ``null_as_omitted:<loc>`` in ``repairs``), at any depth: through
   ``anyOf``/``oneOf``/``allOf`` branches, array items, ``$ref`` targets and
   ``additionalProperties`` schemas (``_omit_nulls``).
4. Validation against the tool's own model or raw schema (never the strict
   copy). On failure, the schema-guided object rungs are tried (a field sent
   as a JSON-encoded array/object, A20; an undeclared wrapper key, A37), each
   kept only if the result validates.

When the response stopped at the output-token limit (``response_status ==
"incomplete"``) a call that needs any repair is refused with a "cut off"
error. ``validate_tool_arguments`` never raises: a validator failure (a
broken schema, a ``RecursionError``) becomes an error output.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import orjson
from pydantic import ValidationError

from worker.tooling.contract import WorkerTool
from worker.tooling.repair import (
    CUT_OFF_ERROR,
    MAX_NESTING_DEPTH,
    _too_deep_error,
    check_depth,
    check_envelope,
    decode_encoded_fields,
    repair_arguments,
    unwrap_candidate,
)
from worker.tooling.schemas import validation_info
from worker.tooling.strict import accepts_null

DEFAULT_MAX_RAW_ECHO = 2_000
"""Default cap (characters) of the raw arguments echoed back in an error (``settings.max_raw_arguments_echo``)."""


class FieldError:
    """One failing field: ``loc`` is a dotted/indexed path (``todos[0].status``), ``msg`` the reason."""

    __slots__ = ("loc", "msg")

    def __init__(self, loc: str, msg: str):
        self.loc = loc
        self.msg = msg

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldError) and (self.loc, self.msg) == (other.loc, other.msg)

    def __hash__(self) -> int:
        return hash((self.loc, self.msg))

    def __repr__(self) -> str:
        return f"FieldError(loc={self.loc!r}, msg={self.msg!r})"


class ArgumentsOutcome:
    """Result of ``validate_tool_arguments``.

    - ``ok``: params validated; ``params`` is the model instance (or dict for a raw schema).
    - ``data``: the JSON object that validated (after repairs), JSON-serialisable.
      For pydantic tools it is ``params.model_dump(mode="json")``, computed on
      first access (the happy path does not pay for it).
    - ``repairs``: names of the repairs applied, in order (empty when the string parsed as is).
    - ``error``: when not ok, the text sent back to the model (failing fields,
      the capped raw arguments, and a request for a corrected call).
    - ``errors``: when validation failed, each failing field.
    - ``error_kind``: ``None`` when ok, else ``"cut_off"`` (response incomplete),
      ``"parse"`` (not a usable JSON object) or ``"validation"`` (schema
      rejected the object). The loop's per-tool retry budget can count these.
    """

    __slots__ = ("ok", "params", "_data", "repairs", "error", "errors", "error_kind", "_tool")

    def __init__(
        self,
        ok: bool,
        params: Any = None,
        data: dict[str, Any] | None = None,
        repairs: list[str] | None = None,
        error: str | None = None,
        errors: list[FieldError] | None = None,
        error_kind: str | None = None,
        tool: WorkerTool | None = None,
    ):
        self.ok = ok
        self.params = params
        self._data = data
        self.repairs = repairs if repairs is not None else []
        self.error = error
        self.errors = errors if errors is not None else []
        self.error_kind = error_kind
        self._tool = tool

    @property
    def data(self) -> dict[str, Any] | None:
        if self._data is None and self.ok and self._tool is not None:
            self._data = params_to_data(self._tool, self.params)
        return self._data

    @data.setter
    def data(self, value: dict[str, Any] | None) -> None:
        """The validated params as a JSON object (computed on first read for pydantic tools)."""
        self._data = value

    def __repr__(self) -> str:
        return (
            f"ArgumentsOutcome(ok={self.ok!r}, params={self.params!r}, data={self.data!r}, "
            f"repairs={self.repairs!r}, error={self.error!r}, errors={self.errors!r}, "
            f"error_kind={self.error_kind!r})"
        )


def _loc(parts: Any) -> str:
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += f".{p}" if out else str(p)
    return out or "<root>"


_REQUIRED_MSG = re.compile(r"^'(.+)' is a required property$")


def _jsonschema_errors(validator: Any, data: Any) -> list[FieldError]:
    errors = []
    for e in validator.iter_errors(data):
        path = list(e.absolute_path)
        if e.validator == "required":
            m = _REQUIRED_MSG.match(e.message)
            if m:
                path.append(m.group(1))
                errors.append(FieldError(_loc(path), "required property is missing"))
                continue
        errors.append(FieldError(_loc(path), e.message))
    errors.sort(key=lambda f: f.loc)
    return errors


def validate_params(tool: WorkerTool, data: dict[str, Any]) -> tuple[Any, list[FieldError]]:
    """Validate a decoded JSON object against the tool's own schema.

    Pydantic tools use ``input_model.model_validate``; raw-schema tools use a
    cached ``jsonschema`` validator (the schema's own draft, Draft 2020-12 by
    default, with format checking), so ``minimum``, ``maximum``, ``pattern``,
    ``minItems`` and every other keyword hold even when the provider got a
    strict copy. Returns ``(params, [])`` on success or ``(None, errors)``
    where each ``FieldError.loc`` names the field (a missing required field
    is reported at its own location, e.g. ``files[0].path``).
    """
    if tool.input_model is not None:
        try:
            return tool.input_model.model_validate(data), []
        except ValidationError as exc:
            return None, [FieldError(_loc(e["loc"]), e["msg"]) for e in exc.errors()]
    validator = validation_info(tool).validator
    try:
        if validator.is_valid(data):
            return data, []
        return None, _jsonschema_errors(validator, data)
    except RecursionError:
        return None, [FieldError("<root>", _too_deep_error())]
    except Exception as exc:  # a schema that cannot be applied (e.g. a $ref that does not resolve)
        return None, [
            FieldError(
                "<root>",
                f"the tool's schema could not be applied "
                f"({exc.__class__.__name__}: {str(exc)[:200]}); "
                "this is a fault of the tool, not of your arguments",
            )
        ]


def params_to_data(tool: WorkerTool, params: Any) -> dict[str, Any]:
    """JSON-ready form of validated params (for storage and the wire)."""
    if tool.input_model is not None:
        return params.model_dump(mode="json")
    return params


def _echo(raw: str, cap: int) -> str:
    if len(raw) <= cap:
        return raw
    return f"{raw[:cap]}... [{len(raw) - cap} more characters not shown]"


def _failure(
    tool: WorkerTool,
    raw: str,
    kind: str,
    reason: str,
    cap: int,
    *,
    errors: list[FieldError] | None = None,
    data: Any = None,
    repairs: list[str] | None = None,
) -> ArgumentsOutcome:
    if kind == "validation":
        lines = "\n".join(f"- {e.loc}: {e.msg}" for e in errors or [])
        text = (
            f"Invalid arguments for tool {tool.name}; the call did not run.\n{lines}\n"
            f"Your arguments were: {_echo(raw, cap)}\n"
            "Send a corrected call to this tool with arguments that match its parameters."
        )
    else:
        text = (
            f"Could not use the arguments for tool {tool.name}: {reason}\n"
            f"Your arguments were: {_echo(raw, cap)}\n"
            "Send a corrected call."
        )
    return ArgumentsOutcome(
        ok=False, data=data, repairs=repairs or [], errors=errors or [], error=text, error_kind=kind
    )


_MAX_NULL_WALK = 4 * 128
"""Bound on schema steps of the null walk (``$ref``/composition chains without data descent)."""


def _could_be(schema: dict[str, Any], kind: str) -> bool:
    t = schema.get("type")
    if t is not None:
        return t == kind or (isinstance(t, list) and kind in t)
    if any(k in schema for k in ("anyOf", "oneOf", "allOf", "$ref")):
        return True
    if kind == "object":
        return "properties" in schema or "additionalProperties" in schema
    return "items" in schema or "prefixItems" in schema


def _pick_branch(value: Any, branches: list[Any], resolve: Any) -> Any:
    """The ``anyOf``/``oneOf`` branch ``value`` was sent for, or ``None`` when none fits.

    A branch fits when it can have the value's JSON type and, for an object,
    declares every key the value has (the strict copy closes every object, so
    the model only sends declared keys) and agrees with every ``const``/``enum``
    property the value gives (discriminated unions). The first fitting branch wins.
    """
    kind = "object" if isinstance(value, dict) else "array"
    for b in branches:
        r = resolve(b)
        if not isinstance(r, dict) or not _could_be(r, kind):
            continue
        if kind == "object":
            props = r.get("properties")
            if isinstance(props, dict) and props:
                if not isinstance(r.get("additionalProperties"), dict) and any(k not in props for k in value):
                    continue
                clash = False
                for k, v in value.items():
                    sub = resolve(props.get(k))
                    if v is None or not isinstance(sub, dict):
                        continue
                    if ("const" in sub and sub["const"] != v) or (
                        isinstance(sub.get("enum"), list) and v not in sub["enum"]
                    ):
                        clash = True
                        break
                if clash:
                    continue
        return b
    return None


def _omit_nulls(value: Any, schema: Any, resolve: Any, loc: str, dropped: list[str], steps: int = 0) -> Any:
    """Drop ``null`` for optional, non-nullable properties (strict-mode "omitted"), at any depth.

    The strict copy (``worker.tooling.strict``) makes every optional property required
    and nullable in every object it closes: top-level, nested, inside
    ``anyOf``/``oneOf``/``allOf`` branches, array ``items``/``prefixItems``,
    ``$ref`` targets in ``$defs`` and ``additionalProperties`` schemas. This
    walks the value next to the tool's own schema through all of those and
    drops a ``null`` only where that schema marks the property optional and not
    nullable (where the strict copy is what made it nullable). A union value
    follows the branch it fits (``_pick_branch``). Returns the value unchanged
    (same object) when nothing was dropped.
    """
    if steps > _MAX_NULL_WALK or not isinstance(value, (dict, list)):
        return value
    schema = resolve(schema)
    if not isinstance(schema, dict):
        return value
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for sub in all_of:
            value = _omit_nulls(value, sub, resolve, loc, dropped, steps + 1)
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            branch = _pick_branch(value, branches, resolve)
            if branch is not None:
                value = _omit_nulls(value, branch, resolve, loc, dropped, steps + 1)
    if isinstance(value, dict):
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        extra = schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else None
        if not props and extra is None:
            return value
        required = schema.get("required", ())
        out = None
        for key, v in value.items():
            sub = props.get(key, extra if key not in props else None)
            if sub is None:
                continue
            here = f"{loc}.{key}" if loc else key
            if v is None:
                if key in props and key not in required and not accepts_null(resolve(sub)):
                    if out is None:
                        out = dict(value)
                    del out[key]
                    dropped.append(here)
            elif isinstance(v, (dict, list)):
                nv = _omit_nulls(v, sub, resolve, here, dropped, steps + 1)
                if nv is not v:
                    if out is None:
                        out = dict(value)
                    out[key] = nv
        return value if out is None else out
    prefix = schema.get("prefixItems")
    prefix = prefix if isinstance(prefix, list) else []
    items = schema.get("items")
    items = items if isinstance(items, dict) else None
    if not prefix and items is None:
        return value
    new = []
    for i, v in enumerate(value):
        sub = prefix[i] if i < len(prefix) else items
        if sub is not None and isinstance(v, (dict, list)):
            v = _omit_nulls(v, sub, resolve, f"{loc}[{i}]", dropped, steps + 1)
        new.append(v)
    return value if all(a is b for a, b in zip(new, value)) else new


def _validate(
    tool: WorkerTool, data: dict[str, Any], info: Any
) -> tuple[Any, list[FieldError], dict[str, Any], list[str]]:
    """Strict null handling + validation. Returns (params, errors, data_used, null_repairs)."""
    notes: list[str] = []
    if tool.strict:
        dropped: list[str] = []
        data = _omit_nulls(data, info.schema, info.resolve, "", dropped)
        notes = [f"null_as_omitted:{d}" for d in dropped]
    params, errors = validate_params(tool, data)
    return params, errors, data, notes


def validate_tool_arguments(
    tool: WorkerTool, raw: str, *, response_status: str = "completed", max_raw_echo: int = DEFAULT_MAX_RAW_ECHO
) -> ArgumentsOutcome:
    """Parse, repair if needed, and validate a function call's ``arguments``.

    ``raw`` is the ``arguments`` string of a Responses ``function_call`` item
    (a non-string is JSON-encoded first). ``response_status`` is the status
    of the response that carried the call: ``"incomplete"`` (stopped at
    ``max_output_tokens``) refuses every repair with a "cut off" error.
    ``max_raw_echo`` caps the raw arguments quoted back in ``error``
    (``settings.max_raw_arguments_echo``). Never raises, for any input: see
    the module docstring for the steps and ``worker.tooling.repair`` for the ladder;
    an unexpected failure (a broken tool schema, a bug) becomes an error output.
    """
    model = tool.input_model
    if (
        model is not None
        and type(raw) is str
        and "\\u" not in raw
        and _no_float_fields(model)
        and (len(raw) <= MAX_NESTING_DEPTH or raw.count("[") + raw.count("{") <= MAX_NESTING_DEPTH)
    ):
        # Happy path: one pydantic-core pass over the text. With no field that takes a float,
        # what JSON forbids but pydantic-core accepts (NaN, Infinity, 1e400) cannot validate;
        # without ``\\u`` escapes there is no lone surrogate; the bracket count bounds nesting.
        try:
            return ArgumentsOutcome(
                True, model.__pydantic_validator__.validate_json(raw), None, None, None, None, None, tool
            )
        except ValidationError:
            pass
    try:
        if not isinstance(raw, str):
            raw = orjson.dumps(raw).decode()
    except Exception:
        raw = repr(raw)
    try:
        return _validate_tool_arguments(tool, raw, response_status, max_raw_echo)
    except RecursionError:
        return _failure(tool, raw, "parse", _too_deep_error(), max_raw_echo)
    except Exception as exc:  # defence in depth: bad input never escapes as an exception
        return _failure(
            tool,
            raw,
            "parse",
            f"the arguments could not be processed ({exc.__class__.__name__}); "
            "send a plain JSON object matching the tool's parameters",
            max_raw_echo,
        )


_UNPARSED = object()


@functools.lru_cache(maxsize=1024)
def _no_float_fields(model: type) -> bool:
    """True when no field of ``model`` (at any depth) can take a float: no ``number``
    type and no schema that accepts anything (``Any``, ``true``, open ``additionalProperties``).
    Cached per model class."""

    def walk(node: Any) -> bool:
        if node is True:
            return False  # accepts anything
        if not isinstance(node, dict):
            return True
        t = node.get("type")
        if t == "number" or (isinstance(t, list) and "number" in t):
            return False
        if t is None and not any(k in node for k in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const", "not")):
            return False  # untyped: Any
        for key in ("properties", "$defs", "definitions", "patternProperties"):
            if not all(walk(v) for v in (node.get(key) or {}).values()):
                return False
        for key in ("items", "additionalProperties", "contains"):
            if key in node and not walk(node[key]):
                return False
        return all(walk(v) for key in ("anyOf", "oneOf", "allOf", "prefixItems") for v in node.get(key) or [])

    try:
        return walk(model.model_json_schema())
    except Exception:
        return False


def _validate_tool_arguments(tool: WorkerTool, raw: str, response_status: str, max_raw_echo: int) -> ArgumentsOutcome:
    if len(raw) > MAX_NESTING_DEPTH and raw.count("[") + raw.count("{") > MAX_NESTING_DEPTH:
        depth = check_depth(raw)  # the exact, string-aware count (the test above is its cheap half)
        if depth:
            return _failure(tool, raw, "parse", depth, max_raw_echo)
    model = tool.input_model
    try:
        # orjson refuses what JSON does not allow but pydantic-core accepts (NaN,
        # Infinity, 1e400, lone surrogate escapes): such text goes to the ladder, which
        # refuses it.
        parsed: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = _UNPARSED
    if type(parsed) is dict and model is not None:
        try:
            return ArgumentsOutcome(
                True, model.__pydantic_validator__.validate_json(raw), None, None, None, None, None, tool
            )
        except ValidationError:
            pass
    info = validation_info(tool)
    props = info.properties
    repairs: list[str] = []
    if parsed is _UNPARSED and (not raw or raw.isspace()):
        data: Any = {}
    elif parsed is _UNPARSED or isinstance(parsed, str):
        # not JSON, or a JSON string (double encoded): the ladder
        rep = repair_arguments(raw, response_status=response_status, declared_properties=props)
        if not rep.ok:
            kind = "cut_off" if rep.error == CUT_OFF_ERROR else "parse"
            return _failure(tool, raw, kind, rep.error or "not valid JSON", max_raw_echo)
        data, repairs = rep.value, rep.repairs
    elif not isinstance(parsed, dict):
        kind = {type(None): "null", list: "an array", bool: "a boolean"}.get(type(parsed), "a number")
        return _failure(
            tool, raw, "parse", f"arguments must be a JSON object, got {kind}; send a JSON object", max_raw_echo
        )
    else:
        data = parsed
        env = check_envelope(data, props)
        if env:
            return _failure(tool, raw, "parse", env, max_raw_echo)

    params, errors, used, notes = _validate(tool, data, info)
    if not errors:
        return ArgumentsOutcome(
            ok=True, params=params, data=None if model is not None else used, repairs=repairs + notes, tool=tool
        )
    if response_status != "incomplete":
        decoded, names = decode_encoded_fields(data, props, info.resolve)
        if names:
            p2, e2, used2, notes2 = _validate(tool, decoded, info)
            if not e2:
                return ArgumentsOutcome(
                    ok=True,
                    params=p2,
                    data=None if model is not None else used2,
                    repairs=repairs + names + notes2,
                    tool=tool,
                )
        cand = unwrap_candidate(data, props)
        if cand is not None:
            key, inner = cand
            p3, e3, used3, notes3 = _validate(tool, inner, info)
            if not e3:
                return ArgumentsOutcome(
                    ok=True,
                    params=p3,
                    data=None if model is not None else used3,
                    repairs=repairs + [f"unwrapped:{key}"] + notes3,
                    tool=tool,
                )
    elif repairs:
        return _failure(tool, raw, "cut_off", CUT_OFF_ERROR, max_raw_echo)
    return _failure(tool, raw, "validation", "", max_raw_echo, errors=errors, data=used, repairs=repairs + notes)
