"""How the engine's decisions become Celery messages (the ``Dispatcher`` of ``worker.turn.engine``).

Tasks are named, not imported (``tasks.turns`` imports the engine that holds this
dispatcher), so the names below must match the ``@app.task(name=...)`` in ``tasks.turns``.
Sent by name, a task's own ``ignore_result`` is unknown to Celery, so each send says it:
results live in the turn store, and a result subscription would open a connection to the
result backend for every message.
"""

from __future__ import annotations

from typing import Any, Callable

from celery import chain, group
from kombu.exceptions import OperationalError

from tasks.app import app
from tasks.services import turn_services
from worker.placement.records import Placement, node_queue
from worker.settings import get_settings
from worker.tooling.contract import ToolServices
from worker.turn.dispatch import Batch
from worker.turn.interfaces import ComputerCalls
from worker.turn.outage import BrokerUnavailable, until_redis_answers
from worker.turn.request import TurnRequest

TURN_STEP = "tasks.turns.turn_step"
TOOL_CALL = "tasks.turns.tool_call"
TURN_FINISHED = "tasks.turns.turn_finished"


def publish(send: Callable[[], Any], what: str, *, wait: bool) -> None:
    """``send()``, a broker publish; while the broker does not answer (kombu's
    ``OperationalError`` once Celery's own publish retries are spent, e.g. Redis restarting), try
    again with backoff up to ``Settings.redis_outage_timeout`` when ``wait``. The state transition
    that decided this message is already stored, so running the whole step again would find it
    stale and publish nothing: the wait is here. A message sent twice (a group published in
    part) runs once: steps are fenced, calls claimed. Raises ``BrokerUnavailable``."""

    def once() -> None:
        try:
            send()
        except OperationalError as exc:
            raise BrokerUnavailable(f"broker publish failed: {exc}") from exc

    if not wait:
        once()
        return
    until_redis_answers(once, what=what, timeout=get_settings().redis_outage_timeout)


class CeleryDispatcher:
    """Turns engine decisions into Celery messages.

    - a model step: ``turn_step`` on the turn's queue (``turns``, ``background`` or ``workflow``);
    - a parallel batch: a ``group`` of ``tool_call`` tasks on ``tools``;
    - a sequential batch: a ``chain`` of ``tool_call`` tasks on ``tools`` (one after another).
    No chord: the barrier is the turn store's (docs/architecture.md, "Batches").
    """

    def __init__(self, broker_url: str | None = None, placement: Placement | None = None):
        # A control plane may name its own Redis; workers use the app's broker.
        self._broker_url = broker_url
        self._conn: Any = None
        # A worker waits a broker outage out (its step's state is already stored); a control
        # plane (its own broker URL) fails fast and lets its caller decide.
        self._wait = broker_url is None
        self.placement = placement

    def _options(self) -> dict[str, Any]:
        if not self._broker_url or self._broker_url == app.conf.broker_url:
            return {}
        if self._conn is None:
            self._conn = app.connection_for_write(self._broker_url)
        return {"connection": self._conn}

    def enqueue_step(self, turn_id: str, step: int, *, queue: str, label: str = "") -> None:
        """Send ``turn_step(turn_id, step)`` to ``queue``; ``label`` is what Flower shows as its args."""
        sig = app.signature(TURN_STEP, (turn_id, step))
        options: dict[str, Any] = {
            "queue": queue,
            "ignore_result": True,
            "argsrepr": label or f"turn={turn_id} step={step}",
        }
        publish(lambda: sig.apply_async(**options, **self._options()), f"step {step} of {turn_id}", wait=self._wait)

    def dispatch_batch(
        self,
        turn_id: str,
        step: int,
        batch_index: int,
        batch: Batch,
        *,
        queue: str,
        labels: dict[str, str] | None = None,
        computer: ComputerCalls | None = None,
    ) -> None:
        """Send the batch's ``tool_call`` tasks: one task, a group (parallel) or a chain (sequential).
        ``labels[call_id]`` is what Flower shows as a call's args (``tool agent= turn= step= call=``);
        with ``placement``, the ``computer`` calls go to the queue of the node holding the agent's
        home (``tools.node.<node>``; placed first if it has no live node; one Redis round trip per
        batch), or to ``queue`` when no node can take it (its worker sends it on)."""
        labels = labels or {}
        queues = dict.fromkeys(batch.call_ids, queue)
        if computer is not None and self.placement is not None:
            routed = [cid for cid in batch.call_ids if cid in computer.call_ids]
            if routed:
                node = self.placement.locate(computer.agent_id).node
                queues.update(dict.fromkeys(routed, node_queue(node) if node else queue))
        sigs = [
            # Signature.set passes any option on to apply_async; celery-types declares only some of them.
            app.signature(TOOL_CALL, (turn_id, step, cid), immutable=True).set(  # type: ignore[call-arg]
                queue=queues[cid],
                ignore_result=True,
                argsrepr=labels.get(cid) or f"turn={turn_id} step={step} call={cid}",
            )
            for cid in batch.call_ids
        ]
        # A control plane on its own broker (an approval releasing a batch) sends there, not to the app's.
        options = self._options()
        if len(sigs) == 1:
            sig: Any = sigs[0]
        elif batch.mode == "parallel":
            sig = group(sigs)
        else:
            sig = chain(*sigs)
        publish(lambda: sig.apply_async(**options), f"calls of step {step} of {turn_id}", wait=self._wait)

    def turn_finished(self, turn_id: str) -> None:
        """The turn ended and has end hooks: send ``turn_finished(turn_id)`` to ``turns``."""
        sig = app.signature(TURN_FINISHED, (turn_id,))
        options: dict[str, Any] = {"queue": "turns", "ignore_result": True, "argsrepr": f"turn={turn_id}"}
        publish(lambda: sig.apply_async(**options, **self._options()), f"end of {turn_id}", wait=self._wait)

    def services(self, request: TurnRequest) -> ToolServices:
        """The edge's tool services (``tasks.services.turn_services``)."""
        return turn_services()
