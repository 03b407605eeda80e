"""The Celery application: queues, routes, serialization and reliability settings.

Queues (one per role, one worker deployment per queue):
- ``turns``: turn steps (model calls) of main text turns.
- ``tools``: tool calls (a group per run of parallel calls, a chain for sequential ones).
- ``background``: steps of background agent jobs.
- ``workflow``: steps of workflow task turns.

Reliability (Celery docs, "Optimizing" and "Redis caveats"): ``task_acks_late``,
``task_reject_on_worker_lost``, ``worker_prefetch_multiplier=1`` and a Redis
``visibility_timeout`` well above the longest task time limit (below it, Redis hands an
unacked task to a second worker while the first still runs it).
Every task is idempotent: steps are fenced by step number and tool calls
keyed by ``call_id``.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from typing import Any

from celery import Celery
from celery.signals import beat_init, worker_init, worker_ready
from kombu.entity import Queue

from tasks import telemetry  # noqa: F401  (signal handlers: trace context in headers, SDK setup)
from tasks.metrics import prepare_multiprocess_dir
from tasks.serialization import SERIALIZER, register_json_encoder, register_orjson
from worker.redis_connection import RedisEndpoint, redis_endpoint
from worker.settings import get_settings

# Before any task module imports prometheus_client (worker.turn.metrics): see tasks.metrics.
prepare_multiprocess_dir()

QUEUES = ("turns", "tools", "background", "workflow")


def make_app() -> Celery:
    """Build the Celery app from ``worker.settings`` (JSON/orjson only, queues, routes, reliability)."""
    settings = get_settings()
    register_orjson()
    register_json_encoder()  # Celery's events: still application/json, written with orjson
    app = Celery(
        "agent_runtime",
        include=["tasks.turns", "tasks.watchdog", "tasks.health", "tasks.scheduler", "tasks.liveness", "tasks.node"],
    )
    longest_task = settings.tool_time_limit + 60
    try:
        app.conf.update(**redis_conf(redis_endpoint(settings), settings.redis_max_connections, longest_task))
    except ValueError:  # a bad REDIS_URL: a worker or beat stops at start naming it (check_redis_url);
        pass  # a control plane that imports this app says so itself (control.client)
    app.conf.update(
        task_serializer=SERIALIZER,
        result_serializer=SERIALIZER,
        event_serializer="json",
        accept_content=[SERIALIZER, "json"],
        result_accept_content=[SERIALIZER, "json"],
        task_ignore_result=True,  # results live in the turn store, keyed by call_id
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_pool_limit=settings.redis_max_connections,
        redis_max_connections=settings.redis_max_connections,
        broker_connection_retry_on_startup=True,
        broker_connection_retry=True,
        broker_connection_max_retries=None,  # a Redis restart is waited out, never fatal
        task_queues=[Queue(q, routing_key=q) for q in QUEUES],
        task_default_queue="turns",
        task_routes={
            "tasks.turns.turn_step": {"queue": "turns"},
            "tasks.turns.tool_call": {"queue": "tools"},
            "tasks.watchdog.sweep": {"queue": "turns"},
            "tasks.scheduler.fire_schedule": {"queue": "turns"},
        },
        worker_send_task_events=True,
        task_send_sent_event=True,
        task_track_started=True,
        worker_hijack_root_logger=False,
        # Reconnects to the broker every 0.5-2 s instead of kombu's 2-30 s (tasks.reconnect).
        worker_consumer="tasks.reconnect:Consumer",
        # Schedules (tasks.scheduler): celery-redbeat keeps beat entries in this Redis, as JSON.
        beat_scheduler="tasks.beat:ResilientRedBeatScheduler",
        beat_max_loop_interval=min(5, settings.watchdog_interval),  # seconds: schedules fire at most this late
        beat_schedule={
            "watchdog-sweep": {
                "task": "tasks.watchdog.sweep",
                "schedule": settings.watchdog_interval,
                "options": {"expires": settings.watchdog_interval * 5},  # a sweep queued behind a backlog is skipped
            }
        },
        timezone="UTC",
    )
    return app


def redis_conf(endpoint: RedisEndpoint, max_connections: int, longest_task: float) -> dict[str, Any]:
    """Celery's Redis settings for ``endpoint`` (``worker.redis_connection``): the broker, the
    result backend and redbeat on the same Redis, through Sentinel when it has Sentinels, over
    verified TLS for ``rediss://``.

    - The broker: our hardened kombu transport (``tasks.broker``: a malformed message is dropped,
      not fatal; acks that fail while Redis is away are retried), its Sentinel variant with
      Sentinels (``master_name``, ``sentinel_kwargs``). The transport is named explicitly, so a
      ``rediss://`` URL's scheme does not turn TLS on by itself: ``broker_use_ssl`` does.
    - The result backend: Celery's ``SentinelBackend`` for ``sentinel://``; ``redis_backend_use_ssl``
      gives ``rediss://`` the ``ssl_cert_reqs`` it insists on (the server verified).
    - redbeat: its own URL and options, Sentinel-aware; TLS through ``redbeat_redis_use_ssl``.
    Connection pools are sized for an I/O pool's concurrency (kombu's default is 10 per channel: a
    threads pool of 256 ran out with "Too many connections")."""
    visibility = max(3600, int(longest_task * 4))
    sentinel = endpoint.celery_transport_options()
    ssl_options = endpoint.celery_ssl()
    redbeat_url, redbeat_options = endpoint.redbeat()
    return {
        "broker_url": endpoint.celery_url(),
        "broker_transport": broker_transport(endpoint),
        "broker_transport_options": {
            "visibility_timeout": visibility,
            "max_connections": max_connections,
            "socket_timeout": 30,
            "socket_connect_timeout": 5,
            "health_check_interval": 30,
            **sentinel,
        },
        "broker_use_ssl": ssl_options,
        "result_backend": endpoint.celery_url(),
        "result_backend_transport_options": {"visibility_timeout": visibility, **sentinel},
        "redis_backend_use_ssl": ssl_options,
        "redbeat_redis_url": redbeat_url,
        "redbeat_redis_options": redbeat_options,
        "redbeat_redis_use_ssl": ssl_options,
    }


def broker_transport(endpoint: RedisEndpoint) -> str:
    """The kombu transport for ``endpoint``: ours (``tasks.broker``), through Sentinel when it has them."""
    return "tasks.broker:SentinelTransport" if endpoint.sentinels else "tasks.broker:Transport"


def broker_connection(celery_app: Celery, endpoint: RedisEndpoint) -> Any:
    """A kombu connection of ``celery_app`` to the broker at ``endpoint`` (not the app's own: a
    control plane with its own user): its transport, Sentinel options and TLS, whatever the app's."""
    return celery_app.connection_for_write(
        endpoint.celery_url(),
        transport=broker_transport(endpoint),
        transport_options=endpoint.celery_transport_options(),
        ssl=endpoint.celery_ssl() or False,
    )


