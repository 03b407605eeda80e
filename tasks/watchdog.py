"""The watchdog, run by celery beat every ``Settings.watchdog_interval`` seconds:

- rejects tool calls nobody approved before their approval deadline
  (``worker.turn.gate.ApprovalGate.expire``), which resumes their turns;
- re-drives every turn held by a worker node whose heartbeat stopped (``tasks.liveness``): a
  killed worker's turns recover within about ``2 * liveness_ttl``, not after the broker's
  ``visibility_timeout``; a node's supervisor that sees its process exit calls ``recover_node``
  itself, at once (``devtools.node_recovery``);
- once after each Redis restart or failover, and after a node's death, re-drives the active turns
  no message names and no node holds (``unnamed_turns_redriven``: a message lost with the crash
  or the failover, or popped by the dying process and not yet recorded as fetched);
- re-drives the turns whose tool calls wait in the queue of a node that died holding homes
  (``tasks.placement.rescue_dead_queues``): their calls are re-sent through placement;
- re-drives turns whose progress deadline passed (a lost message, a crash between barrier and
  enqueue), failing a turn after ``Settings.max_redrives`` re-drives without progress;
- re-sends the end hooks of ended turns whose hooks never reported done.

A turn whose owner is alive is never re-driven for taking long: its deadline covers the longest
single wait (``Settings.progress_timeout``); a turn parked on approvals holds nothing to re-drive.

The sweep runs every second, so it sends no task events (``send_events=False``), and beat sends
it without a ``task-sent`` event (``tasks.beat``): it never fills Flower's task list. When it failed turns, it sends ``tasks.watchdog.turns_failed``, a task
Flower does show, which reports FAILURE (``TurnFailed`` naming them), so that those turns show
as failures like the ones a step ends (``tasks.turns``).
"""

from __future__ import annotations

import time
from typing import Any

from tasks.app import QUEUES, app
from tasks.broker import orphaned_deliveries, restore, turns_named_by_messages
from tasks.liveness import TURN_TASKS
from tasks.placement import rescue_dead_queues
from tasks.runtime import get_engine
from tasks.turns import TurnFailed
from worker.placement.records import QUEUE_PREFIX, Placement
from worker.turn.engine import TurnEngine
from worker.turn.request import TurnStatus


def recover_node(
    engine: TurnEngine, node: str, *, known_dead: bool = False, taken: set[str] | None = None
) -> dict[str, str]:
    """Re-drive the turns that dead ``node`` (``host:pid``) held; returns ``{turn_id: action}``.

    ``known_dead``: its supervisor saw the process exit (drop the heartbeat now, no grace; the
    task ids it held are added to ``taken``); otherwise the watchdog found the heartbeat expired.
    Raises redis errors."""
    limit = engine.settings.max_redrives
    if known_dead:
        held = engine.liveness.bury(node)
        if taken is not None:
            taken.update(held)
        turns = set(held.values())
    else:
        turns = engine.liveness.take_held_turns(node)
    return {t: engine.redrive(t, limit, reason=f"worker {node} stopped").action for t in sorted(turns)}


def restore_orphans(engine: TurnEngine, *, before: float, skip: frozenset[str] | set[str] = frozenset()) -> int:
    """Give back to their queues the turn messages fetched before ``before`` (``time.time()``) that
    no live node holds, nor ``skip`` (task ids whose turns were just re-driven): a process that died
    between fetching a message and recording it as held (``tasks.liveness``) left it in the
    broker's ``unacked`` until ``visibility_timeout``. A message given back twice runs once (steps
    are fenced, calls claimed). Returns how many. Raises redis errors."""
    held = set(engine.liveness.held_by_live_nodes()) | set(skip)
    found = orphaned_deliveries(engine.redis, before=before, held=held, tasks=TURN_TASKS)
    if not found:
        return 0
    with app.connection_for_write() as conn:
        return restore(conn.default_channel, [tag for tag, _ in found])


# After a Redis restart or a failover: wait this long (reconnects, held tasks written again), then
# compare once.
SETTLE_AFTER_RESTART = 3.0
# A turn that progressed this recently may be between two messages: not judged.
QUIET_FOR = 3.0
# The re-drive's reason after a node's death (not "worker ... stopped": that names the node's own turns).
NODE_DEATH_REASON = "no message named it after the death of node {}"
# When the watchdog first saw a Redis run (``redis_run``), and whether it reconciled after it.
RUN_SEEN_KEY = "agent:run-seen:{}"
RECONCILED_KEY = "agent:reconciled:{}"


def redis_run(r: Any) -> tuple[str, float]:
    """The primary's run, as ``(id, uptime seconds)``: the id changes when the server restarts
    (``run_id``) and when a replica is promoted (``master_replid``: a new replication history;
    its ``run_id`` is older than the failover). Raises redis errors."""
    with r.pipeline(transaction=False) as p:
        p.info("server")
        p.info("replication")
        server, replication = p.execute()
    return f"{server.get('run_id')}:{replication.get('master_replid')}", float(server.get("uptime_in_seconds", 0))


