"""What a model step carries from its preparation to its reply (``worker.turn.model_step`` builds
these, ``worker.turn.replies`` reads them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from worker.model.interface import ModelRequest
from worker.tooling.contract import WorkerTool
from worker.turn.context import TurnContext
from worker.turn.dispatch import Plan
from worker.turn.guard import Writes
from worker.turn.request import TurnRequest
from worker.turn.state import TurnState


@dataclass
class PreparedStep:
    """A model step that passed its checks: what ``ModelStep.prepare`` read and built.

    ``memo`` is the step's stored reply (JSON) when it already has one; otherwise ``owner`` holds
    the step's model-call claim for ``lease`` seconds and ``model_request`` is the call to make.
    """

    turn_id: str
    step: int
    state: TurnState
    request: TurnRequest
    context: TurnContext
    tools: list[WorkerTool[Any]]
    history: list[dict[str, Any]]
    lease: float
    model: str
    owner: str = ""
    memo: dict[str, Any] | None = None
    model_request: ModelRequest | None = None
    # The background response a former attempt of the step started (``worker.model.background``).
    response_id: str | None = None


@dataclass(frozen=True)
class ToolsPlan:
    """A reply's function calls, validated and planned (``ReplyHandler.plan_tools``): the
    ``plan``, the invalid-call counts after it, and ``writes``, the guarded move of the step to
    its tools phase (``TurnStore.begin_tools_writes``: the reply's items, the plan, the approval
    requests, a ``call_planned`` event per call); ``runs_calls``: the plan has batches and no tool's
    invalid-call budget is spent (``BatchCompletion.over_budget``), else the step closes at once."""

    plan: Plan
    invalid_counts: dict[str, int]
    writes: Writes
    runs_calls: bool


@dataclass(frozen=True)
class StoredReply:
    """A step's reply as stored (``ModelReply.to_json``); ``cancelled``: the cancel flag, read with
    the store write; ``recorded``: ``(usage stored, the turn's usage totals)`` when the usage record
    was written with the reply (None for a memoized reply: the handler records it); ``began``: the
    plan whose move to the tools phase was written with the reply (``ReplyHandler.plan_tools``)."""

    reply: dict[str, Any]
    cancelled: bool = False
    recorded: tuple[bool, dict[str, int]] | None = None
    began: ToolsPlan | None = None
