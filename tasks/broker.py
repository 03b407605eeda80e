"""The Redis broker transport, hardened against malformed queue messages.

kombu's Redis transport decodes each message popped from a queue list (``BRPOP``)
with ``json.loads`` and builds a ``Message`` from its ``properties`` without any
check; a single ``LPUSH tools x`` (not JSON) or ``LPUSH tools '{}'`` (JSON, wrong
shape) raises inside the consumer loop and the worker exits with "Unrecoverable
error", or hangs (celery#4308, celery#7975, kombu#2421: open upstream). This
transport drops such a message with a warning (queue, size and reason, never its
content) and keeps consuming. A well-formed envelope goes to Celery, which rejects a
bad body itself (``on_decode_error``); when Celery's error path raises too (an
unknown task name with a pickle body), the message is dropped the same way.

It also survives a Redis restart with tasks in flight (``Channel._connparams``).

Selected with ``broker_transport`` in ``tasks.app`` (an explicit transport wins over
the URL's scheme in kombu, so ``REDIS_URL`` stays a plain ``redis://`` URL).
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from contextlib import contextmanager
from typing import Any, Iterator

import redis
from kombu.transport import redis as kombu_redis

logger = logging.getLogger(__name__)

BODY_ENCODINGS = (None, "base64")  # what kombu's virtual channel can decode


def malformed_reason(message: Any) -> str | None:
    """Why ``message`` (a decoded queue payload) cannot be turned into a kombu ``Message``,
    or ``None`` when it can. Mirrors what ``kombu.transport.virtual.Message`` and the Redis
    channel's ack/restore read: ``properties.delivery_tag`` (str), ``properties.delivery_info``
    (dict with string ``exchange`` and ``routing_key``), an optional string ``body`` in a known
    ``body_encoding``, optional dict ``headers``."""
    if not isinstance(message, dict):
        return f"not a JSON object ({type(message).__name__})"
    props = message.get("properties")
    if not isinstance(props, dict):
        return "no properties object"
    if not isinstance(props.get("delivery_tag"), str):
        return "no delivery_tag string"
    info = props.get("delivery_info")
    if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in ("exchange", "routing_key")):
        return "no delivery_info with exchange and routing_key"
    if message.get("headers") is not None and not isinstance(message["headers"], dict):
        return "headers is not an object"
    for field in ("content-type", "content-encoding"):
        if message.get(field) is not None and not isinstance(message[field], str):
            return f"{field} is not a string"
    body = message.get("body")
    encoding = props.get("body_encoding")
    if encoding not in BODY_ENCODINGS:
        return "unknown body_encoding"
    if body is not None and not isinstance(body, str):
        return "body is not a string"
    if body and encoding == "base64":
        try:
            base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            return "body is not valid base64"
    return None


def _dropped(queue: str, size: int | None, reason: str) -> None:
    logger.warning("dropped a malformed message from queue %r (%s bytes): %s", queue, size, reason)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a queue item that is not JSON is dropped instead of killing the loop."""

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        # kombu builds a new redis-py client for every publish, ack and event (stock
        # ``conn_or_acquire``); in redis-py 8 that construction is the largest cost of a
        # publish under a threads pool (measured: ~15% of the steps worker's CPU at 1,000 turns).
        # One client per channel and pool: a redis-py client is thread-safe (each command takes
        # a connection from the pool), and a new pool after a reconnect gets a new client.
        if client:
            yield client
            return
        pool = self.pool
        cached = self.__dict__.get("_sync_client")
        if cached is None or cached.connection_pool is not pool:
            # kombu's Channel._create_client: the stubs (celery-types) omit the redis Channel's private methods.
            cached = self.__dict__["_sync_client"] = self._create_client()  # type: ignore[attr-defined]
        yield cached

    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        # While the consumer reconnects after a Redis restart, kombu closes this channel and
        # restores its unacked messages through a new client, after the transport's connection
        # is already gone: ``self.connection.client`` is None and the AttributeError ("'NoneType'
        # object has no attribute 'hostname'") ends the worker (seen in 3 of 6 restarts with
        # tasks in flight; kombu#582 is the same path). As a connection error it is one kombu's
        # close path ignores: the unacked messages come back through ``visibility_timeout``,
        # and the watchdog re-drives their turns long before (``tasks.liveness``).
        if self.connection is None or getattr(self.connection, "client", None) is None:
            raise redis.ConnectionError("the broker connection is closed")
        # celery-types omits the redis Channel's private methods.
        return dict(super()._connparams(asynchronous=asynchronous))  # type: ignore[misc]

    def _brpop_read(self, **options: Any) -> bool:
        try:
            return bool(super()._brpop_read(**options))  # type: ignore[misc]  # as above
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            # The item was already popped (BRPOP): nothing to give back. The rotation to the
            # next queue happened before decoding, so the other queues keep their turn.
            _dropped("?", None, f"not JSON ({type(exc).__name__})")
            return True


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with ``Channel`` above and a shape check before delivery."""

    Channel = Channel

    def _deliver(self, message: Any, queue: str | None) -> None:
        reason = malformed_reason(message)
        if reason is not None:
            _dropped(queue or "?", len(json.dumps(message)), reason)
            return
        try:
            super()._deliver(message, queue)
        except self.connection_errors:
            raise  # kombu reconnects on these
        except Exception as exc:
            # A well-formed envelope whose payload Celery's own error path cannot handle: e.g.
            # an unknown task name with a pickle or non-JSON body (on_unknown_task decodes the
            # body and raises ContentDisallowed / DecodeError out of the consumer loop).
            _dropped(queue or "?", len(json.dumps(message)), f"the consumer failed on it ({type(exc).__name__})")
            self._forget(message["properties"]["delivery_tag"])

    def _forget(self, delivery_tag: str) -> None:
        """Ack a dropped message that was already registered as unacked (so it is not restored)."""
        for channel in self.channels or ():
            if delivery_tag in getattr(channel.qos, "_delivered", {}):
                channel.qos.ack(delivery_tag)
