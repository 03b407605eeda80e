"""Control-plane side of workflow tasks and Brain: ``WorkflowClient``, the demo runner, a small CLI.

``WorkflowClient(control)`` wraps ``worker.workflow.WorkflowService`` with the
control plane's Redis client and its turn operations (``enqueue`` to start an
attempt's turn, ``cancel`` to stop one):

- ``start_workflow_task(agent_id=..., title=..., instructions=...,
  result_schema=..., use_brain=False, model=None) -> WorkflowTask``
- ``show(task_id)``, ``list(agent_id)``, ``cancel(task_id)``, ``retry(task_id)``
- ``wait(task_id, timeout)``: poll until the task is succeeded, failed or
  cancelled (raises ``ControlPlaneError`` on timeout);
- ``add_brain_page(agent_id, title, text, page_id=None)``.

CLI (against ``REDIS_URL``)::

    python -m tasks.workflow brain-add --agent demo --title "Tides" --file tides.md
    python -m tasks.workflow show wf_...
    python -m tasks.workflow list --agent demo
    python -m tasks.workflow retry wf_...
    python -m tasks.workflow cancel wf_...

The demo (``run_workflow_demo``; scripts in ``scripts/demo-workflow-*.json``):

1. seed the demo agent's Brain with a few pages;
2. main text turn (model ``demo-workflow-main``, ``metadata.workflow_model =
   "demo-workflow-task"``): the scripted model calls ``workflow_start``, whose
   result tells it the task id, and answers that the task is running. The
   main turn never waits for the task (no worker is blocked);
3. the task turn (model ``demo-workflow-task``, queue ``workflow``): ``recall``
   in Brain, ``get_page`` twice (the second continues at the offset the first
   one named), then ``submit_result`` with a structured result; the turn-end
   hook validates it against the persisted schema and commits it;
4. once the task has finished, the runner starts a follow-up turn of the same
   agent (model ``demo-workflow-followup``, input "Workflow task ... finished.
   Show me the result."): its scripted model calls ``workflow_show`` (no id:
   the agent's latest task) and reports the result. (A fresh input rather
   than the main turn's items: the scripted gateway numbers steps from the
   item ids it finds in the input.)
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import orjson

from tasks.control import ControlPlane, ControlPlaneError
from worker.brain import BrainStore, Page
from worker.workflow import TERMINAL, WorkflowService, WorkflowTask

ROOT = Path(__file__).resolve().parent.parent
DEMO_SCRIPTS = ("demo-workflow-main", "demo-workflow-task", "demo-workflow-followup")


class WorkflowClient:
    """Workflow and Brain operations for the control plane (see the module docstring)."""

    def __init__(self, control: ControlPlane):
        self.control = control
        self.r = control.store.r
        self.service = WorkflowService(self.r, enqueue_turn=lambda req, tid=None: control.enqueue(req, tid),
                                       cancel_turn=self._cancel_turn)

    def _cancel_turn(self, turn_id: str) -> None:
        try:
            self.control.cancel(turn_id)
        except ControlPlaneError:  # the attempt's turn was never stored
            pass

    def start_workflow_task(self, *, agent_id: str = "agent", title: str, instructions: str,
                            result_schema: dict[str, Any], use_brain: bool = False, model: str | None = None,
                            task_id: str | None = None, max_model_calls: int | None = None) -> WorkflowTask:
        """Create a task and enqueue attempt 1. Raises ``worker.workflow.WorkflowError`` for bad input."""
        task, _ = self.service.start(agent_id=agent_id, title=title, instructions=instructions,
                                     result_schema=result_schema, use_brain=use_brain, model=model,
                                     task_id=task_id, max_model_calls=max_model_calls)
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
        """Create or replace a Brain page of ``agent_id`` (``worker.brain.BrainStore.add_page`` rules)."""
        return BrainStore(self.r, agent_id).add_page(title, text, page_id)


# ----- the demo ------------------------------------------------------------------------------

DEMO_PAGES = [
    ("tides", "Tides and the Moon",
     "Tides are the rise and fall of sea levels caused by the gravitational pull of the Moon and, to a lesser "
     "degree, the Sun. Most coasts see two high tides and two low tides every lunar day of 24 hours and 50 "
     "minutes. " + "The Moon's pull is strongest on the side of Earth facing it, raising a bulge of water; a "
     "second bulge forms on the far side, where the pull is weakest. " * 12 +
     "Spring tides, with the largest range, happen at new and full moon, when Sun and Moon line up. Neap tides, "
     "with the smallest range, happen at the quarter moons."),
    ("bay-of-fundy", "Bay of Fundy",
     "The Bay of Fundy in Canada has the highest tidal range in the world, up to 16 metres, because the bay's "
     "natural resonance period is close to the 12.4-hour tidal period."),
    ("lighthouses", "Lighthouse keeping",
     "Lighthouse keepers tended the lamp, wound the clockwork and logged the weather. Most lights are now "
     "automated."),
]


def load_demo_scripts(gateway: Any, folder: Path | None = None) -> None:
    """Add the demo's scripts (``scripts/demo-workflow-*.json``) to an in-process ``ScriptedGateway``."""
    for name in DEMO_SCRIPTS:
        data = orjson.loads(((folder or ROOT / "scripts") / f"{name}.json").read_bytes())
        gateway.add_script(data.get("name", name), data["steps"])


