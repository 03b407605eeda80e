"""Typed records of the turn's main events, as the control plane reads them from ``turn:{id}:events``.

Each record knows its ``KIND`` and gives its fields (``fields()``), or the ``(kind, fields)`` pair
the store appends (``event()``); ``worker.turn.state.event_json`` adds ``kind`` and ``at`` when it
is stored. The full list of kinds, with the smaller ones written inline, is in
docs/architecture.md ("Events").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from worker.turn.dispatch import PlannedCall
from worker.turn.state import CallResult

PREVIEW_CHARS = 300  # characters of a call's output in its call_completed event

EVENT_KINDS = frozenset(
    {
        "turn_queued",
        "turn_started",
        "model_delta",
        "model_stream_broken",
        "model_reply",
        "model_retry",
        "call_planned",
        "approval_requested",
        "approval_decided",
        "call_started",
        "call_completed",
        "repair_instruction",
        "cancel_requested",
        "turn_redriven",
        "scheduled_by",
        "turn_finished",
    }
)
"""Every kind of the turn's event stream (docs/architecture.md, "Events"): what a reader may ask
for (``GET /v1/turns/{id}/events?kinds=``)."""


@dataclass(frozen=True)
class _Event:
    KIND: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        """The event's fields, as stored (JSON values)."""
        return dict(self.__dict__)

    def event(self) -> tuple[str, dict[str, Any]]:
        """``(kind, fields)``, as ``TurnStore.add_events`` and its transitions take events."""
        return self.KIND, self.fields()


@dataclass(frozen=True)
class ModelReplied(_Event):
    """``model_reply``: a model call answered (``status`` ``completed``/``incomplete``; ``text`` cut
    to 1,000 characters; ``calls`` counted; ``ms`` the call's latency; ``usage`` normalized)."""

    KIND: ClassVar[str] = "model_reply"
    step: int
    status: str
    text: str
    calls: int
    ms: float
    usage: dict[str, int]


@dataclass(frozen=True)
class CallPlanned(_Event):
    """``call_planned``: one function call of a reply, validated. ``batch`` is None for a call that
    does not run (``error`` says why: ``invalid_arguments``, ``unknown_tool``, ``duplicate_call_id``);
    ``arguments`` are the validated params of a call that runs."""

    KIND: ClassVar[str] = "call_planned"
    step: int
    call_id: str
    name: str
    activity: str
    mode: str
    repairs: list[str]
    error: str | None
    batch: int | None
    arguments: dict[str, Any] | None
    needs_approval: bool

    @classmethod
    def of(cls, step: int, call: PlannedCall, batch: int | None) -> CallPlanned:
        """The event of planned ``call`` of ``step``, sent in batch ``batch``."""
        return cls(
            step=step,
            call_id=call.call_id,
            name=call.name,
            activity=call.activity,
            mode=call.mode,
            repairs=call.repairs,
            error=call.error_kind,
            batch=batch,
            arguments=call.data if call.runnable else None,
            needs_approval=call.needs_approval,
        )


@dataclass(frozen=True)
class CallStarted(_Event):
    """``call_started``: a worker claimed the call and runs it (written with the claim)."""

    KIND: ClassVar[str] = "call_started"
    step: int
    call_id: str
    name: str
    activity: str


@dataclass(frozen=True)
class CallCompleted(_Event):
    """``call_completed``: every ending of a call (ran, failed, interrupted, rejected, outcome
    unknown), written with its result. ``error`` is the result's ``details.error``; ``preview`` the
    output's first ``PREVIEW_CHARS`` characters."""

    KIND: ClassVar[str] = "call_completed"
    step: int
    call_id: str
    name: str
    activity: str
    is_error: bool
    error: str | None
    ms: float | None
    terminate: bool
    preview: str

    @classmethod
    def of(cls, step: int, call: PlannedCall, result: CallResult) -> CallCompleted:
        """The event of ``call`` ending with ``result``."""
        return cls(
            step=step,
            call_id=call.call_id,
            name=call.name,
            activity=result.activity or call.activity,
            is_error=result.is_error,
            error=result.details.get("error"),
            ms=result.ms,
            terminate=result.terminate,
            preview=result.output[:PREVIEW_CHARS],
        )


@dataclass(frozen=True)
class TurnFinished(_Event):
    """``turn_finished``: the turn ended with ``status`` (and ``error``, ``final_output``); ``usage``
    is the turn's token totals."""

    KIND: ClassVar[str] = "turn_finished"
    status: str
    error: str | None = None
    final_output: str | None = None
    usage: dict[str, int] = field(default_factory=dict)
