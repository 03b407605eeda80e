"""Placement at the Celery edge (``docs/placement.md``): the node a tools worker hosts, the engine's
view of it, forwarding a call to the node that holds its agent's home, and rescuing the calls
left in a dead node's queue.

The node's own start-up (consuming its queue, heartbeat, snapshots, drain) is ``tasks.node``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

from celery import Task
from kombu.simple import SimpleQueue

from tasks.app import app
from worker.placement.homes import NodeHomes
from worker.placement.records import Placement, node_queue
from worker.placement.snapshots import SnapshotStore
from worker.settings import Settings
from worker.tools.computer import homes as computer_homes

log = logging.getLogger("agent.placement")

TOOL_CALL = "tasks.turns.tool_call"

# The node whose homes this process serves: set in a tools worker's main process before its pool
# forks (``tasks.node``), inherited by prefork children. None: this process holds no home.
_hosted: str | None = None

# How long a dead node's queue is watched for calls to rescue (seconds since its last heartbeat).
RESCUE_WINDOW = 3600.0


def set_hosted(node: str | None) -> None:
    """Declare this process (and the children it forks from now on) a worker of ``node``."""
    global _hosted
    _hosted = node


def hosted() -> str | None:
    """The node this process serves, or None."""
    return _hosted


def snapshot_store(settings: Settings) -> SnapshotStore | None:
    """The configured snapshot store (``AGENT_SNAPSHOT_STORE``), or None."""
    if not settings.snapshot_store:
        return None
    return SnapshotStore(settings.snapshot_store, settings.snapshot_endpoint_url)


def node_homes(r: Any, settings: Settings) -> NodeHomes | None:
    """The engine's ``Computers`` in a process of a tools worker (None elsewhere: a turns-only
    worker, a control plane)."""
    if _hosted is None:
        return None

    def prepare(home: Path) -> tuple[int, int] | None:
        ready = computer_homes.provision(settings, home)  # its quota image mounted, owned by the agent's uid
        return (ready.uid, ready.gid) if ready.uid is not None and ready.gid is not None else None

    return NodeHomes(
        Placement(r, settings.liveness_ttl),
        settings,
        _hosted,
        snapshot_store(settings),
        prepare=prepare,
        retire=lambda home: computer_homes.release(settings, home, lazy=True),
    )


def forward(task: Task[Any, Any], queue: str) -> Any:
    """End this ``tool_call`` and send it to ``queue`` instead (``Task.replace``: same task id; the
    rest of a sequential batch's chain follows it). Links of the chain that were bound for the queue
    this one came from go to ``queue`` too: they are calls of the same agent. Raises ``Ignore``."""
    came_from = (task.request.delivery_info or {}).get("routing_key")
    # celery-types declares request.chain a str; Celery keeps the chain's remaining signatures (dicts).
    for link in cast("list[dict[str, Any]]", task.request.chain or []):
        options = link.setdefault("options", {})
        if came_from and options.get("queue") == came_from:
            options["queue"] = queue
    # Signature.set passes any option on to apply_async; celery-types declares only some of them,
    # and not the request's argsrepr either.
    sig = app.signature(TOOL_CALL, tuple(task.request.args or ()), immutable=True).set(  # type: ignore[call-arg]
        queue=queue, ignore_result=True, argsrepr=getattr(task.request, "argsrepr", None)
    )
    log.info("call %s forwarded from %s to %s", task.request.args, came_from, queue)
    return task.replace(sig)


def rescue_dead_queues(placement: Placement) -> dict[str, set[str]]:
    """Empty the queue of every node that died within ``RESCUE_WINDOW``: ``{node: turn ids}`` of
    the tool calls found there (the caller re-drives those turns; a re-drive re-sends a batch's
    missing calls through placement, to a live node). Calls dispatched to a node in the seconds
    between its death and its heartbeat's expiry would otherwise wait for their turn's progress
    deadline."""
    found: dict[str, set[str]] = {}
    dead = placement.dead_nodes(since=RESCUE_WINDOW)
    if not dead:
        return found
    with app.connection_for_write() as conn:
        for node in dead:
            queue = SimpleQueue(conn, node_queue(node))  # type: ignore[arg-type]  # kombu opens a channel on a connection
            try:
                while True:
                    try:
                        message = queue.get(block=False)
                    except queue.Empty:
                        break
                    try:
                        args = message.decode()[0]
                        if message.headers.get("task") == TOOL_CALL and args:
                            found.setdefault(node, set()).add(str(args[0]))
                    except Exception:  # an unreadable message: dropped like the broker drops one
                        log.warning("unreadable message in the queue of dead node %s dropped", node)
                    message.ack()
            finally:
                queue.close()
    return found
