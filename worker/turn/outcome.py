"""What a model step, a tool call or a re-drive did: its ``StepOutcome``, returned to the caller.

When the turn ended during that work, here, the outcome says how (``Ended``: status and error),
so the Celery edge (``tasks.turns``) reports a failed turn as a failed task from the return value
alone (docs/architecture.md, "A step's outcome").
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.turn.request import TurnStatus


@dataclass(frozen=True)
class Ended:
    """The turn ended here: its terminal ``status`` and ``error`` (None for a clean end)."""

    status: TurnStatus
    error: str | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What a step, call or re-drive did, for the task's result, logs and tests.

    ``action``: ``dropped`` (stale, duplicate or fenced out), ``dispatched``, ``parked``, ``ran``,
    ``advanced``, ``redriven``, ``repair_instruction``, ``cancelled``, ``ended``, ``failed``, or the
    status a model step ended the turn with (``completed``, ``incomplete``); ``detail``: a short
    reason; ``ended``: set when this very work ended the turn.
    """

    action: str
    detail: str = ""
    ended: Ended | None = None

    @property
    def failed_turn(self) -> bool:
        """True when this work ended the turn with a failure status (``TurnStatus.failure``)."""
        return self.ended is not None and self.ended.status.failure
