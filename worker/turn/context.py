"""The turn context given to tool category creators.

Each turn builds its tool set from creators called with a ``TurnContext``:
what the turn may do (``supports``), where the agent lives (``home``), which
providers are bound, and turn-scoped services (Redis, enqueue callbacks).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolServices
from worker.turn.request import Skill, TurnSupports


@dataclass
class TurnContext:
    """Everything a category creator may read.

    ``services`` are the turn's ``ToolServices`` (the same its tools get), e.g.
    ``services.enqueue_turn``; a creator treats a service that is None as "capability
    absent". ``redis`` is the runtime's Redis client (None: the turn has none).
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
    services: ToolServices = field(default_factory=ToolServices)
    metadata: dict[str, Any] = field(default_factory=dict)
    # Network of the turn's commands (``TurnRequest.network``): "none" or "egress" through the
    # egress proxy; ``egress_allow_hosts`` None means any host the address guard allows.
    network: str = "none"
    egress_allow_hosts: tuple[str, ...] | None = None
