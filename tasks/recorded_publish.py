"""A producer that records what a publish would send to Redis instead of sending it.

The dispatcher hands a turn's next message to the guarded script that decides it
(``worker.turn.guard.Writes.send_message``): the script pushes the message onto its queue's list
and publishes its ``task-sent`` event, atomically with the state change. Celery still builds the
message: ``Signature.apply_async`` is called as for a real send (routing, the task's options,
protocol-2 headers, parent and root ids, ``before_task_publish``/``after_task_publish`` and their
handlers in ``tasks.telemetry`` and ``tasks.queue_metrics``, the ``task-sent`` event from its event
dispatcher's clock), with ``RecordingProducer`` as its producer. Celery calls only the producer's
``publish`` (once for the message, once for the event) and ``connection`` (and, publishing a
worker's callback, its ``recoverable_connection_errors`` and the producer's ``revive``).

What ``publish`` records is what kombu's Redis channel would write for the same call
(``kombu.Producer.publish``, then ``kombu.transport.virtual.Channel.basic_publish`` and the Redis
channel's ``_put``/``_put_fanout``): the body serialized with the named serializer and base64
encoded (the virtual channel's body encoding), the properties with ``delivery_mode`` as kombu maps
it, ``priority``, ``delivery_info`` and a new ``delivery_tag``; a message to the default exchange
as ``LPUSH`` onto its queue's list, a message to a fanout exchange (Celery's events on Redis) as
``PUBLISH`` on each of the channel's topics for it. Going through kombu's producer instead cost
about half the CPU of a whole send (its retry wrapper, declarations, a pooled producer and two
envelopes written with the standard library's JSON encoder): ~0.35 ms a message on a two-core
node, twice per step. ``tests/integration/test_publish_batch.py`` compares the records with what the real
publish writes to Redis.

A publish the recorder cannot reproduce raises ``Unrecordable`` (the caller sends the message
the long way): compression, a per-message expiration, a priority other than 0 (kombu routes it to
another list), another exchange type, a queue list that expires, a global key prefix.
"""

from __future__ import annotations

import base64
import uuid
from contextlib import nullcontext
from typing import Any, Callable

from kombu.entity import maybe_delivery_mode
from kombu.serialization import dumps as serialize

from tasks.serialization import json_dumps
from worker.turn.guard import MessageCommands


class Unrecordable(Exception):
    """A publish ``RecordingProducer`` cannot reproduce as Redis commands (see the module docstring)."""


class _Connection:
    """What Celery's ``send_task`` uses of a producer's connection: its error translation, and the
    errors a callback's publish retries (``celery.app.amqp._publish_retry_errors``, read when a
    worker publishes a task's callbacks): none, as recording sends nothing."""

    recoverable_connection_errors: tuple[type[BaseException], ...] = ()

    @staticmethod
    def _reraise_as_library_errors() -> Any:
        return nullcontext()


class RecordingProducer:
    """A kombu ``Producer`` stand-in for ``apply_async(producer=...)``: records each publish as the
    Redis commands kombu's Redis channel would send (``commands``: ``MessageCommands``, in order).

    ``topics(exchange, routing_key)`` gives the pub/sub channels of a fanout publish as the broker's
    channel names them (``kombu.transport.redis.Channel._get_publish_topics``); ``expiring`` is the
    set of queue lists that expire (kombu's ``x-expires`` queues), refused.
    """

    connection = _Connection()

    def revive(self, channel: Any) -> None:
        """Nothing to reconnect (Celery revives a producer between a callback's publish retries)."""

    def __init__(self, topics: Callable[[str, str], list[str]], expiring: frozenset[str] = frozenset()):
        self.commands: MessageCommands = []
        self._topics = topics
        self._expiring = expiring

    def publish(
        self,
        body: Any,
        routing_key: str | None = None,
        delivery_mode: Any = None,
        priority: int = 0,
        serializer: str | None = None,
        headers: dict[str, Any] | None = None,
        compression: str | None = None,
        exchange: Any = None,
        declare: list[Any] | None = None,
        expiration: float | None = None,
        content_type: str | None = None,
        content_encoding: str | None = None,
        **properties: Any,
    ) -> None:
        """Record the commands of ``kombu.Producer.publish`` with these arguments. Raises
        ``Unrecordable`` as the module docstring says."""
        if compression or expiration is not None or priority:
            raise Unrecordable("compression, expiration or priority")
        exchange_name = getattr(exchange, "name", exchange) or ""
        for option in ("retry", "retry_policy", "timeout", "confirm_timeout", "mandatory", "immediate"):
            properties.pop(option, None)
        data: str | bytes
        if not content_type:  # kombu's Producer._prepare: serialized here
            content_type, content_encoding, data = serialize(body, serializer=serializer)
        elif isinstance(body, str):  # given serialized: sent as it is
            content_encoding = content_encoding or "utf-8"
            data = body.encode(content_encoding)
        else:
            content_encoding, data = content_encoding or "binary", body
        raw = data if isinstance(data, bytes) else data.encode()  # the virtual channel's base64 codec
        # No delivery mode given: an ``Exchange``'s, else the producer's default exchange's (none).
        properties["delivery_mode"] = maybe_delivery_mode(delivery_mode or getattr(exchange, "delivery_mode", None))
        properties["delivery_info"] = {"exchange": exchange_name, "routing_key": routing_key or ""}
        properties["priority"] = 0
        properties["body_encoding"] = "base64"
        properties["delivery_tag"] = str(uuid.uuid4())
        message = {
            "body": base64.b64encode(raw).decode(),
            "content-encoding": content_encoding,
            "content-type": content_type,
            "headers": headers or {},
            "properties": properties,
        }
        payload = json_dumps(message).encode()
        if not exchange_name:  # the default exchange: the routing key is the queue
            if not routing_key or routing_key in self._expiring:
                raise Unrecordable(f"queue {routing_key!r}")
            self.commands.append(("LPUSH", routing_key, payload))
            return
        declared = {getattr(e, "name", None): getattr(e, "type", None) for e in declare or []}
        if declared.get(exchange_name) != "fanout":
            raise Unrecordable(f"exchange {exchange_name!r} is not a declared fanout exchange")
        for topic in self._topics(exchange_name, routing_key or ""):
            self.commands.append(("PUBLISH", topic, payload))
