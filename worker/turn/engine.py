"""The turn loop's front: ``TurnEngine`` builds the parts and gives the Celery edge, the control
plane and tests one object to call.

The loop runs as steps over state kept in Redis: ``run_step(turn_id, n)`` calls the model once
(memoized per step), validates every function call, records the plan and sends the first batch;
``run_call(turn_id, n, call_id)`` runs one tool call and stores its result, and whoever completes a
batch (the Redis barrier) sends the next batch or, after the last, records the outputs in emitted
order and enqueues step ``n + 1``. Nothing ever waits on another task, so one solo worker serving
every queue finishes a turn.

Each concept has its own module, composed here through constructors (docs/architecture.md,
"Module map"): the runtime (``runtime``), starting a turn (``intake``), the model step
(``model_step``, then ``replies``), the call runner (``call_runner``), the batch completion
(``completion``), the approval gate (``gate``), the end of a turn (``ending``) and the re-drive
(``redrive``). This module has no logic of its own and no Celery import: the ``Dispatcher`` given
to the engine turns "send this" into Celery messages.
"""

from __future__ import annotations

from typing import Any, Callable

from redis import Redis

from worker.model.interface import ModelClient
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, WorkerTool
from worker.turn.async_calls import AsyncModelCalls, AsyncSetup
from worker.turn.call_runner import CallRunner
from worker.turn.completion import BatchCompletion
from worker.turn.context import TurnContext
from worker.turn.ending import TurnEnd
from worker.turn.gate import ApprovalGate
from worker.turn.intake import TurnIntake
from worker.turn.interfaces import Computers, Dispatcher, Toolset, no_toolsets
from worker.turn.model_step import ModelStep
from worker.turn.outcome import StepOutcome
from worker.turn.redrive import Redrive
from worker.turn.replies import ReplyHandler
from worker.turn.request import Skill, TurnRequest, TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import TurnState
from worker.turn.store import TurnStore
from worker.turn.toolbox import Toolbox


class TurnEngine:
    """Runs turn steps and tool calls against a ``TurnStore``.

    ``redis``: the store's Redis client, for what is not a turn's state (the nodes' liveness
    records, the tools' ``ToolServices.redis``, the records of jobs, schedules and workflows):
    ``engine.redis``. ``resolve_toolset(name)`` returns the category assembly for a turn's ``toolset``; ``client`` is
    the model client (one per process); ``project_skills`` projects enabled skills into the
    instructions. A control plane passes neither toolsets nor a client: it only starts, cancels
    and decides on turns. ``async_calls``: make model calls on the process's event loop
    (``worker.turn.async_calls``) instead of the calling thread. ``count_ends=False`` (a control
    plane, which serves no metrics): the turns it ends are counted by a worker (``TurnEnd``).
    """

    def __init__(
        self,
        store: TurnStore,
        settings: Settings,
        dispatcher: Dispatcher,
        resolve_toolset: Callable[[str], Toolset] | None = None,
        client: ModelClient | None = None,
        project_skills: Callable[[tuple[Skill, ...]], str] | None = None,
        computers: Computers | None = None,
        async_calls: AsyncSetup | None = None,
        *,
        redis: Redis,
        count_ends: bool = True,
    ):
        self.runtime = runtime = TurnRuntime.build(redis, store, dispatcher, settings)
        self.store, self.settings, self.dispatcher, self.client = store, settings, dispatcher, client
        self.redis = redis
        self.liveness, self.usage = runtime.liveness, runtime.usage
        self.end = TurnEnd(runtime, count_here=count_ends)
        self.intake = TurnIntake(runtime)
        self.approvals = ApprovalGate(runtime)
        self.toolbox = Toolbox(
            runtime,
            resolve_toolset or no_toolsets,
            project_skills,
            enqueue_turn=self.intake.enqueue,
            cancel_turn=self.end.cancel,
        )
        self.completion = BatchCompletion(runtime, self.approvals, self.end)
        replies = ReplyHandler(runtime, self.approvals, self.completion, self.end)
        self.model_calls = AsyncModelCalls(runtime, self.end, async_calls) if async_calls is not None else None
        self.model_step = ModelStep(runtime, self.toolbox, client, replies, self.end, self.model_calls)
        # ``computers``: the node side of placement (``worker.placement.homes``); None runs computer calls anywhere.
        self.calls = CallRunner(runtime, self.toolbox, self.approvals, self.completion, computers)
        self.redriver = Redrive(runtime, self.approvals, self.completion, self.end)

    # ----- starting and ending turns ----------------------------------------
    def create_turn(self, request: TurnRequest, turn_id: str) -> tuple[str, bool]:
        """Store a new turn and enqueue its first step: ``TurnIntake.create``."""
        return self.intake.create(request, turn_id)

    def enqueue_turn(self, request: dict[str, Any] | TurnRequest, turn_id: str | None = None) -> str:
        """Validate ``request`` and start a turn; its id: ``TurnIntake.enqueue``."""
        return self.intake.enqueue(request, turn_id)

    def cancel(self, turn_id: str) -> bool:
        """Ask a turn to stop: ``TurnEnd.cancel``. False when unknown or already ended."""
        return self.end.cancel(turn_id)

    def fail_turn(self, turn_id: str, status: TurnStatus, error: str) -> bool:
        """End a non-terminal turn whatever its step (cancel, gateway failure, watchdog). False if already ended."""
        return self.end.fail(turn_id, status, error) is not None

    # ----- running them --------------------------------------------------------
    def run_step(self, turn_id: str, step: int) -> StepOutcome:
        """Run model step ``step`` of the turn: ``ModelStep.run``. Raises ``GatewayError`` (retryable)."""
        return self.model_step.run(turn_id, step)

    def run_call(
        self, turn_id: str, step: int, call_id: str, deferrals: int = 0, started: str | None = None
    ) -> StepOutcome:
        """Run one planned tool call: ``CallRunner.run`` (``deferrals``, ``started``: see there)."""
        return self.calls.run(turn_id, step, call_id, deferrals, started)

    def redrive(self, turn_id: str, max_redrives: int, reason: str = "no progress") -> StepOutcome:
        """Re-drive a turn that stopped making progress: ``Redrive.run``."""
        return self.redriver.run(turn_id, max_redrives, reason)

    # ----- a turn's tools ------------------------------------------------------
    def context(self, state: TurnState, request: TurnRequest, abort: AbortSignal | None = None) -> TurnContext:
        """The ``TurnContext`` given to category creators: ``Toolbox.context``."""
        return self.toolbox.context(state, request, abort)

    def tools_for(self, ctx: TurnContext, request: TurnRequest) -> list[WorkerTool[Any]]:
        """The turn's tool set: ``Toolbox.tools``."""
        return self.toolbox.tools(ctx, request)

    def instructions_for(self, ctx: TurnContext, request: TurnRequest) -> str | None:
        """The request's instructions with the enabled skills: ``Toolbox.instructions``."""
        return self.toolbox.instructions(ctx, request)
