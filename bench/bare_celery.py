"""The floor of ``bench/concurrency.py``: a hand-written minimal turn on bare Celery.

Same shape as the runtime's benchmark turn (model call, one tool call, model call), same
broker, same Celery settings, same pool, same model endpoint and request body (the runtime's
tool definitions, from ``BENCH_MODEL_BODY``), and the least a turn needs:
its conversation in Redis (read before each model call, the reply and the tool output
appended). No fencing, validation, claims, events, deadlines or recovery.
``bare_step(turn_id, n)`` reads the history and posts it to the model endpoint, appends the
reply; after step 0 it sends ``bare_tool``, which appends its output and sends step 1; step 1
marks the turn done.

Run a worker for it with ``celery -A bare_celery worker`` from ``bench/`` (``REDIS_URL`` and
``BENCH_MODEL_URL`` in the environment).
"""

from __future__ import annotations

import json
import os
import ssl
import threading

import certifi
import httpx
import redis
from celery import Celery

app = Celery("bare", broker=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
# The runtime's own Celery settings (tasks/app.py), so the ratio measures the runtime, not
# Celery options: late acks, prefetch 1, task events for Flower, pools sized alike.
app.conf.update(
    task_serializer="json",
    accept_content=["json"],
    task_ignore_result=True,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_send_task_events=True,
    task_send_sent_event=True,
    broker_transport_options={"max_connections": 2048, "visibility_timeout": 3600},
    broker_pool_limit=2048,
    worker_hijack_root_logger=False,
)

# One keep-alive pool per thread, as the runtime's model client (worker.model.responses): httpcore's
# pool shared by hundreds of threads closes connections other threads use (encode/httpcore#1110).
# One TLS context for all of them (httpx builds one per client otherwise: ~10 ms of CPU each).
_local = threading.local()
_TLS = ssl.create_default_context(cafile=certifi.where())


def _http() -> httpx.Client:
    if not hasattr(_local, "client"):
        _local.client = httpx.Client(timeout=float(os.environ.get("BENCH_MODEL_TIMEOUT", "30")), verify=_TLS)
    return _local.client


_redis = redis.Redis(
    connection_pool=redis.BlockingConnectionPool.from_url(app.conf.broker_url, max_connections=4096, timeout=30)
)


# The rest of the request body the runtime posts (its tool definitions, ``store``,
# ``parallel_tool_calls``...; ``bench/concurrency.py`` passes it): a turn whose model may call a
# tool sends the tool's definition, so the floor's requests weigh what the runtime's weigh.
_BODY = json.loads(os.environ.get("BENCH_MODEL_BODY") or "{}")


def _model(turn_id: str) -> dict:
    history = [json.loads(x) for x in _redis.lrange(f"bare:{turn_id}", 0, -1)]
    body = {
        **_BODY,
        "model": os.environ.get("BENCH_MODEL", "bench"),
        "input": [{"role": "user", "content": turn_id}, *history],
    }
    try:
        r = _http().post(os.environ["BENCH_MODEL_URL"].rstrip("/") + "/responses", json=body)
    except httpx.TimeoutException:
        _redis.incr("bare:timed_out")  # a call that waited for its read timeout (bench/concurrency.py)
        raise
    r.raise_for_status()
    reply = r.json()
    _redis.rpush(f"bare:{turn_id}", *[json.dumps(item) for item in reply["output"]])
    return reply


@app.task(name="bare.step")
def bare_step(turn_id: str, n: int) -> None:
    """One model call; step 0 sends the tool call, step 1 ends the turn."""
    reply = _model(turn_id)
    if n == 0:
        call = next(i for i in reply["output"] if i["type"] == "function_call")
        bare_tool.apply_async((turn_id, call["call_id"]), queue="bare_tools")
    else:
        _redis.rpush("bare:done", turn_id)


@app.task(name="bare.tool")
def bare_tool(turn_id: str, call_id: str) -> None:
    """The tool call: append its output, send the next step."""
    _redis.rpush(f"bare:{turn_id}", json.dumps({"type": "function_call_output", "call_id": call_id, "output": "ok"}))
    bare_step.apply_async((turn_id, 1), queue="bare")


# P1's floor (``bench/step_chain.py``): a turn of ``total`` steps, each a model call then the
# leanest Celery shape of "run the tool, then the next step": ``chain(tool | next step)``.
@app.task(name="bare.chain_step")
def bare_chain_step(turn_id: str, n: int, total: int) -> None:
    """Model call ``n``; then ``chain(tool, step n + 1)`` until ``total`` steps ran."""
    reply = _model(turn_id)
    if n + 1 >= total:
        _redis.rpush("bare:done", turn_id)
        return
    call = next(i for i in reply["output"] if i["type"] == "function_call")
    tool = bare_chain_tool.si(turn_id, call["call_id"]).set(queue="bare_tools")
    step = bare_chain_step.si(turn_id, n + 1, total).set(queue="bare")
    (tool | step).apply_async()


@app.task(name="bare.chain_tool")
def bare_chain_tool(turn_id: str, call_id: str) -> None:
    """The tool call of a chained step: append its output."""
    _redis.rpush(f"bare:{turn_id}", json.dumps({"type": "function_call_output", "call_id": call_id, "output": "ok"}))
