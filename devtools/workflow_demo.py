"""The workflow task demo (``make run DEMO=workflow``): ``run_workflow_demo`` and its scripts.

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

import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import orjson

from control.client import ControlPlane
from control.errors import ControlPlaneError
from control.workflow import WorkflowClient
from worker.records.workflow import WorkflowTask

if TYPE_CHECKING:
    from rich.console import Console

    from devtools.scripted_gateway import ScriptedGateway

ROOT = Path(__file__).resolve().parent.parent
DEMO_SCRIPTS = ("demo-workflow-main", "demo-workflow-task", "demo-workflow-followup")

DEMO_PAGES = [
    (
        "tides",
        "Tides and the Moon",
        "Tides are the rise and fall of sea levels caused by the gravitational pull of the Moon and, to a lesser "
        "degree, the Sun. Most coasts see two high tides and two low tides every lunar day of 24 hours and 50 "
        "minutes. " + "The Moon's pull is strongest on the side of Earth facing it, raising a bulge of water; a "
        "second bulge forms on the far side, where the pull is weakest. "
        * 12
        + "Spring tides, with the largest range, happen at new and full moon, when Sun and Moon line up. Neap tides, "
        "with the smallest range, happen at the quarter moons.",
    ),
    (
        "bay-of-fundy",
        "Bay of Fundy",
        "The Bay of Fundy in Canada has the highest tidal range in the world, up to 16 metres, because the bay's "
        "natural resonance period is close to the 12.4-hour tidal period.",
    ),
    (
        "lighthouses",
        "Lighthouse keeping",
        "Lighthouse keepers tended the lamp, wound the clockwork and logged the weather. Most lights are now "
        "automated.",
    ),
]


def load_demo_scripts(gateway: ScriptedGateway, folder: Path | None = None) -> None:
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


def run_workflow_demo(
    control: ControlPlane,
    *,
    agent_id: str | None = None,
    timeout: float = 120.0,
    out: Callable[[str], object] | None = None,
    console: Console | None = None,
) -> WorkflowDemoReport:
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
    main = control.enqueue(
        {
            "agent_id": agent,
            "input": question,
            "model": "demo-workflow-main",
            "supports": {"brain": True},
            "metadata": {"workflow_model": "demo-workflow-task"},
        }
    )
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
    followup = control.enqueue(
        {
            "agent_id": agent,
            "model": "demo-workflow-followup",
            "supports": {"brain": True},
            "input": f"Workflow task {task.task_id} ({task.title}) finished. Show me the result.",
        }
    )
    fview = control.wait(followup, timeout=timeout)
    out(f"follow-up turn {followup}: {fview.status.value}: {fview.final_output}")
    return WorkflowDemoReport(agent, main, task, followup, fview.final_output, fview.status.value)
