"""What the turn loop needs from the layer that drives it (a ``Dispatcher``), and how it names its
work for monitors.

``tasks.dispatcher.CeleryDispatcher`` implements ``Dispatcher`` with Celery groups and chains;
``worker/`` itself never imports Celery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

from worker.tooling.contract import ToolServices, WorkerTool
from worker.turn.context import TurnContext
from worker.turn.dispatch import Batch, PlannedCall
from worker.turn.guard import MessageCommands
from worker.turn.request import TurnRequest


class Dispatcher(Protocol):
    """How the turn loop hands work to the queue layer."""

    def enqueue_step(self, turn_id: str, step: int, *, queue: str, label: str = "") -> None:
        """Run model step ``step`` of the turn later, on ``queue``. ``label`` describes it for
        monitors (``step_label``)."""

    def step_message(self, turn_id: str, step: int, *, queue: str, label: str = "") -> MessageCommands | None:
        """``enqueue_step``'s message as the Redis commands that would send it, not sent:
        ``("LPUSH", queue list, payload)`` and ``("PUBLISH", channel, payload)`` (its monitoring
        event), for a transition that sends it in its own script, with the state change that
        decided it (``Writes.send_message``). None when the message cannot go that way (the queue
        layer's broker is not the turn store's Redis): the caller sends it with ``enqueue_step``."""

    def batch_message(
        self,
        turn_id: str,
        step: int,
        batch: Batch,
        *,
        queue: str,
        labels: dict[str, str] | None = None,
        started: Mapping[str, str] | None = None,
    ) -> MessageCommands | None:
        """``dispatch_batch``'s messages for a batch without computer calls, as ``step_message``
        gives its one: the Redis commands that would send them, not sent, or None (the caller
        sends them with ``dispatch_batch``)."""

    def dispatch_batch(
        self,
        turn_id: str,
        step: int,
        batch_index: int,
        batch: Batch,
        *,
        queue: str,
        labels: dict[str, str] | None = None,
        computer: ComputerCalls | None = None,
        started: Mapping[str, str] | None = None,
    ) -> None:
        """Run the batch's calls: together (``parallel``) or one after another (``sequential``).
        ``labels`` describes each call by ``call_id`` for monitors (``call_labels``); the calls
        named in ``computer`` go to the queue of the node holding the agent's home instead of
        ``queue`` (``docs/placement.md``). ``started`` (``Plan.started_at_once``): each call's
        message carries its entry (``""`` for a call absent), which its task gives
        ``TurnEngine.run_call``; None: the messages carry nothing."""

    def services(self, request: TurnRequest) -> ToolServices:
        """The queue layer's services for the turn's tools (e.g. schedule entries); the turn loop
        adds its own (Redis, settings, ``enqueue_turn``, ``cancel_turn``)."""

    def turn_finished(self, turn_id: str) -> None:
        """The turn ended and has end hooks (``worker.turn.request.END_HOOK_METADATA``): run them."""

    def count_ended(self, turn_id: str) -> None:
        """The turn was ended by a process that serves no metrics (a control plane): have a worker
        count its end (``worker.turn.metrics.turn_ended``)."""


Toolset = Callable[[TurnContext], list[WorkerTool[Any]]]


@dataclass(frozen=True)
class ComputerCalls:
    """The calls of a batch that need the agent's computer (``WorkerTool.needs_computer``), and
    the agent: the dispatcher routes them to the node holding its home."""

    agent_id: str
    call_ids: frozenset[str]


def computer_calls(agent_id: str, calls: list[PlannedCall]) -> ComputerCalls | None:
    """``ComputerCalls`` of a step's planned calls (None when none needs a computer)."""
    ids = frozenset(c.call_id for c in calls if c.computer)
    return ComputerCalls(agent_id, ids) if ids else None


def _nothing() -> None:
    return None


@dataclass
class HomeAdmission:
    """What the node that received a computer call may do with it (``Computers.admit``).

    - ``forward_to``: another node holds the agent's home: nothing runs here, the call goes to
      that queue;
    - ``error``: the call cannot run now (no node can take the home, its snapshot could not be
      read): this text is the call's output, the home is untouched;
    - ``notice``: the home was just moved here or reset: the model is told, before this call's output;
    - ``release``: called once the call ended (the home may then be snapshotted or moved).
    """

    forward_to: str | None = None
    error: str | None = None
    notice: str | None = None
    release: Callable[[], None] = field(default=_nothing)


class Computers(Protocol):
    """The node side of placement, as the turn loop sees it (``worker.placement.homes.NodeHomes``)."""

    def admit(self, agent_id: str, destructive: bool) -> HomeAdmission:
        """May a computer call of ``agent_id`` run on this node now? Materializes the home when it
        was just placed here (restored or reset); ``destructive`` marks the home changed."""


def step_label(agent_id: str, turn_id: str, step: int) -> str:
    """How a model step shows in a monitor (Flower's args column): ``agent=.. turn=.. step=..``."""
    return f"agent={agent_id} turn={turn_id} step={step}"


def call_labels(agent_id: str, turn_id: str, step: int, calls: list[PlannedCall]) -> dict[str, str]:
    """How each tool call shows in a monitor, by ``call_id``: ``<tool> agent=.. turn=.. step=.. call=..``."""
    return {c.call_id: f"{c.name} agent={agent_id} turn={turn_id} step={step} call={c.call_id}" for c in calls}


def no_toolsets(name: str) -> Toolset:
    """The resolver of an engine that runs no tools (a control plane's): raises ``LookupError``."""
    raise LookupError(f"this engine runs no tools (toolset {name!r})")
