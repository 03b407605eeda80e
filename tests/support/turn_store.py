"""Helpers for tests that drive a ``TurnStore`` directly."""

from __future__ import annotations

from typing import Any

from worker.turn.store import TurnStore


def begin_tools(store: TurnStore, turn_id: str, step: int, *args: Any, **kwargs: Any) -> None:
    """Record a step's plan and move it to its tools phase, as the model step does:
    ``TurnStore.begin_tools_writes(turn_id, step, *args, **kwargs)`` applied, guarded (raises
    ``StaleStep`` when the turn is not at ``step``'s model phase)."""
    store.apply_begin_tools(turn_id, step, store.begin_tools_writes(turn_id, step, *args, **kwargs))
