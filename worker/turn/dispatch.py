"""The dispatch plan of one model response: which calls run together (``Plan``).

Rule (docs/architecture.md, "Batches"; the same as Pydantic AI's ``sequential=True``):
consecutive parallel-mode calls form one batch that runs concurrently (a
Celery group); a sequential-mode call is a barrier: earlier calls finish, it
runs alone, later calls wait for it. Consecutive sequential calls form one
batch that runs one after another (a Celery chain). Calls whose output is
already known (validation failure, unknown tool) are not dispatched.
Outputs are always recorded in the order the model emitted the calls.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NamedTuple

import orjson

Mode = Literal["parallel", "sequential"]


@dataclass
class PlannedCall:
    """One ``function_call`` of the response, after validation.

    ``data`` holds the validated params (JSON form) for a call that will run;
    ``output`` holds the pre-resolved output text for one that will not
    (invalid arguments, unknown tool). ``index`` is the emitted position.
    """

    call_id: str
    name: str
    index: int
    mode: Mode = "parallel"
    data: dict[str, Any] | None = None
    output: str | None = None
    activity: str = ""
    repairs: list[str] = field(default_factory=list)
    destructive: bool = False
    error_kind: str | None = None
    # A person must approve the call before it runs (``worker.turn.approvals``).
    needs_approval: bool = False
    # The tool needs the agent's computer: the call runs on the node holding the home (placement).
    computer: bool = False

    @property
    def runnable(self) -> bool:
        """True when the call will run (its output is not already known)."""
        return self.output is None

    def to_json(self) -> dict[str, Any]:
        """JSON form for the plan stored in Redis."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlannedCall:
        """Inverse of ``to_json``."""
        return cls(**data)


@dataclass
class Batch:
    """Calls dispatched together: ``parallel`` (a group) or ``sequential`` (a chain, in order)."""

    mode: Mode
    call_ids: list[str]


class Plan(NamedTuple):
    """A step's dispatch plan, stored in ``turn:{id}:plan:{n}`` when the step moves to its tools:
    every call of the reply (``calls``, runnable or not, emitted order) and the ``batches`` the
    runnable ones are sent in. Unpacks as ``calls, batches = plan``."""

    calls: list[PlannedCall]
    batches: list[Batch]

    def call(self, call_id: str) -> PlannedCall | None:
        """The planned call ``call_id``, or None."""
        return next((c for c in self.calls if c.call_id == call_id), None)

    def batch_of(self, call_id: str) -> int | None:
        """The index of the batch that runs ``call_id``, or None (a call that does not run)."""
        return next((i for i, b in enumerate(self.batches) if call_id in b.call_ids), None)

    def started_at_once(self) -> dict[str, str]:
        """The calls a tool-call task may claim with its first read (``Claims.begin_call``): no
        approval, no computer (those are claimed once admitted: ``worker.turn.call_runner``).
        ``call_id`` -> the end of its ``call_started`` event (``started_rest``), prefixed with ``!``
        for a destructive call, which the call's message carries (the dispatcher's ``started``):
        no command writes or reads it. A call absent is claimed the long way; so is a ``!`` call by
        a worker whose destructive claims must reach a replica first (``TurnStore.call_view``:
        the receiver decides, whatever the sender's settings)."""

        def at_once(c: PlannedCall) -> bool:
            return c.runnable and not c.needs_approval and not c.computer

        # A call_id that any planned call not claimable at once shares is not either: the runner
        # reads the first planned call of an id (Plan.call), which may be gated.
        gated = {c.call_id for c in self.calls if not at_once(c)}
        return {
            c.call_id: ("!" if c.destructive else "") + started_rest(c.name, c.activity)
            for c in self.calls
            if at_once(c) and c.call_id not in gated
        }

    def batch_indexes(self) -> dict[str, int]:
        """``call_id`` -> the index of the batch that runs it, for every call that runs."""
        return {cid: i for i, b in enumerate(self.batches) for cid in b.call_ids}

    def to_json(self) -> dict[str, Any]:
        """JSON form (what the store keeps)."""
        return {
            "calls": [c.to_json() for c in self.calls],
            "batches": [{"mode": b.mode, "call_ids": b.call_ids} for b in self.batches],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Plan:
        """Inverse of ``to_json``."""
        return cls(
            [PlannedCall.from_json(c) for c in data["calls"]],
            [Batch(b["mode"], b["call_ids"]) for b in data["batches"]],
        )


def started_rest(name: str, activity: str) -> str:
    """The end of a call's ``call_started`` event after its ``call_id`` (``,"name":...,
    "activity":...}``), as the call's message carries it (``Plan.started_at_once``)."""
    return "," + orjson.dumps({"name": name, "activity": activity})[1:].decode()


def plan_batches(calls: list[PlannedCall]) -> list[Batch]:
    """Split runnable calls into batches, keeping emitted order.

    >>> [b.mode for b in plan_batches([PlannedCall("a", "r", 0), PlannedCall("b", "r", 1),
    ...     PlannedCall("c", "w", 2, mode="sequential"), PlannedCall("d", "r", 3)])]
    ['parallel', 'sequential', 'parallel']
    """
    batches: list[Batch] = []
    for call in calls:
        if not call.runnable:
            continue
        if batches and batches[-1].mode == call.mode:
            batches[-1].call_ids.append(call.call_id)
        else:
            batches.append(Batch(call.mode, [call.call_id]))
    return batches
