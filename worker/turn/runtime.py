"""The turn's runtime: what every part of the turn loop shares, built once per process.

The parts (``worker.turn.model_step``, ``replies``, ``call_runner``, ``completion``, ``gate``,
``ending``, ``redrive``, ``intake``, ``toolbox``) each take a ``TurnRuntime`` in their constructor
and nothing else of each other but what they call (docs/architecture.md, "Module map").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from redis import Redis

from worker.settings import Settings
from worker.turn.interfaces import Dispatcher
from worker.turn.liveness import Liveness
from worker.turn.store import TurnStore
from worker.turn.usage import UsageLedger


@dataclass(frozen=True)
class TurnRuntime:
    """What a process's turn loop shares: the turn ``store`` (every turn key), the queue layer, the
    settings, the nodes' ``liveness`` records, the ``usage`` ledger (the store's), the clock
    (epoch seconds; a test may pass its own), and ``redis``: the process's client for what is not
    a turn's state (the tools' ``ToolServices.redis``, the records of jobs, schedules, workflows,
    placement); a turn's keys are only ever reached through ``store``."""

    store: TurnStore
    dispatcher: Dispatcher
    settings: Settings
    liveness: Liveness
    usage: UsageLedger
    redis: Redis
    clock: Callable[[], float] = field(default=time.time)

    @classmethod
    def build(cls, client: Redis, store: TurnStore, dispatcher: Dispatcher, settings: Settings) -> TurnRuntime:
        """The runtime of ``store``, whose Redis ``client`` also holds the liveness records."""
        return cls(store, dispatcher, settings, Liveness(client, settings.liveness_ttl), store.usage, client)
