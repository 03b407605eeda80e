"""Planning a model reply's calls: each ``function_call`` validated (``worker.tooling.arguments``) into a
``PlannedCall`` that runs, or an error output the model reads instead (unknown tool, duplicate
``call_id``, invalid arguments)."""

from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import orjson

from worker.model.text_calls import TEXT_CALL_REPAIR
from worker.tooling.arguments import DEFAULT_MAX_ARGUMENTS_BYTES, ArgumentsOutcome, validate_tool_arguments
from worker.tooling.contract import WorkerTool
from worker.tooling.oversized import MAX_CALL_ID_CHARS, cut_call_id_length
from worker.turn.dispatch import PlannedCall
from worker.turn.state import CallResult

log = logging.getLogger("agent.loop")


class PlannedCalls(NamedTuple):
    """What ``plan_calls`` made of a reply's calls."""

    planned: list[PlannedCall]
    """A ``PlannedCall`` per call, in emitted order (runnable ones carry validated ``data``)."""
    known: dict[str, CallResult]
    """The outputs already known for the calls that will not run (duplicate ``call_id``, unknown
    tool, invalid arguments), by ``call_id``."""
    invalid_counts: dict[str, int]
    """The per-tool invalid-call counts including this reply (the retry budget)."""


def plan_calls(
    turn_id: str,
    invalid_counts: dict[str, int],
    tools: list[WorkerTool[Any]],
    calls: list[dict[str, Any]],
    reply_status: str,
    max_raw_echo: int,
    approval: Callable[[WorkerTool[Any], Any], bool] | None = None,
    max_arguments_bytes: int = DEFAULT_MAX_ARGUMENTS_BYTES,
) -> PlannedCalls:
    """Validate each ``function_call`` of a reply against the turn's tools, in emitted order: a
    ``PlannedCalls`` (the retry budget it counts: docs/architecture.md, "Invalid calls").
    ``approval(tool, params)`` marks a runnable call ``needs_approval`` (``worker.turn.approvals``);
    ``max_arguments_bytes`` caps one call's arguments (``settings.max_arguments_bytes``).
    Never raises for bad model output.
    """
    by_name = {t.name: t for t in tools}
    invalid_counts = dict(invalid_counts)
    planned: list[PlannedCall] = []
    pre: dict[str, CallResult] = {}
    for i, fc in enumerate(calls):
        call_id, name = fc["call_id"], fc["name"]
        cut = cut_call_id_length(call_id)
        if cut is not None:  # cut at the edge (worker.tooling.oversized): kept short, never run
            out = (
                f"Error: the call_id of this call was {cut:,} characters long; call_ids are at most "
                f"{MAX_CALL_ID_CHARS} characters. It did not run (it is recorded as {call_id}). "
                "Send the call again with a short call_id."
            )
            invalid_counts[name] = invalid_counts.get(name, 0) + 1
            planned.append(
                PlannedCall(
                    call_id, name, i, output=out, activity=f"Refused call of {name}", error_kind="oversized_call_id"
                )
            )
            pre[call_id] = CallResult.error(out, "oversized_call_id", length=cut)
            continue
        if fc.get("duplicate_of"):
            # Cases E06/E07: a repeated call_id would rebind outputs; the copy gets its own id and does not run.
            out = (
                f"Error: this call repeated call_id {fc['duplicate_of']!r}; it did not run. "
                "Every call needs its own call_id."
            )
            planned.append(
                PlannedCall(
                    call_id, name, i, output=out, activity=f"Duplicate call of {name}", error_kind="duplicate_call_id"
                )
            )
            pre[call_id] = CallResult.error(out, "duplicate_call_id")
            continue
        read = [f"{TEXT_CALL_REPAIR}:{fc['text_call']}"] if fc.get("text_call") else []
        tool = by_name.get(name)
        if tool is None:
            available = ", ".join(sorted(by_name)) or "(none)"
            out = f"Error: unknown tool {name!r}. Call one of the available tools by its exact name: {available}."
            planned.append(
                PlannedCall(
                    call_id,
                    name,
                    i,
                    output=out,
                    activity=f"Unknown tool {name}",
                    repairs=read,
                    error_kind="unknown_tool",
                )
            )
            pre[call_id] = CallResult.error(out, "unknown_tool")
            continue
        try:
            outcome = validate_tool_arguments(
                tool,
                fc.get("arguments", ""),
                response_status=reply_status,
                max_raw_echo=max_raw_echo,
                max_arguments_bytes=max_arguments_bytes,
            )
            if outcome.ok:
                orjson.dumps(outcome.data)  # must be storable (e.g. no lone surrogates)
        except Exception as exc:  # defence in depth: bad input never crashes the turn
            log.exception("validating arguments of %s in turn %s", name, turn_id)
            outcome = ArgumentsOutcome(
                ok=False,
                error_kind="parse",
                error=(
                    f"Could not use the arguments for tool {name}: they could not be processed "
                    f"({exc.__class__.__name__}: {str(exc)[:200]}). Send a corrected call with a plain JSON object."
                ),
            )
        if not outcome.ok:
            # Every kind (cut off, unparseable, failing validation) spends the tool's retry budget.
            invalid_counts[name] = invalid_counts.get(name, 0) + 1
            out = outcome.error or f"Error: invalid arguments for {name}"
            planned.append(
                PlannedCall(
                    call_id,
                    name,
                    i,
                    mode=tool.execution_mode,
                    output=out,
                    activity=f"Rejected arguments for {name}",
                    repairs=read + outcome.repairs,
                    error_kind="invalid_arguments",
                )
            )
            pre[call_id] = CallResult.error(
                out,
                "invalid_arguments",
                kind=outcome.error_kind,
                repairs=read + outcome.repairs,
                errors=[{"loc": e.loc, "msg": e.msg} for e in outcome.errors],
            )
            continue
        planned.append(
            PlannedCall(
                call_id,
                name,
                i,
                mode=tool.execution_mode,
                data=outcome.data,
                activity=tool.activity(outcome.params),
                repairs=read + outcome.repairs,
                destructive=tool.is_destructive,
                computer=tool.needs_computer,
                needs_approval=bool(approval and approval(tool, outcome.params)),
            )
        )
    return PlannedCalls(planned, pre, invalid_counts)
