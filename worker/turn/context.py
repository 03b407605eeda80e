"""The turn context given to tool category creators.

Each turn builds its tool set from creators called with a ``TurnContext``:
what the turn may do (``supports``), where the agent lives (``home``), which
providers are bound, and turn-scoped services (Redis, enqueue callbacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from worker.settings import Settings
from worker.tooling.contract import AbortSignal
from worker.turn.request import Skill, TurnSupports


@dataclass
class TurnContext:
    """Everything a category creator may read.

    ``services`` holds callables provided by the orchestration layer, e.g.
    ``enqueue_turn(request_dict) -> turn_id``; creators must treat a missing
    service as "capability absent".
    """

    turn_id: str
    agent_id: str
    home: Path
    settings: Settings
    abort: AbortSignal = field(default_factory=AbortSignal)
    supports: TurnSupports = field(default_factory=TurnSupports)
    # True in a workflow task turn (fixed catalog: no workflow, computer or job tools).
    workflow_task: bool = False
    redis: Any = None
    skills: tuple[Skill, ...] = ()
    services: dict[str, Callable[..., Any]] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Network of the turn's commands (``TurnRequest.network``): "none" or "egress" through the
    # egress proxy; ``egress_allow_hosts`` None means any host the address guard allows.
    network: str = "none"
    egress_allow_hosts: tuple[str, ...] | None = None
