"""The message floor of ``bench/message_floor.py``: the bench turn's three Celery messages with
nothing in them, on the runtime's own Celery app.

The runtime's bench turn (``bench/concurrency.py``) is three messages: step 0 (a model call) on the
steps' queue, its tool call on the tools' queue, step 1 on the steps' queue. Here each task only
sends the next message (``apply_async``), and step 1 marks the turn done (one ``RPUSH``). The app
is ``tasks.app``'s: the runtime's broker transport (its fetch records, acks in batches), task
events in batches for Flower, orjson, its garbage-collector settings, late acks, prefetch 1, the
tool call's time limits. So the difference between the runtime's worker CPU and this one's is
what the runtime's own work costs (model calls, turn store, fencing, validation), and this one is
what no change inside the task bodies can go below.

Workers (``bench/message_floor.py`` starts them, from ``bench/``): ``celery -A null_turn worker
-Q null_steps --pool solo`` and ``-Q null_tools --pool prefork -c 2``.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from tasks.app import app
from worker.settings import get_settings

STEPS_QUEUE = "null_steps"
TOOLS_QUEUE = "null_tools"
DONE_KEY = "null:done"

_redis = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
_limit = get_settings().tool_time_limit


@app.task(name="null.step", bind=True, acks_late=True)
def null_step(self: Any, turn_id: str, step: int) -> str:
    """Step 0 sends the tool call; step 1 marks the turn done."""
    if step == 0:
        null_tool.apply_async((turn_id, 0, "call_0"), queue=TOOLS_QUEUE)
        return "dispatched"
    _redis.rpush(DONE_KEY, turn_id)
    return "completed"


# The runtime's tool call's time limits (tasks/turns.py): a prefork parent arms a timer per task for them.
@app.task(name="null.tool", bind=True, acks_late=True, soft_time_limit=_limit, time_limit=_limit + 30)  # type: ignore[call-overload,untyped-decorator]
def null_tool(self: Any, turn_id: str, step: int, call_id: str) -> str:
    """The tool call: send step 1."""
    null_step.apply_async((turn_id, step + 1), queue=STEPS_QUEUE)
    return "advanced"
