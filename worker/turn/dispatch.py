"""The dispatch plan of one model response: which calls run together.

Rule (DESIGN-NOTES section 2, same as Pydantic AI's ``sequential=True``):
consecutive parallel-mode calls form one batch that runs concurrently (a
Celery group); a sequential-mode call is a barrier: earlier calls finish, it
runs alone, later calls wait for it. Consecutive sequential calls form one
batch that runs one after another (a Celery chain). Calls whose output is
already known (validation failure, unknown tool) are not dispatched.
Outputs are always recorded in the order the model emitted the calls.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal


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
    mode: Literal["parallel", "sequential"] = "parallel"
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
    def from_json(cls, data: dict[str, Any]) -> "PlannedCall":
        """Inverse of ``to_json``."""
        return cls(**data)


@dataclass
class Batch:
    """Calls dispatched together: ``parallel`` (a group) or ``sequential`` (a chain, in order)."""

    mode: Literal["parallel", "sequential"]
    call_ids: list[str]


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