def reconcile_after_restart(engine: TurnEngine) -> dict[str, str]:
    """Once per Redis run (``redis_run``: a restart, or a failover to a promoted replica), once it
    has run ``SETTLE_AFTER_RESTART`` s and the watchdog first saw it that long ago: re-drive every
    active turn that no message names (queued or fetched) and no node holds (a dead node's held
    turns are the dead-node path's).

    A Redis crash can take a message with it: popped by a consumer (``BRPOP``) whose next command,
    recording it as fetched, found Redis gone; a failover also loses what the replica had not
    received yet (a message pushed in the last milliseconds: docs/failover.md). Nothing else would
    name that turn before its progress deadline. A turn parked on approvals, that progressed in the
    last ``QUIET_FOR`` s, or whose deadline already passed (the progress deadline re-drives it in
    the same sweep), is left alone. Returns ``{turn_id: action}``. Raises redis errors."""
    r = engine.redis
    run, uptime = redis_run(r)
    now = time.time()
    with r.pipeline(transaction=False) as p:
        p.set(RUN_SEEN_KEY.format(run), now, nx=True, ex=86400)
        p.get(RUN_SEEN_KEY.format(run))
        _, seen = p.execute()
    if uptime < SETTLE_AFTER_RESTART or now - float(seen or now) < SETTLE_AFTER_RESTART:
        return {}
    if not r.set(RECONCILED_KEY.format(run), now, nx=True, ex=86400):
        return {}
    return unnamed_turns_redriven(engine, "no message after a Redis restart or failover")


def unnamed_turns_redriven(engine: TurnEngine, reason: str) -> dict[str, str]:
    """Re-drive every active turn that made no progress in the last ``QUIET_FOR`` s, that no
    message names (queued or fetched) and that no node holds (a dead node's held turns are the
    dead-node path's), with ``reason``. A turn parked on approvals, or whose deadline already
    passed (the progress deadline re-drives it in the same sweep), is left alone. Run after a
    Redis restart or failover, and after a node's death: a message the dying process had popped
    from its queue and not yet recorded as fetched is in no queue, no ``unacked`` and no held set,
    and nothing else would name its turn before the progress deadline. Returns
    ``{turn_id: action}``. Raises redis errors."""
    r = engine.redis
    now = time.time()
    quiet_since = now + engine.settings.progress_timeout - QUIET_FOR
    # Overdue turns are left to the progress deadline, in this same sweep.
    watched = set(engine.store.watched_between(now, quiet_since))
    if not watched:
        return {}
    node_queues = [q.decode() for q in r.scan_iter(match=f"{QUEUE_PREFIX}*", _type="list")]
    named = turns_named_by_messages(r, [*QUEUES, *node_queues], TURN_TASKS)
    # Held by a node, live or dead and not yet recovered: the dead-node path re-drives the latter
    # (with its own reason, after its grace); judged here they were re-driven twice.
    named |= set(engine.liveness.held_by_known_nodes().values())
    done: dict[str, str] = {}
    for turn_id in sorted(watched - named):
        state = engine.store.load(turn_id)
        if state is None or state.status.terminal or state.status == TurnStatus.awaiting_approval:
            continue
        done[turn_id] = engine.redrive(turn_id, engine.settings.max_redrives, reason=reason).action
    return done


@app.task(name="tasks.watchdog.sweep", acks_late=True, send_events=False)
def sweep() -> dict[str, str]:
    """Re-drive every overdue turn once; returns ``{turn_id: action}``. Sends ``turns_failed``
    (after everything is done) when it failed turns that made no progress."""
    engine = get_engine()
    limit = engine.settings.max_redrives
    done: dict[str, str] = {}
    for turn_id, n in engine.approvals.expire().items():  # before the re-drives: an expiry resumes the turn
        done[turn_id] = f"{n} approvals expired"
    dead = engine.liveness.dead_nodes()
    for node in dead:
        done.update(recover_node(engine, node))
    if dead:  # a heartbeat gone for a TTL: what the node fetched before then is nobody's now
        restore_orphans(engine, before=time.time() - engine.settings.liveness_ttl)
        for turn_id, action in unnamed_turns_redriven(engine, NODE_DEATH_REASON.format(dead[0])).items():
            done.setdefault(turn_id, action)
    done.update(reconcile_after_restart(engine))
    for node, turns in rescue_dead_queues(Placement(engine.redis, engine.settings.liveness_ttl)).items():
        for turn_id in sorted(turns - set(done)):
            done[turn_id] = engine.redrive(turn_id, limit, reason=f"home node {node} stopped").action
    for turn_id in engine.store.overdue():
        if turn_id not in done:
            done[turn_id] = engine.redrive(turn_id, limit).action
    for turn_id in engine.store.hooks_overdue():  # a lost turn_finished message
        engine.dispatcher.turn_finished(turn_id)
        done[turn_id] = "hooks re-sent"
    engine.store.listing.prune()  # the listing index's old entries (no longer pruned at each creation)
    failed = sorted(t for t, action in done.items() if action == "failed")
    if failed:
        queue = (sweep.request.delivery_info or {}).get("routing_key") or "turns"
        # apply_async passes argsrepr on to the message; celery-types does not declare it.
        turns_failed.apply_async((failed,), queue=queue, argsrepr=f"watchdog failed {', '.join(failed)}")  # type: ignore[call-arg]
    return done


@app.task(name="tasks.watchdog.turns_failed", throws=(TurnFailed,), ignore_result=True)
def turns_failed(turn_ids: list[str]) -> None:
    """Raises ``TurnFailed`` naming the turns the watchdog failed: a FAILURE row in Flower."""
    raise TurnFailed(f"the watchdog failed {len(turn_ids)} turn(s) that made no progress: {', '.join(turn_ids)}")
