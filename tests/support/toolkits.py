"""The tests' toolset (``tests.support.toolsets.testing_tools``) with its builds counted, for tests
of what a worker keeps alive between a model call's start and its reply. A worker started with
``AGENT_EXTRA_TOOLSETS=testing=tests.support.toolkits:counted_testing_tools`` runs turns of toolset
``testing`` as usual, and:

- turns its cyclic garbage collector off at the first build: a tool set is freed only when nothing
  refers to it any more, and one caught in a reference cycle is never freed;
- counts per turn the tool sets built and freed, and writes them to the hash
  ``test:toolkits:<turn_id>`` (fields ``built``, ``freed``) every ``FLUSH_SECONDS``.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections import Counter
from typing import Any

from tests.support.toolsets import testing_tools
from worker.turn.context import TurnContext

FLUSH_SECONDS = 0.1
_lock = threading.RLock()  # a finalizer may run on any thread, at any point that drops a reference
_counts: dict[str, Counter[str]] = {}
_changed: set[str] = set()
_flusher: threading.Thread | None = None


def _count(turn_id: str, what: str) -> None:
    with _lock:
        _counts.setdefault(turn_id, Counter())[what] += 1
        _changed.add(turn_id)


def _flush(redis: Any) -> None:
    while True:
        threading.Event().wait(FLUSH_SECONDS)
        with _lock:
            changed = {t: dict(_counts[t]) for t in _changed}
            _changed.clear()
        for turn_id, counts in changed.items():
            redis.hset(f"test:toolkits:{turn_id}", mapping=counts)


def counted_testing_tools(ctx: TurnContext) -> list[Any]:
    """``testing_tools(ctx)``, counted as built now and as freed when its first tool is."""
    global _flusher
    with _lock:
        if _flusher is None:
            gc.disable()
            _flusher = threading.Thread(target=_flush, args=(ctx.redis,), name="test-toolkits", daemon=True)
            _flusher.start()
    tools = testing_tools(ctx)
    _count(ctx.turn_id, "built")
    weakref.finalize(tools[0], _count, ctx.turn_id, "freed")
    return tools
