"""What the turn loop needs from the layer that drives it (a ``Dispatcher``), and how it names its
work for monitors.

``tasks.dispatcher.CeleryDispatcher`` implements ``Dispatcher`` with Celery groups and chains;
``worker/`` itself never imports Celery.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from worker.tooling.contract import ToolServices, WorkerTool
from worker.turn.context import TurnContext
from worker.turn.dispatch import Batch, PlannedCall
from worker.turn.request import TurnRequest


class Dispatcher(Protocol):
    """How the turn loop hands work to the queue layer."""

    def enqueue_step(self, turn_id: str, step: int, *, queue: str, label: str = "") -> None:
        """Run model step ``step`` of the turn later, on ``queue``. ``label`` describes it for
        monitors (``step_label``)."""

    def dispatch_batch(
        self,
        turn_id: str,
        step: int,
        batch_index: int,
        batch: Batch,
        *,
        queue: str,
        labels: dict[str, str] | None = None,
    ) -> None:
        """Run the batch's calls: together (``parallel``) or one after another (``sequential``).
        ``labels`` describes each call by ``call_id`` for monitors (``call_labels``)."""

    def services(self, request: TurnRequest) -> ToolServices:
        """The queue layer's services for the turn's tools (e.g. schedule entries); the turn loop
        adds its own (Redis, settings, ``enqueue_turn``, ``cancel_turn``)."""

    def turn_finished(self, turn_id: str) -> None:
        """The turn ended and has end hooks (``worker.turn.request.END_HOOK_METADATA``): run them."""


Toolset = Callable[[TurnContext], list[WorkerTool[Any]]]


def step_label(agent_id: str, turn_id: str, step: int) -> str:
    """How a model step shows in a monitor (Flower's args column): ``agent=.. turn=.. step=..``."""
    return f"agent={agent_id} turn={turn_id} step={step}"


def call_labels(agent_id: str, turn_id: str, step: int, calls: list[PlannedCall]) -> dict[str, str]:
    """How each tool call shows in a monitor, by ``call_id``: ``<tool> agent=.. turn=.. step=.. call=..``."""
    return {c.call_id: f"{c.name} agent={agent_id} turn={turn_id} step={step} call={c.call_id}" for c in calls}


def no_toolsets(name: str) -> Toolset:
    """The resolver of an engine that runs no tools (a control plane's): raises ``LookupError``."""
    raise LookupError(f"this engine runs no tools (toolset {name!r})")
