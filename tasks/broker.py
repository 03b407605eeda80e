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

It also survives a Redis restart with tasks in flight (``Channel._connparams``), and an ack
that fails because Redis is away is retried until Redis answers (``QoS``) instead of leaving the
message in ``unacked`` until ``visibility_timeout`` (an hour) redelivers it.

``orphaned_deliveries`` and ``restore`` give back, at once, the messages a dead worker had fetched
but nobody holds (``tasks.watchdog.recover_node``): without them they wait for the visibility timeout.

Selected with ``broker_transport`` in ``tasks.app`` (an explicit transport wins over
the URL's scheme in kombu, so ``REDIS_URL`` stays a plain ``redis://`` URL).
"""

from __future__ import annotations

import atexit
import base64
import binascii
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import kombu.transport as kombu_transports
import orjson
import redis
from kombu import serialization
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.json import loads as kombu_loads

from tasks.serialization import json_dumps
from worker.wide_integers import has_long_digit_run

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


# How often a process retries the acks Redis did not take (seconds), and for how long at most
# (after the visibility timeout kombu restores the message anyway).
LATE_ACK_INTERVAL = 1.0
LATE_ACK_GIVE_UP = 3600.0


class _LateAcks:
    """Acks that failed on a Redis outage: ``(unacked key, index key, delivery tag)`` retried by a
    daemon thread every ``LATE_ACK_INTERVAL`` s through ``client`` until Redis takes them."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str, str], float] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.client: Any = None

    def add(self, client: Any, key: str, index_key: str, tag: str) -> None:
        with self._lock:
            self.client = client
            self._pending[(key, index_key, tag)] = time.monotonic()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="late-acks", daemon=True)
                self._thread.start()

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def _run(self) -> None:
        while True:
            time.sleep(LATE_ACK_INTERVAL)
            with self._lock:
                items = list(self._pending.items())
                client = self.client
            if not items:
                return
            try:
                with client.pipeline() as p:
                    for (key, index_key, tag), _ in items:
                        p.zrem(index_key, tag)
                        p.hdel(key, tag)
                    p.execute()
            except (redis.ConnectionError, redis.TimeoutError):
                now = time.monotonic()
                with self._lock:
                    for k, since in items:
                        if now - since > LATE_ACK_GIVE_UP:
                            self._pending.pop(k, None)
                continue
            with self._lock:
                for k, _ in items:
                    self._pending.pop(k, None)
            logger.warning("acked %d message(s) late, after Redis came back", len(items))


LATE_ACKS = _LateAcks()

# Seconds an ack waits for others before the batch goes to Redis; a batch this large goes at once.
ACK_BATCH_DELAY = 0.05
ACK_BATCH_MAX = 256


class _AckBatches:
    """Acks sent to Redis in batches: per ``(unacked key, index key)``, one ``ZREM`` and one
    ``HDEL`` naming every tag acked in the last ``ACK_BATCH_DELAY`` s (kombu: both per message), by
    a daemon thread of the process that acks. An ack is also kombu's in-memory bookkeeping, which
    ``QoS.ack`` does at once (the prefetch slot is free at once). A process that dies before its
    batch went leaves those messages in ``unacked``: they are delivered again (the visibility timeout,
    or at once by the node recovery) and fenced out as any redelivery (docs/architecture.md,
    "Commands per turn"). Redis errors hand the batch to ``LATE_ACKS``."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, str], tuple[Any, list[str]]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, client: Any, key: str, index_key: str, tag: str) -> None:
        with self._lock:
            _, tags = self._pending.setdefault((key, index_key), (client, []))
            tags.append(tag)
            full = len(tags) >= ACK_BATCH_MAX
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ack-batches", daemon=True)
                self._thread.start()
        if full:
            self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(ACK_BATCH_DELAY)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Send every pending ack now (also at a channel's close and at exit)."""
        with self._lock:
            batches, self._pending = self._pending, {}
        for (key, index_key), (client, tags) in batches.items():
            try:
                with client.pipeline(transaction=False) as p:
                    p.zrem(index_key, *tags)
                    p.hdel(key, *tags)
                    p.execute()
            except Exception as exc:  # a Redis outage above all: retried until it answers
                logger.warning("%d ack(s) deferred until Redis answers: %s", len(tags), exc)
                for tag in tags:
                    LATE_ACKS.add(client, key, index_key, tag)

    def reset_after_fork(self) -> None:
        """A forked child neither acks nor inherits the parent's thread or lock state."""
        self.__init__()  # type: ignore[misc]


