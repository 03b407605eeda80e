"""How the engine's decisions become Celery messages (the ``Dispatcher`` of ``worker.turn.engine``).

Tasks are named, not imported (``tasks.turns`` imports the engine that holds this
dispatcher), so the names below must match the ``@app.task(name=...)`` in ``tasks.turns``.
Sent by name, a task's own ``ignore_result`` is unknown to Celery, so each send says it:
results live in the turn store, and a result subscription would open a connection to the
result backend for every message.
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Mapping

from kombu.exceptions import BatchPublishError, OperationalError  # type: ignore[attr-defined]  # kombu 5.7; not in the stubs yet

from tasks.app import app, broker_connection
from tasks.message_template import MessageTemplate
from tasks.recorded_publish import RecordingProducer, Unrecordable
from tasks.services import turn_services
from worker.placement.records import Placement, node_queue
from worker.redis_connection import RedisEndpoint, redis_endpoint
from worker.settings import get_settings
from worker.tooling.contract import ToolServices
from worker.turn.dispatch import Batch
from worker.turn.guard import MessageCommands
from worker.turn.interfaces import ComputerCalls
from worker.turn.outage import BrokerUnavailable, until_redis_answers
from worker.turn.request import TurnRequest

TURN_STEP = "tasks.turns.turn_step"
TOOL_CALL = "tasks.turns.tool_call"
TURN_FINISHED = "tasks.turns.turn_finished"
COUNT_ENDED = "tasks.turns.count_ended"

# Options of every message the dispatcher sends. Results live in the turn store, so no result is
# kept. Flower's labels are given (``argsrepr``, and ``kwargsrepr`` of no kwargs), so Celery does
# not build them with ``saferepr``. Nothing is declared first (``declare=[]``): on the Redis
# transport a message to a queue goes through the default exchange straight to the queue's list,
# which needs no declaration (the worker consuming the queue declares it); kombu would otherwise
# copy and bind the Queue entity on every publish only to find it declared already.
SEND_OPTIONS: dict[str, Any] = {"ignore_result": True, "kwargsrepr": "{}", "declare": []}

# The message header of a ``tool_call`` that says whether its task may claim the call with its first
# read: the end of its ``call_started`` event, or "" (``Plan.started_at_once``).
STARTED_HEADER = "call_started"

# What sends one message, given extra ``apply_async`` options (``publish``).
Sender = Callable[[dict[str, Any]], Any]
# A template's key: the task, its queue and the custom headers its messages carry.
TemplateKey = tuple[str, str, tuple[str, ...]]


def _call_label(turn_id: str, step: int, call_id: str, labels: Mapping[str, str] | None) -> str:
    """What Flower shows as a ``tool_call``'s args: ``labels[call_id]``, else ``turn= step= call=``."""
    return (labels or {}).get(call_id) or f"turn={turn_id} step={step} call={call_id}"


class _Sent:
    """What ``app.send_task`` returns for a message ``_send`` sends: the task's id, nothing else.

    Celery builds an ``AsyncResult`` for every message it sends (a promise, weak references) and
    adds it to the sending task's trail; nothing here reads either (results live in the turn
    store, and no task waits on another), and building them was a tenth of the cost of a
    message (bench/README.md, "Worker CPU per turn, second pass")."""

    __slots__ = ("id", "ignored")

    def __init__(self, task_id: str):
        self.id = task_id


def _send(name: str, args: tuple[Any, ...], options: dict[str, Any]) -> None:
    """Send task ``name`` with ``args`` and ``apply_async``'s ``options`` through ``app.send_task``:
    the message ``app.signature(name, args).apply_async(**options)`` sends (the task's own options
    merged by ``send_task``, as by ``Task.apply_async``), without the signature's and the task's
    layers or the ``AsyncResult`` (``_Sent``). Options given as None are dropped, as the signature
    drops them. Raises what ``send_task`` raises (kombu's ``OperationalError``...)."""
    given = {k: v for k, v in options.items() if v is not None}
    # celery-types types result_cls as an AsyncResult class; send_task only calls it with the id.
    app.send_task(name, args, result_cls=_Sent, add_to_parent=False, **given)  # type: ignore[arg-type]