@dataclass
class WorkflowDemoReport:
    """What the demo did; true (``bool(report)``) when the task succeeded and the follow-up turn completed."""

    agent_id: str
    main_turn: str
    task: WorkflowTask
    followup_turn: str
    followup_output: str | None
    followup_status: str

    def __bool__(self) -> bool:
        return self.task.status == "succeeded" and self.followup_status == "completed"


def run_workflow_demo(control: ControlPlane, *, agent_id: str | None = None, timeout: float = 120.0,
                      out: Callable[[str], Any] | None = None, console: Any = None) -> WorkflowDemoReport:
    """Run the workflow demo (steps in the module docstring) against running workers and gateway.

    The gateway must serve the three ``demo-workflow-*`` scripts (``make run``
    loads ``scripts/``). Progress lines go to ``out`` (default ``print``) or a
    rich ``console`` (printed without markup). Returns a ``WorkflowDemoReport``;
    raises ``ControlPlaneError`` on a timeout.
    """
    if out is None:
        out = (lambda line: console.print(line, markup=False)) if console is not None else print
    client = WorkflowClient(control)
    agent = agent_id or f"demo-wf-{uuid.uuid4().hex[:6]}"
    for pid, title, text in DEMO_PAGES:
        client.add_brain_page(agent, title, text, page_id=pid)
    out(f"seeded {len(DEMO_PAGES)} Brain pages for agent {agent}")
    question = "Why are there tides, how many a day, and where is the tidal range highest?"
    main = control.enqueue({"agent_id": agent, "input": question, "model": "demo-workflow-main",
                            "supports": {"brain": True}, "metadata": {"workflow_model": "demo-workflow-task"}})
    view = control.wait(main, timeout=timeout)
    out(f"main turn {main}: {view.status.value}: {view.final_output}")
    tasks = client.list(agent, limit=1)
    if not tasks:
        raise ControlPlaneError(f"the main turn {main} started no workflow task ({view.status.value}: {view.error})")
    task = client.wait(tasks[0].task_id, timeout=timeout)
    for att in task.attempts:
        for ev in control.events(att["turn_id"]):
            if ev.get("kind") == "call_completed" or (ev.get("kind") == "call_planned" and ev.get("error")):
                out(f"  task attempt {att['attempt']}: {ev.get('activity')}{' (error)' if ev.get('is_error') else ''}")
    out(f"workflow task {task.task_id}: {task.status} after {len(task.attempts)} attempt(s)")
    if task.has_result:
        out("result: " + orjson.dumps(task.result, option=orjson.OPT_INDENT_2).decode())
    elif task.error:
        out(f"reason: {task.error}")
    followup = control.enqueue({
        "agent_id": agent, "model": "demo-workflow-followup", "supports": {"brain": True},
        "input": f"Workflow task {task.task_id} ({task.title}) finished. Show me the result.",
    })
    fview = control.wait(followup, timeout=timeout)
    out(f"follow-up turn {followup}: {fview.status.value}: {fview.final_output}")
    return WorkflowDemoReport(agent, main, task, followup, fview.final_output, fview.status.value)


# ----- CLI -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    """CLI entry point (``python -m tasks.workflow``)."""
    parser = argparse.ArgumentParser(prog="python -m tasks.workflow", description="Workflow tasks and Brain pages")
    sub = parser.add_subparsers(dest="cmd", required=True)
    add = sub.add_parser("brain-add", help="create or replace a Brain page")
    add.add_argument("--agent", default="agent")
    add.add_argument("--title", required=True)
    add.add_argument("--id", default=None)
    src = add.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", type=Path)
    src.add_argument("--text")
    for name in ("show", "retry", "cancel"):
        sub.add_parser(name).add_argument("task_id")
    lst = sub.add_parser("list")
    lst.add_argument("--agent", default="agent")
    args = parser.parse_args(argv)
    client = WorkflowClient(ControlPlane())
    if args.cmd == "brain-add":
        text = args.file.read_text(encoding="utf-8") if args.file else args.text
        page = client.add_brain_page(args.agent, args.title, text, args.id)
        print(orjson.dumps({"id": page.id, "title": page.title, "chars": len(page.text)}).decode())
    elif args.cmd == "list":
        print(orjson.dumps([t.view() for t in client.list(args.agent)], option=orjson.OPT_INDENT_2).decode())
    else:
        task = getattr(client, args.cmd)(args.task_id)
        print(orjson.dumps(task.view(with_schema=True), option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
