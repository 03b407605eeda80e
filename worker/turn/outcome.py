"""What a model step, a tool call or a re-drive did: its ``StepOutcome``, returned to the caller.

When the turn ended during that work, here, the outcome says how (``Ended``: status and error),
so the Celery edge (``tasks.turns``) reports a failed turn as a failed task from the return value
alone (docs/architecture.md, "A step's outcome").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worker.turn.request import TurnStatus

Action = Literal[
    "dropped",
    "waiting",
    "dispatched",
    "parked",
    "repair_instruction",
    "completed",
    "incomplete",
    "ended",
    "cancelled",
    "forwarded",
    "deferred",
    "ran",
    "advanced",
    "redriven",
    "failed",
]
"""What the work did, one of:

- ``dropped``: nothing (a stale, duplicate or fenced-out message; the claim is another's; an
  unknown turn or call; a call still awaiting approval);
- a model step (``ModelStep``, ``ReplyHandler``): ``waiting`` (its call was handed to the event
  loop: ``worker.turn.async_calls``), ``dispatched`` (the reply's calls were planned and the first
  batch sent), ``parked`` (the first batch waits for approvals), ``repair_instruction`` (prose
  without the finish tool: an instruction and the next step), ``completed`` or ``incomplete``
  (the reply ended the turn with that status), ``ended`` (a cap, a budget, a refused request, a
  second miss of the finish tool), ``cancelled`` (the cancel flag was seen);
- a tool call (``CallRunner``): ``forwarded`` (the agent's home is on another node: ``detail`` is
  that node's queue, where the Celery edge sends the message), ``deferred`` (a destructive call
  whose claim no Redis replica acknowledged in time: not run, to be sent again later;
  docs/failover.md), ``ran`` (its result is stored, the batch goes on), ``advanced`` (its result
  closed the batch: the next batch, step or end);
- a re-drive (``Redrive``, ``ApprovalGate.redrive_parked``): ``redriven`` (work re-sent),
  ``parked`` (it waits for a person: left alone), ``failed`` (too many re-drives: the turn failed).

``tasks.turns`` matches every value (``typing.assert_never``): a new one is a type error there
until the Celery edge says what it does with it.
"""


@dataclass(frozen=True)
class Ended:
    """The turn ended here: its terminal ``status`` and ``error`` (None for a clean end)."""

    status: TurnStatus
    error: str | None = None


@dataclass(frozen=True)
class StepOutcome:
    """What a step, call or re-drive did, for the task's result, logs and tests.

    ``action``: see ``Action``; ``detail``: a short reason (for ``forwarded``, the queue to send the
    call to); ``ended``: set when this very work ended the turn, whatever the action (a call that
    closed the last batch, a re-drive that closed it, a model step).
    """

    action: Action
    detail: str = ""
    ended: Ended | None = None