def publish(send: Sender, what: str, *, wait: bool) -> None:
    """``send(options)``: a broker publish, ``options`` added to its ``apply_async``.

    A worker (``wait``) publishes through a kombu publish batch (``Producer.batch``, kombu 5.7):
    the task message and its ``task-sent`` event, and every message of a group, go to Redis in
    one pipeline at the end, one round trip where Celery alone takes two per message. While the
    broker does not answer (kombu's ``OperationalError``; ``BatchPublishError`` when the batch's
    pipeline failed, e.g. Redis restarting), a worker tries again with backoff up to
    ``Settings.redis_outage_timeout``: the state transition that decided this message is already
    stored, so running the whole step again would find it stale and publish nothing; the wait is
    here. A message sent twice (a batch that failed after Redis ran part of it) runs once: steps
    are fenced, calls claimed. A control plane (not ``wait``) publishes directly, with Celery's
    own publish retries, and fails at once after them. Raises ``BrokerUnavailable``."""

    def once() -> None:
        try:
            if not wait:
                send({})
                return
            with app.producer_or_acquire() as producer, producer.batch():
                send({"producer": producer})
        except (OperationalError, BatchPublishError) as exc:
            raise BrokerUnavailable(f"broker publish failed: {exc}") from exc

    if not wait:
        once()
        return
    until_redis_answers(once, what=what, timeout=get_settings().redis_outage_timeout)


class _Routes:
    """Where the app's broker channel sends a fanout publish, and which queue lists expire (for
    ``RecordingProducer``), read once per process from a channel of the broker."""

    def __init__(self, channel: Any):
        self._channel = channel
        self._topics: dict[tuple[str, str], list[str]] = {}
        self.expiring = frozenset(channel.__dict__.get("_expires") or ())

    def topics(self, exchange: str, routing_key: str) -> list[str]:
        found = self._topics.get((exchange, routing_key))
        if found is None:
            found = self._topics[(exchange, routing_key)] = list(
                self._channel._get_publish_topics(exchange, routing_key)  # kombu's Redis channel
            )
        return found


_routes: dict[int, _Routes | None] = {}


def _broker_routes() -> _Routes | None:
    """The app broker's ``_Routes`` in this process; None when the broker's keys carry a global
    prefix (the recorded ``LPUSH`` would miss it). Raises kombu's ``OperationalError`` while the
    broker is away the first time."""
    pid = os.getpid()  # a forked pool child makes its own channel
    if pid not in _routes:
        with app.producer_or_acquire() as producer:
            channel = producer.channel
            _routes[pid] = None if getattr(channel, "global_keyprefix", "") else _Routes(channel)
    return _routes[pid]


