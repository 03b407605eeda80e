"""Helpers for tests that drive a ``TurnStore`` directly."""

from __future__ import annotations

from typing import Any

from worker.turn.state import CallView
from worker.turn.store import TurnStore


def begin_tools(store: TurnStore, turn_id: str, step: int, *args: Any, **kwargs: Any) -> None:
    """Record a step's plan and move it to its tools phase, as the model step does:
    ``Moves.begin_tools_writes(turn_id, step, *args, **kwargs)`` applied, guarded (raises
    ``StaleStep`` when the turn is not at ``step``'s model phase); in the turn's layout, as a step
    does (``TurnState.layout``) unless ``layout`` is given."""
    if "layout" not in kwargs:
        state = store.load(turn_id)
        kwargs["layout"] = state.layout if state is not None else 1
    store.moves.apply_begin_tools(turn_id, step, store.moves.begin_tools_writes(turn_id, step, *args, **kwargs))


def call_view(store: TurnStore, turn_id: str, step: int, call_id: str, owner: str, lease: float) -> CallView:
    """``TurnStore.call_view`` as a ``tool_call`` task runs it: with what the call's message
    carries (``Plan.started_at_once`` of the step's plan, ``""`` for a call absent)."""
    plan = store.plan(turn_id, step)
    started = plan.started_at_once().get(call_id, "") if plan is not None else ""
    return store.call_view(turn_id, step, call_id, owner, lease, started)