ACKS = _AckBatches()
os.register_at_fork(after_in_child=ACKS.reset_after_fork)
atexit.register(ACKS.flush)


# Set in a prefork node (``record_fetched_turns``): the node's held hash and the turn tasks.
_held_hash: tuple[str, frozenset[str]] | None = None


def record_fetched_turns(held_key: str | None, tasks: frozenset[str] = frozenset()) -> None:
    """Have ``QoS.append`` record each fetched message of ``tasks`` in the hash ``held_key``
    (``task_id`` -> turn id, ``worker.turn.liveness``) in the same round trip as kombu's own
    record of the fetch (``unacked``); None stops it."""
    global _held_hash
    _held_hash = (held_key, tasks) if held_key else None


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS; an ack that Redis does not take (it is restarting) is retried, not lost.

    Stock kombu raises, Celery logs "Couldn't ack ..." and the message stays in ``unacked`` until
    ``visibility_timeout`` passes, then runs again (dropped by fencing, an hour later).

    In a prefork node (``record_fetched_turns``) a fetched turn task is also recorded as held by
    the node, in the pipeline that records the fetch: no round trip of its own on the consumer.
    The record is written with orjson (``json_dumps``), and acks go to Redis in batches (``ACKS``)."""

    @contextmanager
    def pipe_or_acquire(self, pipe: Any = None, client: Any = None) -> Iterator[Any]:
        """kombu's, with a plain pipeline instead of ``MULTI``/``EXEC``: the fetch's record (``HSET``
        of the payload, ``ZADD`` of its time) and the ack's removal (``ZREM``, ``HDEL``) go in one
        round trip as before, in 2 commands each instead of 4 (Redis counts ``MULTI`` and ``EXEC``).
        The transaction bought nothing: the restore paths (``restore_by_tag``, the visibility
        sweep) ``WATCH`` the ``unacked`` hash and read the payload in their own transaction, which a
        concurrent ``HDEL`` aborts and retries either way, and a restore of a tag whose payload is
        gone only drops the tag. A ``pipe`` given (kombu's restore transaction) is used as is."""
        if pipe is not None:
            yield pipe
            return
        with self.channel.conn_or_acquire(client) as conn:  # type: ignore[attr-defined]  # the Redis channel's
            yield conn.pipeline(transaction=False)

    def append(self, message: Any, delivery_tag: str) -> None:
        held = _held_hash
        turn = _turn_of_payload(message._raw, held[1]) if held is not None else None
        task_id = (message.headers or {}).get("id")
        delivery = message.delivery_info
        # What kombu's own append writes: ``[payload, exchange, routing key]``. The payload's text is
        # the one just popped when ``loads`` decoded it (``_last_popped``: the same dict, so the same
        # value), spliced in as it came instead of encoded again; otherwise encoded with orjson where
        # kombu's JSON would write the same (``json_dumps``: typed values go through kombu's).
        popped = _last_popped
        if popped is not None and popped[0] is message._raw:
            route = orjson.dumps([delivery["exchange"], delivery["routing_key"]])
            raw: str | bytes = b"[" + popped[1] + b"," + route[1:]
        else:
            raw = json_dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        with self.pipe_or_acquire() as pipe:
            pipe.hset(self.unacked_key, delivery_tag, raw)
            pipe.zadd(self.unacked_index_key, {delivery_tag: time.time()})
            if held is not None and turn is not None and task_id:
                pipe.hset(held[0], task_id, turn)
            pipe.execute()
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        """kombu's in-memory ack now; the Redis side in the process's next batch (``ACKS``)."""
        with self.channel.conn_or_acquire() as client:  # type: ignore[attr-defined]  # the Redis channel's
            ACKS.add(client, self.unacked_key, self.unacked_index_key, delivery_tag)
        virtual.QoS.ack(self, delivery_tag)


class Channel(kombu_redis.Channel):
    """kombu's Redis channel; a queue item that is not JSON is dropped instead of killing the loop."""

    QoS = QoS

    def close(self) -> None:
        """The pending acks go first (``ACKS``), then kombu's close (which gives back what is not acked)."""
        ACKS.flush()
        super().close()

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
            _dropped(queue or "?", len(kombu_dumps(message)), reason)
            return
        try:
            super()._deliver(message, queue)
        except self.connection_errors:
            raise  # kombu reconnects on these
        except Exception as exc:
            # A well-formed envelope whose payload Celery's own error path cannot handle: e.g.
            # an unknown task name with a pickle or non-JSON body (on_unknown_task decodes the
            # body and raises ContentDisallowed / DecodeError out of the consumer loop).
            size = len(kombu_dumps(message))  # kombu's JSON: the decoded envelope may hold typed values
            _dropped(queue or "?", size, f"the consumer failed on it ({type(exc).__name__})")
            self._forget(message["properties"]["delivery_tag"])

    def _forget(self, delivery_tag: str) -> None:
        """Ack a dropped message that was already registered as unacked (so it is not restored)."""
        for channel in self.channels or ():
            if delivery_tag in getattr(channel.qos, "_delivered", {}):
                channel.qos.ack(delivery_tag)


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """``Channel``'s hardening on kombu's Sentinel channel: the primary is found through the
    Sentinels (``master_name``, ``sentinel_kwargs`` in ``broker_transport_options``), and a
    connection to a primary that was demoted (``READONLY``) or that broke is closed and made again to
    the one the Sentinels name now (redis-py's ``SentinelManagedConnection``): kombu's consumer
    reconnects as after a Redis restart."""


class SentinelTransport(Transport):
    """``Transport`` through Sentinel (``broker_transport`` with ``AGENT_REDIS_SENTINELS``)."""

    Channel = SentinelChannel
    default_port = kombu_redis.SentinelTransport.default_port


def orphaned_deliveries(
    client: Any, *, before: float, held: set[str], tasks: Iterable[str], key: str = "unacked"
) -> list[tuple[str, str]]:
    """Messages fetched from a queue (in kombu's ``unacked`` hash, delivered before ``before``, a
    ``time.time()``) whose task is one of ``tasks`` and whose task id is not in ``held`` (the tasks
    live workers hold). Returns ``[(delivery_tag, task_id)]``. Raises redis errors."""
    names = set(tasks)
    found = []
    for tag, raw in client.hscan_iter(key):
        try:
            message = json.loads(raw)[0]
            headers = message.get("headers") or {}
            task_id, task = headers.get("id"), headers.get("task")
        except (ValueError, TypeError, IndexError, AttributeError):
            continue
        if task in names and task_id not in held:
            found.append((tag.decode() if isinstance(tag, bytes) else tag, str(task_id)))
    if not found:
        return []
    with client.pipeline(transaction=False) as p:
        for tag, _ in found:
            p.zscore(f"{key}_index", tag)
        scores = p.execute()
    return [f for f, at in zip(found, scores, strict=True) if at is not None and at <= before]


def restore(channel: Any, tags: Iterable[str]) -> int:
    """Put these fetched messages back on their queues now (kombu's own restore path, as the
    visibility timeout would); returns how many. ``channel`` is a channel of this transport."""
    n = 0
    for tag in tags:
        channel.qos.restore_by_tag(tag)
        n += 1
    return n


def _turn_of(raw: bytes | str, tasks: set[str] | frozenset[str]) -> str | None:
    """The turn id (first argument) of a queued or fetched message of one of ``tasks``, or None."""
    try:
        message = json.loads(raw)
        if isinstance(message, list):  # an ``unacked`` entry: [message, exchange, routing key]
            message = message[0]
        return _turn_of_payload(message, tasks)
    except Exception:  # not ours to judge here (tasks.broker.Transport drops malformed messages)
        return None


def _turn_of_payload(message: Any, tasks: set[str] | frozenset[str]) -> str | None:
    """``_turn_of`` for a message already decoded (kombu's payload dict)."""
    try:
        if (message.get("headers") or {}).get("task") not in tasks:
            return None
        body = message.get("body") or ""
        if (message.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = serialization.loads(body, message.get("content-type"), message.get("content-encoding") or "utf-8")[0]
        return str(args[0])
    except Exception:  # not ours to judge here (tasks.broker.Transport drops malformed messages)
        return None


def turns_named_by_messages(client: Any, queues: Iterable[str], tasks: Iterable[str]) -> set[str]:
    """Turn ids that a message of ``tasks`` names, queued in ``queues`` or fetched (``unacked``),
    read in one transaction (a message moving from one to the other is seen once). Raises redis errors."""
    names = set(tasks)
    with client.pipeline(transaction=True) as p:
        for q in queues:
            p.lrange(q, 0, -1)
        p.hvals("unacked")
        replies = p.execute()
    return {t for raws in replies for t in (_turn_of(raw, names) for raw in raws) if t is not None}


def _keep_our_transport_on_switch() -> None:
    """After a connection error, kombu's ``Connection.switch`` moves to the next Sentinel URL of the
    broker URL's list and takes the transport from that URL's scheme, dropping the explicit
    ``broker_transport``: the consumer went on with kombu's stock Sentinel channel, without
    ``Channel``'s hardening, and the first primary kill with a task in flight ended prefork
    workers ("'NoneType' object has no attribute 'hostname'" while restoring unacked messages).
    The ``sentinel`` scheme names this module's transport instead, so every switch keeps it."""
    kombu_transports.TRANSPORT_ALIASES["sentinel"] = f"{__name__}:SentinelTransport"
    getattr(kombu_transports, "_transport_cache", {}).pop("sentinel", None)  # resolved before this import


_keep_our_transport_on_switch()


def loads(text: str | bytes) -> Any:
    """kombu's JSON decoding of a queue item and of an ``unacked`` record (``kombu.utils.json.loads``:
    the standard library's parser with kombu's ``__type__`` hook), through orjson when the text has
    no ``__type__`` envelope and no run of 19 digits (orjson reads an integer beyond 64 bits as a
    float): the same values, at a fraction of the cost (it was about 3% of a steps worker's CPU).
    What orjson refuses and the standard library reads (``NaN``) goes to kombu's too."""
    global _last_popped
    raw = text.encode() if isinstance(text, str) else text
    if b"__type__" not in raw and not has_long_digit_run(raw):
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
        else:
            _last_popped = (value, raw)
            return value
    return kombu_loads(text)


# The value ``loads`` decoded last through orjson and its text: ``QoS.append`` writes the fetch record
# of the payload kombu hands it from that text when the payload is that very object (checked by
# identity, so another thread's ``loads`` in between only costs the encoding).
_last_popped: tuple[Any, bytes] | None = None


def _decode_with_orjson() -> None:
    """kombu's Redis transport decodes what it pops and restores with its module's ``loads``; ours is
    the same decoding, faster (every transport of a worker's process is this module's)."""
    kombu_redis.loads = loads  # type: ignore[attr-defined]  # a module global of kombu's transport


_decode_with_orjson()
