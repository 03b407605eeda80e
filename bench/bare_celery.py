"""The floor of ``bench/concurrency.py``: a hand-written minimal turn on bare Celery.

Same shape as the runtime's benchmark turn (model call, one tool call, model call), same
broker, same pool, same model endpoint, and nothing else: no turn store, no fencing, no
validation, no events. ``bare_step(turn_id, n)`` posts to the model endpoint; after step 0 it
sends ``bare_tool``, which sends step 1; step 1 marks the turn done in Redis.

Run a worker for it with ``celery -A bare_celery worker`` from ``bench/`` (``REDIS_URL`` and
``BENCH_MODEL_URL`` in the environment).
"""

from __future__ import annotations

import os

import httpx
import redis
from celery import Celery

app = Celery("bare", broker=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"max_connections": 4096},
    broker_pool_limit=4096,
    worker_hijack_root_logger=False,
)

_http = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=4096, max_keepalive_connections=4096))
_redis = redis.Redis(
    connection_pool=redis.BlockingConnectionPool.from_url(app.conf.broker_url, max_connections=4096, timeout=30)
)


def _model(turn_id: str, n: int) -> dict:
    body = {"model": os.environ.get("BENCH_MODEL", "bench"), "input": [{"role": "user", "content": turn_id}]}
    if n:
        body["input"].append({"type": "function_call", "id": "fc_s0_0", "call_id": f"c-{turn_id}", "name": "t"})
        body["input"].append({"type": "function_call_output", "call_id": f"c-{turn_id}", "output": "ok"})
    r = _http.post(os.environ["BENCH_MODEL_URL"].rstrip("/") + "/responses", json=body)
    r.raise_for_status()
    return r.json()


@app.task(name="bare.step")
def bare_step(turn_id: str, n: int) -> None:
    """One model call; step 0 sends the tool call, step 1 ends the turn."""
    _model(turn_id, n)
    if n == 0:
        bare_tool.apply_async((turn_id,), queue="bare")
    else:
        _redis.rpush("bare:done", turn_id)


@app.task(name="bare.tool")
def bare_tool(turn_id: str) -> None:
    """The tool call: nothing to do but send the next step."""
    bare_step.apply_async((turn_id, 1), queue="bare")
