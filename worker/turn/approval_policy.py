"""Which tool calls wait for a person, and for how long: the approval rules, in one place.

The gate that applies them (parks the turn, opens a batch once decided) is
``worker.turn.gate``; the records and decisions are ``worker.turn.approvals``. A change to one of
these rules is a change to this module and its test (docs/architecture.md, "Which files a change
takes").

Modes (``TurnRequest.approval.mode``, else ``AGENT_APPROVAL_MODE``):

- ``off``: nothing waits (approvals waived for the turn);
- ``declared``: a call waits when its tool declares it (``needs_approval``: a bool, or a function
  of the validated params and the ``TurnContext``; a function that raises counts as "needs
  approval");
- ``destructive``: also every call of a destructive tool (``is_destructive``).

A turn that a turn starts (a background job, a schedule's turns, a workflow task) carries its
parent's policy, resolved when it is created (``inherited_approval``): a child never gets a weaker
mode, nor another timeout, than the turn that started it (docs/isolation.md, "Turns a turn starts").
"""

from __future__ import annotations

from typing import Any, Callable

from worker.settings import ApprovalMode, Settings, get_settings
from worker.tooling.contract import WorkerTool
from worker.turn.context import TurnContext
from worker.turn.request import ApprovalPolicy, TurnRequest

ApprovalRule = Callable[[WorkerTool[Any], Any], bool]
"""``(tool, validated_params) -> needs approval``, as ``worker.turn.planning.plan_calls`` takes it."""


MODE_ORDER: tuple[ApprovalMode, ...] = ("off", "declared", "destructive")
"""The modes from least to most approval: each holds every declaration the ones before it hold."""


def below_floor(mode: ApprovalMode | None, floor: ApprovalMode) -> bool:
    """True when a request's ``mode`` asks for less approval than ``floor`` (the server's
    ``AGENT_APPROVAL_MODE``, which the HTTP API holds as a floor); None (the default) never is."""
    return mode is not None and MODE_ORDER.index(mode) < MODE_ORDER.index(floor)


def approval_mode(request: TurnRequest, settings: Settings) -> ApprovalMode:
    """The turn's approval mode: the request's, else ``AGENT_APPROVAL_MODE``."""
    return request.approval.mode or settings.approval_mode


def approval_timeout(request: TurnRequest, settings: Settings) -> float:
    """Seconds a call may wait for a decision: the request's, else ``AGENT_APPROVAL_TIMEOUT``."""
    return request.approval.timeout or settings.approval_timeout


def call_needs_approval(tool: WorkerTool[Any], params: Any, ctx: TurnContext, mode: ApprovalMode) -> bool:
    """Whether this validated call waits for a person under ``mode`` (see the module docstring)."""
    if mode == "off":
        return False
    if mode == "destructive" and tool.is_destructive:
        return True
    return tool.approval_required(params, ctx)


def approval_rule(ctx: TurnContext, request: TurnRequest, settings: Settings) -> ApprovalRule | None:
    """The turn's rule for ``plan_calls``, or None when approvals are off for it."""
    mode = approval_mode(request, settings)
    if mode == "off":
        return None
    return lambda tool, params: call_needs_approval(tool, params, ctx, mode)


def inherited_approval(parent: dict[str, Any], settings: Settings | None = None) -> dict[str, Any]:
    """The ``approval`` of a turn started by the turn whose stored request is ``parent``.

    Returns ``{"mode", "timeout"}``: the parent's effective mode and timeout (its request's, else
    the worker's ``AGENT_APPROVAL_MODE`` / ``AGENT_APPROVAL_TIMEOUT`` now), written out so that a
    later change of the settings, or a worker with other settings, cannot weaken the child.
    A parent request whose ``approval`` does not parse raises pydantic's ``ValidationError``.
    """
    policy = ApprovalPolicy.model_validate(parent.get("approval") or {})
    s = settings or get_settings()
    return {"mode": policy.mode or s.approval_mode, "timeout": policy.timeout or s.approval_timeout}
