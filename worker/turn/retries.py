"""Retrying a model call that failed with a retryable ``GatewayError``: how long to wait, and
what the turn records meanwhile (docs/architecture.md, "Retries").

Both ways a model call is made use this: the Celery task of an inline call (``tasks.turns``) and
the completion of an asynchronous one (``worker.turn.async_calls``).
"""

from __future__ import annotations

import random
from typing import Callable

from worker.settings import Settings
from worker.turn.store import TurnStore

MAX_MODEL_RETRIES = 5
MAX_RETRY_DELAY = 60.0  # seconds


def retry_delay(retries: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before model-call retry ``retries + 1``: half of ``min(60, 2**retries)`` plus a random
    part of the other half ("equal jitter"), so that turns failing together (a gateway outage) do
    not all retry in the same second, and every retry still waits at least half its backoff."""
    cap = min(MAX_RETRY_DELAY, float(2**retries))
    return round(cap / 2 + rand() * cap / 2, 3)


def note_retry(store: TurnStore, settings: Settings, turn_id: str, step: int, error: str, delay: float) -> None:
    """Record a ``model_retry`` event (``step``, ``error``, ``in_s``) and push the progress deadline
    past the retry and its call, so the watchdog does not start a second retry chain."""
    store.event(turn_id, "model_retry", step=step, error=error[:300], in_s=delay)
    store.push_deadline(turn_id, delay + settings.model_call_lease)