class CeleryDispatcher:
    """Turns engine decisions into Celery messages.

    - a model step: ``turn_step`` on the turn's queue (``turns``, ``background`` or ``workflow``);
    - a parallel batch: ``tool_call`` tasks on ``tools`` sharing a group id (a group, without
      Celery's result barrier);
    - a sequential batch: a ``chain`` of ``tool_call`` tasks on ``tools`` (one after another).
    No chord: the barrier is the turn store's (docs/architecture.md, "Batches").
    """

    def __init__(self, broker: RedisEndpoint | None = None, placement: Placement | None = None):
        # A control plane names its own Redis endpoint (its own user); workers use the app's broker.
        self._broker = broker
        self._broker_url = broker.celery_url() if broker is not None else None
        self._conn: Any = None
        # A worker waits a broker outage out (its step's state is already stored); a control
        # plane (its own broker) fails fast and lets its caller decide.
        self._wait = broker is None
        # The turn store's Redis as the broker would name it: a message may ride in a store
        # script only when the app's broker is that Redis (the same primary, whatever failover).
        self._store_broker_url = redis_endpoint().celery_url() if broker is None else None
        self.placement = placement
        self._routes: _Routes | None = None  # own_step_message's, once known (None: cannot record)
        self._routes_known = False
        # Built by Celery once per task, queue and headers, then written per message
        # (``tasks.message_template``); None: that message cannot be a template (Celery builds each).
        self._templates: dict[TemplateKey, MessageTemplate | None] = {}

    def _options(self) -> dict[str, Any]:
        if not self._broker_url or self._broker_url == app.conf.broker_url:
            return {}
        if self._conn is None:
            assert self._broker is not None
            self._conn = broker_connection(app, self._broker)
        return {"connection": self._conn}

    def enqueue_step(self, turn_id: str, step: int, *, queue: str, label: str = "") -> None:
        """Send ``turn_step(turn_id, step)`` to ``queue``; ``label`` is what Flower shows as its args."""
        publish(self._step_sender(turn_id, step, queue, label), f"step {step} of {turn_id}", wait=self._wait)

    def step_message(self, turn_id: str, step: int, *, queue: str, label: str = "") -> MessageCommands | None:
        """``enqueue_step``'s message (with its ``task-sent`` event) as the Redis commands that
        would send it, recorded and not sent (``tasks.recorded_publish``, from a template:
        ``tasks.message_template``), for a script that sends it with the state change that decided
        it. None when it cannot go that way: a control plane's dispatcher (its own broker), a broker
        that is not the turn store's Redis, or one that is away when the producer must connect first."""
        routes = self._routes_to_record()
        return None if routes is None else self._step_commands(routes, turn_id, step, queue, label)

    def own_step_message(self, turn_id: str, step: int, *, queue: str, label: str = "") -> MessageCommands | None:
        """``step_message`` for a control plane on its own broker, which is its turn store's Redis
        (``control.client.ControlPlane``: one endpoint for both): the commands, recorded with the
        event channels as this dispatcher's own connection names them, for the turn's creation
        script (``worker.turn.guard.CreateScript``). None when the publish cannot be recorded
        (``Unrecordable``, a global key prefix). The first call opens the connection's channel (one
        round trip); raises kombu's ``OperationalError`` when the broker is away then."""
        routes = self._own_routes()
        return None if routes is None else self._step_commands(routes, turn_id, step, queue, label)

    def _step_commands(
        self, routes: _Routes, turn_id: str, step: int, queue: str, label: str
    ) -> MessageCommands | None:
        """The commands of ``turn_step(turn_id, step)`` to ``queue`` (``label``, or the default one),
        written from the template of the process's first step message to that queue."""
        label = label or f"turn={turn_id} step={step}"
        return self._templated(
            routes,
            (TURN_STEP, queue, ()),
            lambda: self._step_sender("0" * 32, 0, queue, "-"),
            lambda: self._step_sender(turn_id, step, queue, label),
            (turn_id, step),
            label,
        )

    def _templated(
        self,
        routes: _Routes,
        key: TemplateKey,
        sample: Callable[[], Sender],
        send: Callable[[], Sender],
        args: tuple[str | int, ...],
        label: str,
        headers: dict[str, str] | None = None,
    ) -> MessageCommands | None:
        """The commands of the message ``send()`` publishes, written from the template of ``key``
        (recorded from ``sample()``'s message the first time in this process) with ``args``,
        ``label`` and the custom ``headers``' values; recorded from ``send()`` itself (Celery builds
        it) when there can be no template. Both senders are made only when used: the usual message
        needs neither. None when the publish cannot be recorded (``Unrecordable``)."""
        template = self._templates.get(key)
        if key not in self._templates or (template is not None and not template.recorded_here):
            template = MessageTemplate.record(sample(), routes.topics, routes.expiring, key[2])
            self._templates[key] = template
        if template is None or not template.usable:
            return self._record(routes, send())
        return template.message(args, label, headers)

    def _own_routes(self) -> _Routes | None:
        if self._broker is None:
            return _broker_routes()
        if not self._routes_known:
            connection = self._options().get("connection")
            if connection is None:  # the app's own broker: the process's routes
                return _broker_routes()
            channel = connection.default_channel
            self._routes = None if getattr(channel, "global_keyprefix", "") else _Routes(channel)
            self._routes_known = True
        return self._routes

    def _step_sender(self, turn_id: str, step: int, queue: str, label: str) -> Sender:
        """What sends ``turn_step(turn_id, step)`` to ``queue``, given extra ``apply_async`` options
        (a ``producer`` given there replaces this dispatcher's own connection: Celery would
        publish on a new producer of a connection passed with it)."""
        options = {**SEND_OPTIONS, "queue": queue, "argsrepr": label or f"turn={turn_id} step={step}"}

        def send(extra: dict[str, Any]) -> Any:
            own = {} if "producer" in extra else self._options()
            return _send(TURN_STEP, (turn_id, step), {**options, **own, **extra})

        return send

    def batch_message(
        self,
        turn_id: str,
        step: int,
        batch: Batch,
        *,
        queue: str,
        labels: dict[str, str] | None = None,
        started: Mapping[str, str] | None = None,
    ) -> MessageCommands | None:
        """``dispatch_batch``'s messages for a batch without computer calls, as ``step_message``
        gives its one: the Redis commands, not sent (a one-call batch's from a template), or None."""
        routes = self._routes_to_record()
        if routes is None:
            return None

        def send() -> Sender:
            return self._batch_sender(turn_id, step, batch, queue, labels, None, started)

        if len(batch.call_ids) != 1:
            return self._record(routes, send())
        (cid,) = batch.call_ids
        label = _call_label(turn_id, step, cid, labels)
        headers = {STARTED_HEADER: started.get(cid, "")} if started is not None else {}
        return self._templated(
            routes,
            (TOOL_CALL, queue, tuple(headers)),
            lambda: self._batch_sender(
                "0" * 32, 0, Batch(batch.mode, ["-"]), queue, None, None, None if started is None else {"-": ""}
            ),
            send,
            (turn_id, step, cid),
            label,
            headers,
        )

    def _routes_to_record(self) -> _Routes | None:
        """The broker's routes when this dispatcher may record its messages for a script (see
        ``step_message``), else None."""
        if not self._wait or app.conf.broker_url != self._store_broker_url:
            return None
        try:
            return _broker_routes()
        except OperationalError:
            # The broker's channel is made (and pings Redis) the first time, and the broker is
            # away: the caller sends the message the long way (``publish``), which waits the outage
            # out; this error, which no outage wait catches, would end its task with the state unsaved.
            return None

    @staticmethod
    def _record(routes: _Routes, send: Sender) -> MessageCommands | None:
        """What ``send`` publishes, recorded with ``routes``; None when ``Unrecordable``."""
        producer = RecordingProducer(routes.topics, routes.expiring)
        try:
            send({"producer": producer})
        except Unrecordable:
            return None
        return producer.commands or None  # nothing recorded: nothing may ride with the writes

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
        started: Mapping[str, str] | None = None,
    ) -> None:
        """Send the batch's ``tool_call`` tasks: one task, a group (parallel) or a chain (sequential).
        ``started``: each call's message carries its entry in the ``STARTED_HEADER`` header (``""``
        for a call absent; ``worker.turn.interfaces.Dispatcher.dispatch_batch``).
        ``labels[call_id]`` is what Flower shows as a call's args (``tool agent= turn= step= call=``);
        with ``placement``, the ``computer`` calls go to the queue of the node holding the agent's
        home (``tools.node.<node>``; placed first if it has no live node; one Redis round trip per
        batch), or to ``queue`` when no node can take it (its worker sends it on)."""
        send = self._batch_sender(turn_id, step, batch, queue, labels, computer, started)
        publish(send, f"calls of step {step} of {turn_id}", wait=self._wait)

    def _batch_sender(
        self,
        turn_id: str,
        step: int,
        batch: Batch,
        queue: str,
        labels: dict[str, str] | None,
        computer: ComputerCalls | None,
        started: Mapping[str, str] | None = None,
    ) -> Sender:
        """What sends the batch's messages, given extra ``apply_async`` options (``publish``)."""
        labels = labels or {}
        # A header, not an argument: a worker of an earlier version ignores it (and reads what its
        # own writers stored), where an unknown argument would fail its task.
        headers: dict[str, Any] = (
            {cid: {"headers": {STARTED_HEADER: started.get(cid, "")}} for cid in batch.call_ids}
            if started is not None
            else {}
        )
        queues = dict.fromkeys(batch.call_ids, queue)
        if computer is not None and self.placement is not None:
            routed = [cid for cid in batch.call_ids if cid in computer.call_ids]
            if routed:
                node = self.placement.locate(computer.agent_id).node
                queues.update(dict.fromkeys(routed, node_queue(node) if node else queue))
        call_options = {
            cid: {
                **SEND_OPTIONS,
                "queue": queues[cid],
                "argsrepr": _call_label(turn_id, step, cid, labels),
                **headers.get(cid, {}),
            }
            for cid in batch.call_ids
        }
        # A control plane on its own broker (an approval releasing a batch) sends there, not to the app's.
        options = self._options()
        if len(batch.call_ids) == 1:  # one message: sent as its signature would send it (``_send``)
            (cid,) = batch.call_ids
            return lambda extra: _send(TOOL_CALL, (turn_id, step, cid), {**call_options[cid], **options, **extra})
        sigs = [
            # Signature.set passes any option on to apply_async.
            app.signature(TOOL_CALL, (turn_id, step, cid), immutable=True).set(**call_options[cid])
            for cid in batch.call_ids
        ]
        if batch.mode == "parallel":
            # The group's messages one by one, each with the group's id and index as Celery's group
            # stamps them (Flower shows them together), in one publish batch. Celery's ``group``
            # would also subscribe to every call's result in the result backend for its barrier,
            # which nothing reads here: the barrier is the turn store's.
            group_id = str(uuid.uuid4())

            def send(extra: dict[str, Any]) -> None:
                for index, one in enumerate(sigs):
                    one.apply_async(group_id=group_id, group_index=index, **options, **extra)

            return send
        first: Any = sigs[0]
        # Celery's chain as ``chain(*sigs).apply_async`` sends it: one message, for the first
        # call, carrying the others last first (frozen: their ids known now), which the worker
        # sends one after another. Sent here because ``chain.run`` drops the ``producer``
        # option: the message would leave the publish batch (and a recording producer).
        for link in sigs[1:]:
            link.freeze()
        options = {**options, "chain": sigs[:0:-1]}
        return lambda extra: first.apply_async(**options, **extra)

    def turn_finished(self, turn_id: str) -> None:
        """The turn ended and has end hooks: send ``turn_finished(turn_id)`` to ``turns``."""
        sig = app.signature(TURN_FINISHED, (turn_id,))
        options: dict[str, Any] = {**SEND_OPTIONS, "queue": "turns", "argsrepr": f"turn={turn_id}"}
        publish(
            lambda extra: sig.apply_async(**options, **self._options(), **extra), f"end of {turn_id}", wait=self._wait
        )

    def count_ended(self, turn_id: str) -> None:
        """A control plane ended the turn: send ``count_ended(turn_id)`` to ``turns``, whose worker counts it."""
        sig = app.signature(COUNT_ENDED, (turn_id,))
        options: dict[str, Any] = {**SEND_OPTIONS, "queue": "turns", "argsrepr": f"turn={turn_id}"}
        publish(
            lambda extra: sig.apply_async(**options, **self._options(), **extra), f"count of {turn_id}", wait=self._wait
        )

    def services(self, request: TurnRequest) -> ToolServices:
        """The edge's tool services (``tasks.services.turn_services``)."""
        return turn_services()
