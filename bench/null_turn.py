"""The message floor of ``bench/message_floor.py``: the bench turn's three Celery messages with
nothing in them, on the runtime's own Celery app, published as the runtime publishes them.

The runtime's bench turn (``bench/concurrency.py``) is three messages: step 0 (a model call) on the
steps' queue, its tool call on the tools' queue, step 1 on the steps' queue. Here each task only
sends the next message, and step 1 marks the turn done (one ``RPUSH``). The app is ``tasks.app``'s:
the runtime's broker transport (its fetch records, acks in batches), task events in batches for
Flower, orjson, its garbage-collector settings, late acks, prefetch 1, the tool call's time limits.

A message goes out as the runtime sends a turn's next message, never through ``apply_async``
(kombu's producer and an ``AsyncResult``, then a second round trip for the ``task-sent`` event):
written from a ``tasks.message_template.MessageTemplate`` (Celery builds the message and its
``task-sent`` event once per process, task and queue; each message is then the same commands with
its own id, arguments, root and parent, clock and time, through the publish signals' handlers).
The runtime's stored script pushes those commands with the state change that decided them; a null
task has no state to change, so its one round trip is a pipeline of the two commands. The first
version of this floor published with ``apply_async`` and cost about 35% more (bench/README.md,
"the message floor").

Workers (``bench/message_floor.py`` starts them, from ``bench/``): ``celery -A null_turn worker
-Q null_steps --pool solo`` and ``-Q null_tools --pool prefork -c 2``.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from tasks.app import app
from tasks.dispatcher import SEND_OPTIONS, _broker_routes, _send
from tasks.message_template import MessageTemplate
from worker.settings import get_settings

STEPS_QUEUE = "null_steps"
TOOLS_QUEUE = "null_tools"
DONE_KEY = "null:done"

_redis = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
_limit = get_settings().tool_time_limit
# Per task name and process: a template is used only in the process that recorded it.
_templates: dict[tuple[str, int], MessageTemplate] = {}


def send(name: str, queue: str, args: tuple[Any, ...], label: str) -> None:
    """Send task ``name`` with ``args`` to ``queue`` (``label``: its args as Flower shows them) from
    the process's template, in one round trip. Raises ``RuntimeError`` when the message cannot be
    templated (a broker the runtime would not template either)."""
    key = (name, os.getpid())
    template = _templates.get(key)
    if template is None:
        routes = _broker_routes()
        if routes is None:
            raise RuntimeError("the broker's messages cannot be templated")

        def sample(extra: dict[str, Any]) -> Any:
            return _send(name, args, {**SEND_OPTIONS, "queue": queue, "argsrepr": "-", **extra})

        template = MessageTemplate.record(sample, routes.topics, routes.expiring)
        if template is None or not template.usable:
            raise RuntimeError(f"no template for {name} to {queue}")
        _templates[key] = template
    with _redis.pipeline(transaction=False) as pipe:
        for command, target, payload in template.message(args, label):
            pipe.execute_command(command, target, payload)
        pipe.execute()


@app.task(name="null.step", bind=True, acks_late=True)
def null_step(self: Any, turn_id: str, step: int) -> str:
    """Step 0 sends the tool call; step 1 marks the turn done."""
    if step == 0:
        send("null.tool", TOOLS_QUEUE, (turn_id, 0, "call_0"), f"turn={turn_id} call=call_0")
        return "dispatched"
    _redis.rpush(DONE_KEY, turn_id)
    return "completed"


# The runtime's tool call's time limits (tasks/turns.py): a prefork parent arms a timer per task for them.
@app.task(name="null.tool", bind=True, acks_late=True, soft_time_limit=_limit, time_limit=_limit + 30)  # type: ignore[call-overload,untyped-decorator]
def null_tool(self: Any, turn_id: str, step: int, call_id: str) -> str:
    """The tool call: send step 1."""
    send("null.step", STEPS_QUEUE, (turn_id, step + 1), f"turn={turn_id} step={step + 1}")
    return "advanced"
