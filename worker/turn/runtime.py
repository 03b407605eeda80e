"""The turn's runtime: what every part of the turn loop shares, built once per process.

The parts (``worker.turn.model_step``, ``replies``, ``call_runner``, ``completion``, ``gate``,
``ending``, ``redrive``, ``intake``, ``toolbox``) each take a ``TurnRuntime`` in their constructor
and nothing else of each other but what they call (docs/architecture.md, "Module map").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from worker.settings import Settings
from worker.turn.interfaces import Dispatcher
from worker.turn.liveness import Liveness
from worker.turn.store import TurnStore
from worker.turn.usage import UsageLedger


@dataclass(frozen=True)
class TurnRuntime:
    """The store, the queue layer, the settings, the node liveness records, the usage ledger and the
    clock (epoch seconds; a test may pass its own) of a process's turn loop."""

    store: TurnStore
    dispatcher: Dispatcher
    settings: Settings
    liveness: Liveness
    usage: UsageLedger
    clock: Callable[[], float] = field(default=time.time)

    @classmethod
    def build(cls, store: TurnStore, dispatcher: Dispatcher, settings: Settings) -> TurnRuntime:
        """The runtime of ``store`` (its Redis also holds the liveness records and usage ledger)."""
        return cls(store, dispatcher, settings, Liveness(store.r, settings.liveness_ttl), UsageLedger(store.r))
