"""A worker's Prometheus endpoint (``prometheus-client``): ``AGENT_METRICS_PORT`` (0: none), on
``AGENT_METRICS_ADDR`` (default 127.0.0.1; compose sets 0.0.0.0 on its internal ``ops`` network).

The metrics themselves are ``worker.turn.metrics``. A prefork worker counts in several
processes, so the client runs in multiprocess mode: every process writes its values to files
in ``PROMETHEUS_MULTIPROC_DIR`` and the worker's main process serves their sum
(prometheus-client docs, "Multiprocess Mode"). The directory must be known before the metric
objects are created: ``prepare_multiprocess_dir`` runs when ``tasks.app`` is imported, before
the task modules, creating a fresh one unless the variable names one (which must then be
emptied between runs by whoever sets it). The server starts once the pool is up (``worker_ready``),
plus ``agent_turns_in_flight`` and ``tasks.queue_metrics``'s queue and approval gauges, read from
Redis at each scrape.

Unauthenticated, like most exporters: expose the port to the Prometheus network only.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from typing import Any, Iterator

from celery.signals import worker_ready, worker_shutdown

from tasks.queue_metrics import ApprovalsWaiting, QueueBacklog

log = logging.getLogger("agent.metrics")
_state: dict[str, Any] = {"dir": None, "server": None}


def metrics_port(env: dict[str, str] | os._Environ[str] | None = None) -> int:
    """``AGENT_METRICS_PORT`` as an int (0 when unset). Raises ``ValueError`` naming it when malformed."""
    raw = (os.environ if env is None else env).get("AGENT_METRICS_PORT", "").strip() or "0"
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"AGENT_METRICS_PORT must be a port number, not {raw!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"AGENT_METRICS_PORT must be within 0-65535, not {port}")
    return port


def prepare_multiprocess_dir() -> None:
    """With metrics on and no ``PROMETHEUS_MULTIPROC_DIR``, create a fresh one (removed at shutdown).

    A malformed port is left for ``worker.settings`` to refuse at start (naming the variable).
    """
    try:
        on = metrics_port() > 0
    except ValueError:
        return
    if on and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        _state["dir"] = tempfile.mkdtemp(prefix="agent-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = _state["dir"]
        values = sys.modules.get("prometheus_client.values")
        if values is not None:
            # Already imported (e.g. by the Flower plugin the celery CLI loads): the value class was
            # chosen without the directory. Metrics created from now on (worker.turn.metrics is
            # imported with the task modules, later) take the multiprocess one.
            setattr(values, "ValueClass", values.get_value_class())  # noqa: B010 (not in its stubs)


class TurnsInFlight:
    """A collector: ``agent_turns_in_flight``, the turns queued or running (those with a progress
    deadline: ``TurnStore.watched_count``), read from Redis at scrape time (nothing when Redis fails)."""

    def __init__(self, redis_client: Any):
        from worker.turn.store import TurnStore

        self.turns = TurnStore(redis_client)

    def collect(self) -> Iterator[Any]:
        """Yield the gauge family."""
        from prometheus_client.core import GaugeMetricFamily

        try:
            n = self.turns.watched_count()
        except Exception:  # a scrape must not fail because Redis did
            log.warning("agent_turns_in_flight: Redis unavailable")
            return
        yield GaugeMetricFamily("agent_turns_in_flight", "Turns queued or running (with a progress deadline).", n)


def start_metrics_server(port: int, addr: str | None = None, queues: tuple[str, ...] = ()) -> int:
    """Serve ``/metrics`` on ``addr:port`` (default ``AGENT_METRICS_ADDR``) from this process, with the
    backlog of ``queues``; returns the port.

    Raises ``OSError`` when the address is taken (two workers given one port)."""
    from prometheus_client import CollectorRegistry, multiprocess, start_http_server

    from worker.redis_connection import redis_endpoint
    from worker.settings import get_settings

    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]  # unannotated upstream
    else:  # a process that imported prometheus_client before the directory was set: its own values
        from prometheus_client import REGISTRY

        registry = REGISTRY
    settings = get_settings()
    addr = addr or settings.metrics_addr
    client = redis_endpoint(settings).client(socket_timeout=5, socket_connect_timeout=2)
    registry.register(TurnsInFlight(client))
    registry.register(QueueBacklog(client, queues))
    registry.register(ApprovalsWaiting(client))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    _state["server"] = server
    log.info("metrics on %s:%s/metrics", addr, port)
    return port


@worker_ready.connect(weak=False)
def _on_ready(sender: Any = None, **_: Any) -> None:
    port = metrics_port()
    if port and _state["server"] is None:
        queues = tuple(sender.app.amqp.queues) if sender is not None else ()
        start_metrics_server(port, queues=queues)


@worker_shutdown.connect(weak=False)
def _on_exit(**_: Any) -> None:
    if _state["server"] is not None:
        _state["server"].shutdown()
    if _state["dir"]:
        shutil.rmtree(_state["dir"], ignore_errors=True)
