"""What a model step carries from its preparation to its reply (``worker.turn.model_step`` builds
these, ``worker.turn.replies`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from worker.model.interface import ModelRequest
from worker.tooling.contract import WorkerTool
from worker.turn.context import TurnContext
from worker.turn.dispatch import Plan
from worker.turn.guard import Writes
from worker.turn.outcome import Action
from worker.turn.request import TurnRequest, TurnStatus
from worker.turn.state import TurnState

# The step's context and tool set (``Toolbox.context``, ``Toolbox.tools``).
Toolkit = tuple[TurnContext, list[WorkerTool[Any]]]


@dataclass
class PreparedStep:
    """A model step that passed its checks: what ``ModelStep.prepare`` read and built.

    ``memo`` is the step's stored reply (JSON) when it already has one; otherwise ``owner`` holds
    the step's model-call claim for ``lease`` seconds and ``model_request`` is the call to make.

    ``context`` and ``tools`` are built by ``toolkit`` on first use and kept; ``shed_tools`` drops
    them (a model call in flight does not hold them: thirteen tools with their closures were half
    of what a waiting call held), and the next use builds them again, the same for the same state.
    """

    turn_id: str
    step: int
    state: TurnState
    request: TurnRequest
    toolkit: Callable[[], Toolkit]
    history: list[dict[str, Any]]
    lease: float
    model: str
    owner: str = ""
    memo: dict[str, Any] | None = None
    model_request: ModelRequest | None = None
    # The background response a former attempt of the step started (``worker.model.background``).
    response_id: str | None = None
    # The usage records of the turn's earlier steps as read with the step (a layout-2 turn's hash
    # fields; ``StepView.usage_rows``): the totals a final reply that ends the turn in its own
    # script writes in its ``turn_finished`` event.
    usage_rows: list[bytes] = field(default_factory=list)
    built: Toolkit | None = field(default=None, repr=False)

    @property
    def context(self) -> TurnContext:
        """The step's ``TurnContext`` (built on first use)."""
        return self._kit()[0]

    @property
    def tools(self) -> list[WorkerTool[Any]]:
        """The step's tool set (built on first use)."""
        return self._kit()[1]

    def _kit(self) -> Toolkit:
        if self.built is None:
            self.built = self.toolkit()
        return self.built

    def shed_tools(self) -> None:
        """Drop the built context and tools; the next use of either builds them again."""
        self.built = None


@dataclass(frozen=True)
class ToolsPlan:
    """A reply's function calls, validated and planned (``ReplyHandler.plan_move``): the
    ``plan``, the invalid-call counts after it, and ``writes``, the guarded move of the step to
    its tools phase (``Moves.begin_tools_writes``: the reply's items, the plan, the approval
    requests, a ``call_planned`` event per call); ``runs_calls``: the plan has batches and no tool's
    invalid-call budget is spent (``BatchCompletion.over_budget``), else the step closes at once."""

    plan: Plan
    invalid_counts: dict[str, int]
    writes: Writes
    runs_calls: bool


@dataclass(frozen=True)
class EndPlan:
    """A final reply's end of the turn, planned before the reply is stored
    (``ReplyHandler.plan_move``, a layout-2 turn): ``writes`` (``Moves.end_writes`` with the
    ``turn_finished`` event), which ``ReplyMemo.save_and_check`` applies with the reply; the
    step's ``action`` and the turn's ``status``, ``error``, ``final_output`` and usage ``totals``."""

    writes: Writes
    action: Action
    status: TurnStatus
    error: str | None
    final_output: str
    totals: dict[str, int]


@dataclass(frozen=True)
class StoredReply:
    """A step's reply as stored (``ModelReply.to_json``); ``cancelled``: the cancel flag, read with
    the store write; ``recorded``: ``(usage stored, the turn's usage totals)`` when the usage record
    was written with the reply (None for a memoized reply: the handler records it); ``began``: the
    plan whose move to the tools phase was written with the reply (``ReplyHandler.plan_move``)."""

    reply: dict[str, Any]
    cancelled: bool = False
    recorded: tuple[bool, dict[str, int]] | None = None
    began: ToolsPlan | None = None
    # The turn's end, written with the reply (``EndPlan``); ``hooks``: the ended turn has end hooks.
    ended: EndPlan | None = None
    hooks: bool = False
