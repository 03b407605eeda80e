"""A turn's state as read from Redis (``TurnState``, the views a step or a call reads, a call's
``CallResult``), the JSON of its events, and the fencing error.

The keys are named and listed in ``worker.turn.keys``; ``worker.turn.store`` owns every
read and write of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from worker.turn.dispatch import Plan
from worker.turn.request import TurnRequest, TurnStatus, stored_request

# Events kept per turn (a Redis Stream, trimmed approximately), and how long an ended turn's keys live.
EVENTS_MAXLEN = 10_000
RETENTION_SECONDS = 7 * 24 * 3600


@dataclass
class CallResult:
    """The result of one tool call, stored as JSON in ``turn:{id}:results:{n}`` under its
    ``call_id`` (first write wins), and read back to build its ``function_call_output``.

    - ``output``: the text the model reads (already capped to ``max_output_chars``);
    - ``is_error``; ``details``: JSON for logs and transcripts (``error`` names the kind of
      failure: ``exception``, ``interrupted``, ``outcome_unknown``, ``rejected``,
      ``invalid_arguments``...; ``repairs``, ``output_cut_chars``, ``loaded`` tool names...);
    - ``terminate``: the turn ends after this step's batch (``ToolResult.terminate``);
    - ``presentation_events``: ``[{"kind", "data"}]`` for the reply surface;
    - ``activity``: the label after completion (None: the planned call's);
    - ``ms``: how long the tool ran (None when nothing ran).
    """

    output: str
    is_error: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    terminate: bool = False
    presentation_events: list[dict[str, Any]] = field(default_factory=list)
    activity: str | None = None
    ms: float | None = None

    @classmethod
    def error(cls, output: str, kind: str, /, **details: Any) -> CallResult:
        """An error result whose ``details.error`` is ``kind`` (plus ``details``)."""
        return cls(output=output, is_error=True, details={"error": kind, **details})

    def to_json(self) -> dict[str, Any]:
        """JSON form (what the results hash stores)."""
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CallResult:
        """Inverse of ``to_json``; tolerant of results stored before a field existed."""
        return cls(
            output=str(data.get("output", "")),
            is_error=bool(data.get("is_error", False)),
            details=dict(data.get("details") or {}),
            terminate=bool(data.get("terminate", False)),
            presentation_events=list(data.get("presentation_events") or []),
            activity=data.get("activity"),
            ms=data.get("ms"),
        )


def parse_results(raw: dict[bytes, bytes]) -> dict[str, CallResult]:
    """A results hash as Redis returns it (``call_id`` -> JSON), parsed."""
    return {k.decode(): CallResult.from_json(orjson.loads(v)) for k, v in raw.items()}


def hash_pairs(flat: list[bytes]) -> dict[bytes, bytes]:
    """A hash as a Lua script returns ``HGETALL`` (field, value, field, value...), as a dict."""
    return dict(zip(flat[0::2], flat[1::2], strict=True))


@dataclass
class CallClaim:
    """What reading a call's view did about its claim (``Claims.begin_call``): ``tried`` is False
    when the call could not be claimed at once (it awaits an approval or needs the agent's
    computer, it has a result, the turn moved on); else ``won``, or the claim that holds it
    (``existing``: ``{"owner", "lease_until"}``)."""

    tried: bool = False
    won: bool = False
    existing: dict[str, Any] | None = None


@dataclass
class CallView:
    """What a tool-call task reads before running, fetched in one round trip with the call's
    claim when it can be taken at once (``claim``)."""

    state: TurnState | None
    plan: Plan | None
    has_result: bool
    cancelled: bool
    claim: CallClaim = field(default_factory=CallClaim)


@dataclass
class AdvanceView:
    """What closing a batch reads (``worker.turn.completion``): the state, the cancel flag and the
    step's results by ``call_id``; returned by the barrier to its winner, or read in one round trip."""

    state: TurnState | None
    cancelled: bool
    results: dict[str, CallResult]


@dataclass
class StepClaim:
    """What ``Claims.begin_step`` did about the step's model call: ``tried`` is False when there
    was nothing to claim (a memo, a cancel flag, a stale or ended turn); else ``holder`` is None
    when the claim was won (``started``: the turn was moved to running) or the owner holding it."""

    tried: bool = False
    holder: str | None = None
    started: bool = False


@dataclass
class StepView:
    """What a model step reads before running, fetched in one round trip: the state, the
    history, the memoized reply of the step (or None), the cancel flag and, from
    ``Claims.begin_step``, the model-call claim."""

    state: TurnState | None
    items: list[dict[str, Any]]
    reply: dict[str, Any] | None
    cancelled: bool
    claim: StepClaim = field(default_factory=StepClaim)
    response_id: str | None = None  # a background response a former attempt started
    # The usage records of the turn's steps so far, as stored (a layout-2 turn's hash fields).
    usage_rows: list[bytes] = field(default_factory=list)


def event_json(kind: str, data: dict[str, Any]) -> bytes:
    """An event of the turn's stream as stored: ``{"kind", "at" (epoch seconds), **data}``."""
    return orjson.dumps({"kind": kind, "at": round(time.time(), 3), **data})


@dataclass
class TurnState:
    """A snapshot of ``turn:{id}``."""

    turn_id: str
    status: TurnStatus
    step: int
    phase: str
    model_calls: int
    request: dict[str, Any]
    agent_id: str
    final_output: str | None = None
    error: str | None = None
    terminate: bool = False
    finish_misses: int = 0
    # Replies a model server refused to return (its parser failed on the model's output):
    # worker.turn.unread_output.
    unread_replies: int = 0
    invalid_counts: dict[str, int] = field(default_factory=dict)
    loaded_tools: list[str] = field(default_factory=list)
    created_at: float = 0.0
    updated_at: float = 0.0
    redrives: int = 0
    traceparent: str | None = None
    # The progress deadline the last transition set (epoch s; 0: none stored), ``keys``' ``deadline``.
    deadline: float = 0.0
    # The turn's key layout (``keys.LAYOUT``), set at its creation: 1 for a turn created before the
    # layout mark (its step keys as they were), 2 for one whose memo and usage are hash fields.
    layout: int = 1
    # ``request`` as stored (JSON bytes), when read from the hash: ``turn_request`` parses it once
    # per process.
    request_raw: bytes | None = field(default=None, repr=False, compare=False)

    def turn_request(self) -> TurnRequest:
        """``request`` as a validated ``TurnRequest`` (``worker.turn.request.stored_request`` when
        read from the hash). Raises pydantic's ``ValidationError`` for a request that no longer
        validates."""
        if self.request_raw is not None:
            return stored_request(self.request_raw)
        return TurnRequest.model_validate(self.request)

    @classmethod
    def from_hash(cls, turn_id: str, h: dict[bytes, bytes]) -> TurnState:
        """Parse the ``turn:{id}`` hash (bytes keys and values)."""

        # Read once per model step (a profile's 5% of the steps worker): bytes keys and one
        # ``h.get`` each, no per-field closure or key encoding.
        get = h.get
        raw_request = get(b"request", b"{}")
        final_output, error, traceparent = get(b"final_output"), get(b"error"), get(b"traceparent")
        return cls(
            turn_id=turn_id,
            status=TurnStatus(get(b"status", b"queued").decode()),
            step=int(get(b"step", b"0")),
            phase=get(b"phase", b"model").decode(),
            model_calls=int(get(b"model_calls", b"0")),
            request=orjson.loads(raw_request),
            agent_id=get(b"agent_id", b"agent").decode(),
            final_output=None if final_output is None else final_output.decode(),
            error=None if error is None else error.decode(),
            terminate=get(b"terminate", b"0") == b"1",
            finish_misses=int(get(b"finish_misses", b"0")),
            unread_replies=int(get(b"unread_replies", b"0")),
            invalid_counts=orjson.loads(get(b"invalid_counts", b"{}")),
            loaded_tools=orjson.loads(get(b"loaded_tools", b"[]")),
            created_at=float(get(b"created_at", b"0")),
            updated_at=float(get(b"updated_at", b"0")),
            redrives=int(get(b"redrives", b"0")),
            traceparent=None if traceparent is None else traceparent.decode(),
            deadline=float(get(b"deadline", b"0")),
            layout=int(get(b"layout", b"1")),
            request_raw=raw_request,
        )


class StaleStep(Exception):
    """The transition's guard failed: the turn is no longer at that step/phase (a duplicate or late message)."""