app = make_app()


@beat_init.connect
def check_redis_url(**_: object) -> None:
    """Stop the process at start, naming the variable, when ``REDIS_URL`` is not a Redis URL."""
    try:
        redis_endpoint(get_settings())
    except ValueError as exc:
        raise SystemExit(f"not started: {exc}") from exc


STEP_QUEUES = ("turns", "background", "workflow")


def check_model_calls_pool(pool_cls: Any, queues: Iterable[str], model_calls: str) -> None:
    """Raise ``ValueError`` for ``AGENT_MODEL_CALLS=inline`` in a worker whose pool (``pool_cls``,
    a Celery pool class or name) is solo and whose ``queues`` include one of steps: an inline model
    call holds the thread that runs it for as long as the model takes, and solo has one thread, so
    the whole node would wait on each call. A threads pool (or prefork, whose children always call
    inline) is what inline needs."""
    from celery.concurrency import get_implementation
    from celery.concurrency.solo import TaskPool as SoloPool

    if model_calls != "inline" or not set(queues) & set(STEP_QUEUES):
        return
    if isinstance(pool_cls, str):
        pool_cls = get_implementation(pool_cls)
    if isinstance(pool_cls, type) and issubclass(pool_cls, SoloPool):
        raise ValueError(
            "AGENT_MODEL_CALLS=inline needs a threads pool (--pool threads; make worker, run and stack: "
            "AGENT_IO_POOL=threads): an inline model call would block the solo pool's only thread"
        )


