"""A turn's tools: the ``TurnContext`` given to category creators, the tool set they build, the
instructions with the enabled skills, and the ``ToolServices`` its tools may use."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, EnqueueTurn, ToolServices, WorkerTool
from worker.tooling.tool_search import deferred_by_name, with_tool_search
from worker.turn.context import TurnContext
from worker.turn.interfaces import Toolset
from worker.turn.outage import OUTAGE_ERRORS
from worker.turn.request import Skill, TurnRequest
from worker.turn.runtime import TurnRuntime
from worker.turn.state import TurnState

_HOMES: dict[tuple[str, str], Path] = {}  # (homes root, agent) -> resolved home, made once per process
# At most this many: a long-lived worker sees every agent of the deployment (10,000 in an hour of
# bench/inflight.py, about 0.5 KB each), and one not kept only costs a realpath and a mkdir again.
_HOMES_MAX = 4096
_HOMES_LOCK = threading.Lock()  # a threads pool's steps add at once
_ROOTS: dict[str, Path] = {}  # homes root as configured -> resolved, once per process


def home_path(settings: Settings, agent_id: str) -> Path:
    """Where the agent's home is, ``<homes_root resolved>/<agent_id>``, without touching it: no
    ``realpath`` of the home and no ``mkdir``. A model step's context uses it: the step runs no
    tool, and its node (a turns node) does not hold the agents' homes (``docs/placement.md``);
    the call's context (``agent_home``) makes the home where the call runs. ``agent_id`` matches
    ``ID_PATTERN`` (``TurnRequest``), so it is one path component that cannot climb."""
    key = str(settings.homes_root)
    root = _ROOTS.get(key)
    if root is None:
        root = _ROOTS[key] = Path(key).resolve()
    return root / agent_id


def agent_home(settings: Settings, agent_id: str) -> Path:
    """The agent's home directory, ``<homes_root>/<agent_id>`` (created on first use)."""
    key = (str(settings.homes_root), agent_id)
    home = _HOMES.get(key)
    if home is None or not home.is_dir():  # one stat per step instead of realpath + mkdir
        home = home_path(settings, agent_id).resolve()
        home.mkdir(parents=True, exist_ok=True)
        with _HOMES_LOCK:
            if len(_HOMES) >= _HOMES_MAX:  # the oldest goes
                del _HOMES[next(iter(_HOMES))]
            _HOMES[key] = home
    return home


class Toolbox:
    """Builds a turn's context and tools.

    ``resolve_toolset(name)`` returns the category assembly of a turn's ``toolset``;
    ``project_skills(skills)`` the text that projects enabled skills into the instructions (None:
    skills are not projected); ``enqueue_turn`` and ``cancel_turn`` are the turn loop's own tool
    services (``TurnIntake.enqueue``, ``TurnEnd.cancel``), added to the queue layer's
    (``Dispatcher.services``).
    """

    def __init__(
        self,
        runtime: TurnRuntime,
        resolve_toolset: Callable[[str], Toolset],
        project_skills: Callable[[tuple[Skill, ...]], str] | None,
        *,
        enqueue_turn: EnqueueTurn,
        cancel_turn: Callable[[str], bool],
    ):
        self.rt = runtime
        self.resolve_toolset = resolve_toolset
        self.project_skills = project_skills
        self._enqueue_turn = enqueue_turn
        self._cancel_turn = cancel_turn

    def services(self, request: TurnRequest) -> ToolServices:
        """The turn's ``ToolServices``: the queue layer's, plus Redis, settings and the loop's own."""
        return replace(
            self.rt.dispatcher.services(request),
            redis=self.rt.redis,
            settings=self.rt.settings,
            enqueue_turn=self._enqueue_turn,
            cancel_turn=self._cancel_turn,
        )

    def abort_signal(self, turn_id: str, *, probed: bool = False) -> AbortSignal:
        """The turn's ``AbortSignal``: it probes the turn's cancel flag (``probed``: the caller has
        just read it unset)."""
        return AbortSignal(probe=lambda: self._cancel_requested(turn_id), probed=probed)

    def _cancel_requested(self, turn_id: str) -> bool:
        # While Redis does not answer, a running tool goes on (the flag is read again at its next check).
        try:
            return self.rt.store.is_cancelled(turn_id)
        except OUTAGE_ERRORS:
            return False

    def context(
        self, state: TurnState, request: TurnRequest, abort: AbortSignal | None = None, *, make_home: bool = True
    ) -> TurnContext:
        """The ``TurnContext`` given to category creators: the agent's home created on first use
        (``agent_home``), or with ``make_home=False`` (a model step, which runs no tool) only its
        path (``home_path``)."""
        settings = self.rt.settings
        return TurnContext(
            turn_id=state.turn_id,
            agent_id=request.agent_id,
            home=agent_home(settings, request.agent_id) if make_home else home_path(settings, request.agent_id),
            settings=settings,
            abort=abort or self.abort_signal(state.turn_id),
            supports=request.supports,
            redis=self.rt.redis,
            skills=tuple(request.skills),
            services=self.services(request),
            metadata=dict(request.metadata),
            workflow_task=request.toolset == "workflow_task",
            network=request.network,
            egress_allow_hosts=tuple(request.egress_allow_hosts) if request.egress_allow_hosts is not None else None,
        )

    def tools(self, ctx: TurnContext, request: TurnRequest) -> list[WorkerTool[Any]]:
        """The turn's tool set: its toolset's assembly (with the tools ``AGENT_DEFER_TOOLS`` names
        deferred), plus ``tool_search`` when a tool is deferred."""
        tools = self.resolve_toolset(request.toolset)(ctx)
        return with_tool_search(deferred_by_name(tools, self.rt.settings.defer_tools))

    def instructions(self, ctx: TurnContext, request: TurnRequest) -> str | None:
        """The request's instructions with the enabled skills projected into them."""
        parts = [request.instructions or ""]
        if ctx.skills and self.project_skills is not None:
            parts.append(self.project_skills(ctx.skills))
        text = "\n\n".join(p for p in parts if p)
        return text or None
