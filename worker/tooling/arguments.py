"""Argument validation: from the model's ``arguments`` string to validated params.

``validate_tool_arguments(tool, raw)`` never raises for bad input. Its steps
(the policy, with an example of every rung and refusal: ``docs/arguments.md``):

0. Arguments over ``max_arguments_bytes`` (UTF-8; ``settings.max_arguments_bytes``,
   default ``DEFAULT_MAX_ARGUMENTS_BYTES``) are refused before anything else. Nesting deeper
   than ``MAX_NESTING_DEPTH`` (128) is refused first, by a linear count, so no recursive
   parser or validator ever sees it.
1. Happy path: a pydantic tool without float (or ``Any``) fields validates text free
   of ``\\u`` escapes and markup hints (``<``, ``[TOOL_CALLS]``...) directly with
   ``validate_json(raw, strict=True, extra="forbid")`` (one pass): ``forbid`` sends every
   call with a key the model does not declare to the checked path, so an unknown or markup
   key gets the same treatment as on a raw-schema tool (an envelope, whose keys a tool does
   not declare, too). A raw-schema tool's text free of those hints is parsed once and taken
   as sent when every key is declared and the compiled validator accepts it (``_raw_as_sent``;
   the float rule of step 5 applied there too). Other text is parsed with ``orjson`` first (which refuses ``NaN``,
   ``Infinity``, ``1e400`` and lone surrogates: those go to the ladder, which refuses them).
   Valid JSON as sent keeps standard semantics for a repeated key (the last value wins);
   text that needs repair is held to more (a repeated key is refused).
2. Text: an empty string means ``{}``, and so does no value at all (``None``: Gemini omits a
   no-argument call's ``args``; ``worker.model.items`` records it as ``""`` on every wire path);
   the JSON text ``null`` is refused as not an object (case A09). Text that does not parse (or is a JSON
   string) climbs the text ladder (``worker.tooling.repair``); valid JSON that
   is not an object is refused.
3. Object checks, the same for pydantic and raw-schema tools: a call envelope naming
   this tool is unwrapped (``unwrapped_envelope:<key>``), one naming another tool (or
   several calls) is refused (``object_rungs.unwrap_envelope``); a key or a value holding
   leaked tool-call markup is refused (``worker.tooling.markup``); a key that spells a
   parameter the call lacks in another case or with other separators is refused naming
   both (``worker.tooling.keys``). Any other unknown key is the schema's business.
4. Strict tools: a ``null`` for a field the tool's own schema marks optional
   and not nullable means "omitted" and is dropped (``null_as_omitted:<loc>``,
   ``worker.tooling.strict_nulls``).
5. Validation against the tool's own model or raw schema (never the strict
   or wire copy): ``worker.tooling.param_validation``.
6. On failure, the object rungs compose in a fixed order, each recorded and
   the result kept only if it validates: first without unwrapping
   (``decoded_field:<f>`` / ``decoded_python_literal:<f>`` then ``coerced:<f>``), then after
   unwrapping an undeclared single wrapper key (``unwrapped:<k>``, at most
   ``MAX_UNWRAP`` levels, each wrapped value an object or a JSON string of one,
   ``double_encoded:<k>``) followed by the same two rungs. A missing required property
   is reported with the undeclared keys the model sent in its place (``keys.name_sent_keys``).

When the response stopped at the output-token limit (``response_status ==
"incomplete"``) a call that needs any repair, or that fails validation, is refused as
cut off (``error_kind == "cut_off"``), the error saying the limit was hit. An unexpected
failure (a broken tool schema, a bug) becomes an error output.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from worker.tooling.coercion import coerce, has_float_token, whole_numbers
from worker.tooling.contract import WorkerTool
from worker.tooling.json_checks import CUT_OFF_ERROR, MAX_NESTING_DEPTH, Refused, check_depth, too_deep_error
from worker.tooling.keys import name_sent_keys, near_miss_error
from worker.tooling.markup import markup_hinted, markup_key_error, markup_value_error
from worker.tooling.model_flags import FAST_PATHS, accepted_names, fast_path
from worker.tooling.object_rungs import ENVELOPE_KEYS, decode_encoded_fields, unwrap_candidate, unwrap_envelope
from worker.tooling.outcome import ArgumentsOutcome, ErrorKind, accepted
from worker.tooling.oversized import held_arguments, too_large_reason, utf8_size
from worker.tooling.param_validation import params_to_data, validate_params
from worker.tooling.repair import repair_arguments
from worker.tooling.schemas import ValidationInfo, validation_info
from worker.tooling.strict_nulls import omit_nulls
from worker.tooling.validators import FieldError

__all__ = [
    "DEFAULT_MAX_ARGUMENTS_BYTES",
    "DEFAULT_MAX_RAW_ECHO",
    "ArgumentsOutcome",
    "ErrorKind",
    "FieldError",
    "params_to_data",
    "validate_params",
    "validate_tool_arguments",
]

MAX_UNWRAP = 2
"""Wrapper keys unwrapped at most, one inside the other (``{"input": {"arguments": ...}}``)."""

# Text that may hold a call envelope takes the envelope check. Plain substring tests (C speed;
# one regex alternation over the text cost as much as the whole validation).
_ENVELOPE_HINTS = (
    '"tool_',  # tool_uses, tool_calls, tool_input
    '"function',
    '"arg',  # arguments, args
    '"parameters"',
    '"input"',
)


def _envelope_hinted(raw: str) -> bool:
    """True when ``raw`` may hold a call envelope (a superset: ``unwrap_envelope`` decides)."""
    for h in _ENVELOPE_HINTS:
        if h in raw:
            return True
    return False


def _hinted(raw: str, parsed: Any = None) -> bool:
    """True when ``raw`` may hold a markup key or value, a call envelope, or a ``\\u`` escape
    that could hide either: such text takes the object checks. For text that parsed to an object
    (``parsed``), the envelope test is its top-level keys (``ENVELOPE_KEYS``: one set operation,
    where the text test is five substring searches)."""
    if "\\" in raw and "\\u" in raw or markup_hinted(raw):
        return True
    if type(parsed) is dict:
        return not ENVELOPE_KEYS.isdisjoint(parsed)
    return _envelope_hinted(raw)


DEFAULT_MAX_ARGUMENTS_BYTES = 1_048_576
"""Default cap (UTF-8 bytes) on one call's arguments (``settings.max_arguments_bytes``): a bigger
call is refused before it is parsed, stored or run (a 20 MB ``write_file`` argument once cost Redis
about 105 MB: docs/arguments.md, "Order", 0). 1 MiB holds about twice the longest output a model's token limit allows today."""