def _consumed_queues(worker: Any) -> list[str]:
    """The queues ``worker`` (a Celery ``WorkController``) consumes: its ``-Q``, else all of them."""
    consume_from = getattr(getattr(getattr(worker, "app", None), "amqp", None), "queues", None)
    names = list(getattr(consume_from, "consume_from", None) or ())
    return names or list(QUEUES)


@worker_init.connect
def _check_configuration(sender: Any = None, **_: object) -> None:
    # Fail at start, naming the variable, rather than on every turn. SystemExit, because
    # Celery logs and swallows ordinary exceptions raised by signal handlers.
    from worker.model.clients import check_background
    from worker.model.wire_styles import wire_format
    from worker.tools.toolsets import check_toolsets

    check_redis_url()
    try:
        check_toolsets(get_settings())
        wire_format(get_settings().openai_api_style)
        check_background(get_settings())
        check_model_calls_pool(getattr(sender, "pool_cls", None), _consumed_queues(sender), get_settings().model_calls)
    except ValueError as exc:
        raise SystemExit(f"worker not started: {exc}") from exc
    from worker.tools.computer.launch import startup_check

    startup_check(get_settings())  # logs the sandbox's state; AGENT_COMMAND_SANDBOX=off is a WARNING


@worker_ready.connect
def _report_provider_profile(**_: object) -> None:
    """Once, at start (logging is set up by then): the provider profile in force and why, and, when
    it carries no strict mode, which built-in tools are sent without it (a WARNING)."""
    from worker.records.result_schema import FINISH_TOOL
    from worker.tooling.provider_choice import current_choice, describe
    from worker.tooling.tool_search import TOOL_SEARCH_NAME

    log = logging.getLogger("agent.worker")
    first, *rest = describe(current_choice(), (FINISH_TOOL, TOOL_SEARCH_NAME))
    log.info("%s", first)
    for line in rest:
        log.warning("%s", line)


def init_broker_pools(celery_app: Celery) -> None:
    """Create ``celery_app``'s broker connection pool and producer pool now, in the calling thread.

    Celery creates them on the first publish, and threads publishing at once race there: the
    producer pool is made with kombu's default limit (10) and resized to ``broker_pool_limit``
    while another thread already holds a producer, and the publish fails with ``RuntimeError:
    Can't shrink pool when in use: was=2048 now=10`` (kombu#781; celery#5285, still open). The
    first tasks of a threads pool all publish at once: one turn of 1,000 failed so in a benchmark.
    """
    celery_app.pool  # noqa: B018 (the properties create the pools)
    celery_app.amqp.producer_pool  # noqa: B018


@worker_init.connect
def _init_broker_pools(**_: object) -> None:
    # Before the pool runs a task (prefork children recreate theirs after the fork, one thread each).
    init_broker_pools(app)


# Python's cyclic garbage collector, in a worker: a full collection every 700 allocations
# (CPython's default) costs little in a script, but a worker allocates for every message, and
# with hundreds of turns in flight each collection walks every live object. Measured (a step of
# a turn on the steps worker, bench/README.md, "Garbage collection"): 13% of the worker's CPU.
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Move everything alive after start-up (modules, the app, settings) out of the collector's
    reach (``gc.freeze``: a prefork child shares those pages with its parent instead of copying
    them when a collection touches them), and collect generation 0 every ``GC_THRESHOLDS[0]``
    allocations instead of 700. Garbage that is not in a cycle is freed at once as before."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@worker_init.connect
def _tune_gc(**_: object) -> None:
    tune_gc()
