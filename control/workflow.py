"""Control-plane side of workflow tasks and Brain: ``WorkflowClient``, the demo runner, a small CLI.

``WorkflowClient(control)`` wraps ``worker.records.workflow.WorkflowService`` with the
control plane's Redis client and its turn operations (``enqueue`` to start an
attempt's turn, ``cancel`` to stop one):

- ``start_workflow_task(agent_id=..., title=..., instructions=...,
  result_schema=..., use_brain=False, model=None) -> WorkflowTask``
- ``show(task_id)``, ``list(agent_id)``, ``cancel(task_id)``, ``retry(task_id)``
- ``wait(task_id, timeout)``: poll until the task is succeeded, failed or
  cancelled (raises ``ControlPlaneError`` on timeout);
- ``add_brain_page(agent_id, title, text, page_id=None)``.

CLI (against ``CONTROL_REDIS_URL``, else ``REDIS_URL``): ``python -m control.workflow_cli`` (``start``,
``show``, ``list``, ``wait``, ``retry``, ``cancel``, ``brain-add``; ``--help`` on each); for example::

    python -m control.workflow_cli brain-add --agent demo --title "Tides" --file tides.md
    python -m control.workflow_cli start --agent demo --title "Tides" --instructions "..." --schema @result.json --wait
    python -m control.workflow_cli show wf_...
    python -m control.workflow_cli list --agent demo
    python -m control.workflow_cli retry wf_...
    python -m control.workflow_cli cancel wf_...
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from redis import Redis

from control.errors import ControlPlaneError
from worker.records.brain import BrainStore, Page
from worker.records.workflow import TERMINAL, WorkflowService, WorkflowTask
from worker.turn.request import TurnRequest


class TurnControl(Protocol):
    """What ``WorkflowClient`` needs of the control plane (``control.client.ControlPlane``): its
    Redis client (the workflow and Brain records are not a turn's keys), and starting and
    cancelling turns."""

    redis: Redis

    def enqueue(self, request: TurnRequest | dict[str, Any], turn_id: str | None = None) -> str:
        """Start a turn; its id. Raises ``ControlPlaneError``."""
        ...

    def cancel(self, turn_id: str) -> bool:
        """Ask a turn to stop. Raises ``ControlPlaneError`` for an unknown turn."""
        ...


class WorkflowClient:
    """Workflow and Brain operations for the control plane (see the module docstring)."""

    def __init__(self, control: TurnControl):
        self.control = control
        self.r = control.redis
        self.service = WorkflowService(
            self.r, enqueue_turn=lambda req, tid=None: control.enqueue(req, tid), cancel_turn=self._cancel_turn
        )

    def _cancel_turn(self, turn_id: str) -> None:
        try:
            self.control.cancel(turn_id)
        except ControlPlaneError:  # the attempt's turn was never stored
            pass

    def start_workflow_task(
        self,
        *,
        agent_id: str = "agent",
        title: str,
        instructions: str,
        result_schema: dict[str, Any],
        use_brain: bool = False,
        model: str | None = None,
        task_id: str | None = None,
        max_model_calls: int | None = None,
    ) -> WorkflowTask:
        """Create a task and enqueue attempt 1. Raises ``worker.records.workflow.WorkflowError`` for bad input."""
        task, _ = self.service.start(
            agent_id=agent_id,
            title=title,
            instructions=instructions,
            result_schema=result_schema,
            use_brain=use_brain,
            model=model,
            task_id=task_id,
            max_model_calls=max_model_calls,
        )
        return task

    def show(self, task_id: str) -> WorkflowTask:
        """The task with its attempts. Raises ``WorkflowError`` for an unknown task."""
        return self.service.show(task_id)

    def list(self, agent_id: str = "agent", limit: int = 50) -> list[WorkflowTask]:
        """The agent's tasks, newest first (at most ``limit``)."""
        return self.service.list(agent_id, limit)

    def cancel(self, task_id: str) -> WorkflowTask:
        """Cancel the task and its running attempt; returns the updated task."""
        return self.service.cancel(task_id, reason="cancelled by the control plane")

    def retry(self, task_id: str, max_model_calls: int | None = None) -> WorkflowTask:
        """Start a new attempt (fresh conversation) of a failed or cancelled task; raises ``WorkflowError`` otherwise."""
        return self.service.retry(task_id, max_model_calls=max_model_calls)

    def wait(self, task_id: str, timeout: float = 60.0, poll: float = 0.05) -> WorkflowTask:
        """Block until the task is succeeded, failed or cancelled *and* its attempt's outcome is recorded."""
        deadline = time.monotonic() + timeout
        while True:
            task = self.service.show(task_id)
            att = task.current
            settled = att is None or att.get("turn_status") or att["status"] == "failed"
            if task.status in TERMINAL and settled:
                return task
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"workflow task {task_id} still {task.status} after {timeout:.0f}s")
            time.sleep(poll)

    def add_brain_page(self, agent_id: str, title: str, text: str, page_id: str | None = None) -> Page:
        """Create or replace a Brain page of ``agent_id`` (``worker.records.brain.BrainStore.add_page`` rules)."""
        return BrainStore(self.r, agent_id).add_page(title, text, page_id)