DEFAULT_MAX_RAW_ECHO = 2_000
"""Default cap (characters) of the raw arguments echoed back in an error (``settings.max_raw_arguments_echo``)."""


def _echo(raw: str, cap: int) -> str:
    if len(raw) <= cap:
        return raw
    return f"{raw[:cap]}... [{len(raw) - cap} more characters not shown]"


def _failure(
    tool: WorkerTool[Any],
    raw: str,
    kind: ErrorKind,
    reason: str,
    cap: int,
    *,
    errors: list[FieldError] | None = None,
    data: Any = None,
    repairs: list[str] | None = None,
) -> ArgumentsOutcome:
    lines = "\n".join(f"- {e.loc}: {e.msg}" for e in errors or [])
    if kind == "validation":
        text = (
            f"Invalid arguments for tool {tool.name}; the call did not run.\n{lines}\n"
            f"Your arguments were: {_echo(raw, cap)}\n"
            "Send a corrected call to this tool with arguments that match its parameters."
        )
    elif kind == "cut_off" and errors:
        text = (
            f"Could not use the arguments for tool {tool.name}: your response stopped at the output-token "
            "limit (it is incomplete), so these arguments are cut off and the call did not run. What is "
            f"missing or wrong in what arrived:\n{lines}\n"
            f"Your arguments were: {_echo(raw, cap)}\n"
            "Send the call again with complete arguments, shorter if needed (for example, write a long file in parts)."
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


def _validate(
    tool: WorkerTool[Any], data: dict[str, Any], info: ValidationInfo, floats: bool = False
) -> tuple[Any, list[FieldError], dict[str, Any], list[str]]:
    """Strict null handling + validation. Returns (params, errors, data_used, repairs): the
    ``null_as_omitted`` drops, and for a raw-schema tool whose arguments may hold a float
    (``floats``) each integral float made the integer its ``integer`` field takes (``coerced:<f>``,
    ``worker.tooling.coercion.whole_numbers``: the rule a pydantic tool gets from its ladder)."""
    notes: list[str] = []
    if tool.strict:
        dropped: list[str] = []
        data = omit_nulls(data, info.schema, info.resolve, "", dropped)
        notes = [f"null_as_omitted:{d}" for d in dropped]
    params, errors = validate_params(tool, data, info)
    if floats and not errors:
        applied: list[str] = []
        data = params = whole_numbers(data, info.schema, info.resolve, applied)
        notes += [f"coerced:{a}" for a in applied]
    return params, errors, data, notes


def validate_tool_arguments(
    tool: WorkerTool[Any],
    raw: str,
    *,
    response_status: str = "completed",
    max_raw_echo: int = DEFAULT_MAX_RAW_ECHO,
    max_arguments_bytes: int = DEFAULT_MAX_ARGUMENTS_BYTES,
) -> ArgumentsOutcome:
    """Parse, repair if needed, and validate a function call's ``arguments``.

    ``raw`` is the ``arguments`` string of a Responses ``function_call`` item
    (a non-string is JSON-encoded first). ``response_status`` is the status
    of the response that carried the call: ``"incomplete"`` (stopped at
    ``max_output_tokens``) refuses every repair, and every failing call, with a
    "cut off" error. ``max_raw_echo`` caps the raw arguments quoted back in ``error``
    (``settings.max_raw_arguments_echo``); ``max_arguments_bytes`` caps the arguments
    themselves (UTF-8 bytes, ``settings.max_arguments_bytes``): a bigger call is refused
    (``error_kind == "too_large"``). Never raises, for any input: see the module docstring
    for the steps and ``worker.tooling.repair`` for the ladder; an unexpected failure (a
    broken tool schema, a bug) becomes an error output.
    """
    if (
        type(raw) is str
        and len(raw) <= max_arguments_bytes >> 2
        and "<" not in raw
        and ("\\" not in raw or "\\u" not in raw)
    ):
        # The happy paths, one per kind of tool: 4 bytes per character bound the size; without
        # ``<`` no value holds markup (every value form has one: worker.tooling.markup); without
        # ``\\u`` escapes no lone surrogate or hidden markup.
        model = tool.input_model
        if model is not None:
            # One strict pydantic-core pass over the text (model_flags.fast_path: a model with a field
            # that takes a float has no ``validate``: pydantic-core accepts NaN, Infinity and 1e400
            # there, which JSON forbids). The bracket count (or a model whose schema bounds the depth)
            # bounds nesting; ``extra="forbid"`` leaves every unknown key (so every markup key and
            # every envelope) to the checked path, and a model with open maps is only taken without
            # any markup hint.
            validate, open_keys, bounded = FAST_PATHS.get(model) or fast_path(model)
            if (
                validate is not None
                and not (open_keys and markup_hinted(raw))
                and (bounded or len(raw) <= MAX_NESTING_DEPTH or raw.count("[") + raw.count("{") <= MAX_NESTING_DEPTH)
            ):
                try:
                    return accepted(tool, validate(raw, strict=True, extra="forbid"), None)
                except ValidationError:
                    pass
        elif response_status == "completed" and not tool.strict:
            done = _raw_as_sent(tool, raw)
            if done is not None:
                return done
    try:
        if raw is None:
            raw = ""  # no arguments at all (Gemini omits a no-argument call's args): as empty
        elif not isinstance(raw, str):
            raw = orjson.dumps(raw).decode()
    except Exception:
        raw = repr(raw)
    held = held_arguments(raw)  # arguments refused before they were stored: their placeholder
    size = held.size if held is not None else utf8_size(raw, max_arguments_bytes)
    if size is not None:
        cap = held.cap if held is not None else max_arguments_bytes
        return _failure(tool, raw, "too_large", too_large_reason(size, cap), max_raw_echo)
    try:
        return _validate_tool_arguments(tool, raw, response_status, max_raw_echo)
    except RecursionError:
        return _failure(tool, raw, "parse", too_deep_error(), max_raw_echo)
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


def _validate_tool_arguments(
    tool: WorkerTool[Any], raw: str, response_status: str, max_raw_echo: int
) -> ArgumentsOutcome:
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
    hinted = _hinted(raw, parsed)
    if type(parsed) is dict and model is not None and not hinted:
        try:
            return accepted(tool, model.__pydantic_validator__.validate_json(raw, strict=True, extra="forbid"), None)
        except ValidationError:
            pass
    info = validation_info(tool)
    props = info.properties
    repairs: list[str] = []
    if parsed is _UNPARSED and (not raw or raw.isspace()):
        data: Any = {}
    elif parsed is _UNPARSED or isinstance(parsed, str):
        # not JSON, or a JSON string (double encoded): the ladder
        rep = repair_arguments(raw, response_status=response_status)
        if not rep.ok:
            refused: ErrorKind = "cut_off" if rep.error == CUT_OFF_ERROR else "parse"
            return _failure(tool, raw, refused, rep.error or "not valid JSON", max_raw_echo)
        data, repairs = rep.value, rep.repairs
    elif not isinstance(parsed, dict):
        kind = {type(None): "null", list: "an array", bool: "a boolean"}.get(type(parsed), "a number")
        return _failure(
            tool, raw, "parse", f"arguments must be a JSON object, got {kind}; send a JSON object", max_raw_echo
        )
    else:
        data = parsed

    # Object checks, the same for every kind of tool: envelopes, markup in keys and values,
    # keys that spell a parameter another way.
    try:
        data, repairs = _object_checks(tool, data, props, hinted or bool(repairs), repairs)
    except Refused as exc:
        return _failure(tool, raw, "parse", str(exc), max_raw_echo)

    # Repaired text and decoded literals may spell a float as ``.0``: any "." counts here.
    floats = model is None and info.integers and ("." in raw or has_float_token(raw))
    params, errors, used, notes = _validate(tool, data, info, floats)
    if not errors:
        if response_status == "incomplete" and (repairs or any(n.startswith("coerced:") for n in notes)):
            return _failure(tool, raw, "cut_off", CUT_OFF_ERROR, max_raw_echo)
        return _success(tool, params, used, repairs + notes)
    if response_status == "incomplete":
        if repairs:
            return _failure(tool, raw, "cut_off", CUT_OFF_ERROR, max_raw_echo)
        errors = name_sent_keys(errors, used, info.schema, info.resolve)
        return _failure(tool, raw, "cut_off", "", max_raw_echo, errors=errors, data=used, repairs=notes)
    found, shown = _object_ladder(tool, data, info, floats)
    if found is not None:
        params, used, names = found
        return _success(tool, params, used, repairs + names)
    if shown is not None:
        errors, used, notes = shown
    errors = name_sent_keys(errors, used, info.schema, info.resolve)
    return _failure(tool, raw, "validation", "", max_raw_echo, errors=errors, data=used, repairs=repairs + notes)


def _raw_as_sent(tool: WorkerTool[Any], raw: str) -> ArgumentsOutcome | None:
    """The happy path of a raw-schema tool (text already free of ``<`` and ``\\u``, within the size
    cap; a completed response; not a strict tool), or None for the checked path: a JSON object with
    no markup or envelope hint, nested within ``MAX_NESTING_DEPTH``, whose keys are all declared (or
    whose schema declares none), that validates as sent. What it skips cannot apply to such an
    object: the envelope, markup and respelled-key checks, the strict nulls, the text ladder. Its
    integral floats where the schema takes an integer are made integers (``coerced:<f>``, the float
    rule of ``_validate``)."""
    if len(raw) > MAX_NESTING_DEPTH and raw.count("[") + raw.count("{") > MAX_NESTING_DEPTH or markup_hinted(raw):
        return None
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if type(parsed) is not dict or not ENVELOPE_KEYS.isdisjoint(parsed):
        return None
    info = validation_info(tool)
    props = info.properties
    if props and not parsed.keys() <= props.keys():
        return None
    if info.validator is None:  # a pydantic tool: the checked path validates it
        return None
    try:
        if not info.validator.is_valid(parsed):
            return None
    except Exception:  # a schema that cannot be applied: the checked path says so
        return None
    if info.integers and has_float_token(raw):
        applied: list[str] = []
        try:
            parsed = whole_numbers(parsed, info.schema, info.resolve, applied)
        except Exception:  # never raises: the checked path turns any fault into an error output
            return None
        if applied:
            return ArgumentsOutcome(
                ok=True, params=parsed, data=parsed, repairs=[f"coerced:{a}" for a in applied], tool=tool
            )
    return accepted(tool, parsed, parsed)


def _object_checks(
    tool: WorkerTool[Any], data: dict[str, Any], props: dict[str, Any], hinted: bool, repairs: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """Step 3 of the module docstring: ``(data, repairs)`` after unwrapping a call envelope for
    this tool; raises ``Refused`` for another tool's envelope, markup in a key or a value, or a
    key that spells a parameter the call lacks. ``hinted``: the text may hold an envelope or
    markup (else only the key spelling is checked: one dict lookup per key)."""
    if hinted:
        env = unwrap_envelope(data, tool.name, props)
        if env is not None:
            data, names = env
            repairs = repairs + names
        problem = markup_key_error(data, props) or markup_value_error(data)
        if problem:
            raise Refused(problem)
    accepted = accepted_names(tool.input_model) if tool.input_model is not None else ()
    near = near_miss_error(data, props, accepted)
    if near:
        raise Refused(near)
    return data, repairs


def _success(tool: WorkerTool[Any], params: Any, used: dict[str, Any], repairs: list[str]) -> ArgumentsOutcome:
    return ArgumentsOutcome(
        ok=True, params=params, data=None if tool.input_model is not None else used, repairs=repairs, tool=tool
    )


def _object_ladder(tool: WorkerTool[Any], data: dict[str, Any], info: ValidationInfo, floats: bool) -> tuple[Any, Any]:
    """The object rungs in their fixed order (module docstring, step 6).

    Returns ``((params, data_used, repairs), None)`` for the first candidate that
    validates, else ``(None, (errors, data_used, notes))`` for the last candidate
    of the branch without unwrapping (its errors are what the model is shown:
    its own object, with only lossless fixes), or ``(None, None)`` when no rung applied.
    """
    props = info.properties
    shown = None
    for unwrap in (False, True):
        cur: dict[str, Any] = data
        names: list[str] = []
        if unwrap:
            for _ in range(MAX_UNWRAP):
                cand = unwrap_candidate(cur, props)
                if cand is None:
                    break
                cur, step = cand
                names = names + step
                p, e, used, notes = _validate(tool, cur, info, floats)
                if not e:
                    return (p, used, names + notes), None
            if not names:
                break
        decoded, step = decode_encoded_fields(cur, info.schema, info.resolve)
        if step:
            cur, names = decoded, names + step
            p, e, used, notes = _validate(tool, cur, info, floats)
            if not e:
                return (p, used, names + notes), None
            if not unwrap:
                shown = (e, used, notes)
        applied: list[str] = []
        coerced = coerce(cur, info.schema, info.resolve, applied)
        if applied:
            cur, names = coerced, names + [f"coerced:{a}" for a in applied]
            p, e, used, notes = _validate(tool, cur, info, floats)
            if not e:
                return (p, used, names + notes), None
            if not unwrap:
                shown = (e, used, notes)
    return None, shown
