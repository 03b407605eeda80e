"""What the engine needs from the layer that drives it (a ``Dispatcher``), and what it reports back.

``tasks.dispatcher.CeleryDispatcher`` implements ``Dispatcher`` with Celery groups and chains;
``worker/`` itself never imports Celery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from worker.tooling.contract import WorkerTool
from worker.turn.context import TurnContext
from worker.turn.dispatch import Batch
from worker.turn.request import TurnRequest


class Dispatcher(Protocol):
    """How the engine hands work to the queue layer."""

    def enqueue_step(self, turn_id: str, step: int, *, queue: str) -> None:
        """Run model step ``step`` of the turn later, on ``queue``."""

    def dispatch_batch(self, turn_id: str, step: int, batch_index: int, batch: Batch, *, queue: str) -> None:
        """Run the batch's calls: together (``parallel``) or one after another (``sequential``)."""

    def services(self, request: TurnRequest) -> dict[str, Callable[..., Any]]:
        """Turn-scoped callables for tool creators (e.g. ``enqueue_turn``)."""

    def turn_finished(self, turn_id: str) -> None:
        """Run the control-plane hooks of a turn that just ended."""


Toolset = Callable[[TurnContext], list[WorkerTool]]


def no_toolsets(name: str) -> Toolset:
    """The resolver of an engine that runs no tools (a control plane's): raises ``LookupError``."""
    raise LookupError(f"this engine runs no tools (toolset {name!r})")


@dataclass
class StepOutcome:
    """What a step or call did, for logs and tests: ``action`` plus a short detail."""

    action: str
    detail: str = ""
