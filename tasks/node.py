"""A tools worker's start as a node that holds homes (``docs/placement.md``).

A worker that consumes the ``tools`` queue hosts homes: at ``celeryd_after_setup`` (after ``-Q``
was applied, before the pool forks) it adds its node's queue, ``tools.node.<node>``, to the queues
it consumes (Celery's documented way to add a queue at start), names the node for the engine
(``tasks.placement.set_hosted``), and starts two threads in its main process: the node's heartbeat
in the placement records, and its chores (snapshots of changed homes, drain passes). A warm
shutdown snapshots what changed since the last snapshot.
"""

from __future__ import annotations

import logging
import platform
import threading
from typing import Any

from celery.signals import celeryd_after_setup, worker_shutdown
from kombu import Queue

from tasks.placement import node_homes, set_hosted
from tasks.runtime import redis_client
from worker.placement.homes import node_name
from worker.placement.keeper import Keeper
from worker.placement.records import node_queue
from worker.placement.restorer import python_has_tarfile_fixes
from worker.settings import get_settings

log = logging.getLogger("agent.placement")

_stop = threading.Event()
_keeper: Keeper | None = None


@celeryd_after_setup.connect
def _host_homes(sender: object = None, instance: Any = None, **_: object) -> None:
    global _keeper
    if instance is None or "tools" not in instance.app.amqp.queues.consume_from:
        return
    settings = get_settings()
    node = node_name(settings)
    queue = node_queue(node)
    instance.app.amqp.queues.select_add(Queue(queue, routing_key=queue))
    set_hosted(node)
    homes = node_homes(redis_client(), settings)
    assert homes is not None
    _keeper = Keeper(
        homes,
        settings.snapshot_interval,
        call_wait=settings.tool_time_limit + 30,
        concurrency=settings.snapshot_concurrency,
    )
    beat = threading.Thread(
        target=_keeper.run_beats, args=(_stop, settings.liveness_ttl / 3), name="agent-home-beat", daemon=True
    )
    chores = threading.Thread(target=_keeper.run_chores, args=(_stop,), name="agent-home-chores", daemon=True)
    beat.start()
    chores.start()
    log.info("node %s: homes in %s, queue %s, snapshots %s", node, homes.root, queue, homes.store and homes.store.url)
    if homes.store is not None and not python_has_tarfile_fixes():
        log.warning(
            "node %s: Python %s lacks the tarfile fixes of CVE-2025-4517 and its siblings; restores never extract "
            "with tarfile (they are written member by member as the agent), but run the nodes on Python 3.11.13, "
            "3.12.11, 3.13.4 or later as a second wall (docs/isolation.md)",
            node,
            platform.python_version(),
        )


@worker_shutdown.connect
def _last_snapshots(**_: object) -> None:
    _stop.set()
    if _keeper is None:
        return
    try:
        _keeper.snapshot_all()
    except Exception:  # a shutdown goes on; the last periodic snapshot stays the restore point
        log.exception("snapshots at shutdown of %s failed", _keeper.node)
    finally:
        _keeper.scheduler.stop()
