"""Fan-out of Redis Streams to many event-stream clients of one API process.

One task runs one ``XREAD BLOCK`` over every stream some client follows (a turn's
``turn:{id}:events``), so a process holds thousands of streams on one Redis connection instead
of one blocked connection each. A client that starts following a stream the hub does not read
yet wakes the blocked ``XREAD`` through the process's own small wake stream (``api:wake:<uuid>``,
trimmed and expiring), so it waits for no timeout.

Ordering and completeness: the hub keeps one cursor per stream (the last id it read). A
subscriber that joins a stream already read gets ``backlog_from``/``backlog_to`` (its own
``Last-Event-ID`` and the hub's cursor at the moment it joined) to read itself with ``XRANGE``;
everything after the cursor comes through its queue, so nothing is missed or sent twice.

When Redis fails, the hub keeps its subscribers and cursors and retries (backoff up to 2 s):
clients see a pause, then the events they missed, in order. When Redis refuses the read itself (a
``ResponseError``: a key that is not a stream, an id it does not take), the hub reads each stream
alone once and drops the subscribers of the streams Redis refuses (marked ``lagging``): one bad
stream never stops the others. Ids are checked before they reach the hub (``parse_event_id``), and
``subscribe`` refuses any other. A subscriber whose queue overflows
(a client not reading) is marked ``lagging`` and dropped: its client drains what it has, then
resumes by reconnecting with its last event id.
"""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
import redis
import redis.asyncio
from redis.typing import KeyT, StreamIdT

log = logging.getLogger("agent.api.hub")

# What a subscriber's queue carries: ``(stream key, entry id, event)``.
Event = tuple[str, str, dict[str, Any]]
# A stream entry as our clients return it (RESP2, no ``decode_responses``): ``(id, {field: value})``
# in bytes. redis-py's reply types also cover str replies and RESP3 shapes, so replies are cast.
RawEntry = tuple[bytes, dict[bytes, bytes]]


_EVENT_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?", re.ASCII)
MAX_PART = 2**64 - 1  # Redis stream ids are two unsigned 64-bit numbers


def parse_event_id(value: str) -> str | None:
    """A client's event id (``Last-Event-ID``, ``after``) as the stream id Redis takes
    (``<ms>-<seq>``; a bare ``<ms>`` is ``<ms>-0``), or None when it is not one: ASCII digits only,
    each part within Redis's unsigned 64-bit range. Checked before any id reaches Redis: one id
    Redis refuses would fail the process's shared ``XREAD`` (``control.api.hub``)."""
    m = _EVENT_ID.fullmatch(value)
    if m is None:
        return None
    ms, seq = int(m.group(1)), int(m.group(2) or 0)
    if ms > MAX_PART or seq > MAX_PART:
        return None
    return f"{ms}-{seq}"


def id_tuple(stream_id: str) -> tuple[int, int]:
    """A stream id as comparable numbers: ``"1700000000000-3"`` -> ``(1700000000000, 3)``."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(eq=False)
class Subscription:
    """One client following one stream: entries ``(key, id, event)`` arrive on ``queue`` (which
    several subscriptions of one client may share).

    ``backlog`` is None when the hub reads the stream from the client's own position, else
    ``(after, upto)``: the ids the client reads itself (``XRANGE (after upto``). ``lagging``: the
    queue overflowed and the hub dropped this subscriber."""

    key: str
    queue: asyncio.Queue[Event]
    backlog: tuple[str, str] | None = None
    lagging: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # what the caller keeps with it


class StreamHub:
    """``subscribe(key, after)`` / ``unsubscribe(sub)``; ``start()`` in the event loop, ``stop()`` at exit.

    ``block_ms``: longest single ``XREAD`` wait; ``count``: entries read per stream per round;
    ``queue_size``: entries buffered per subscriber before it is dropped as lagging.
    """

    def __init__(
        self, client: redis.asyncio.Redis, *, block_ms: int = 10_000, count: int = 500, queue_size: int = 5000
    ):
        self.r = client
        self.block_ms, self.count, self.queue_size = block_ms, count, queue_size
        self._subs: dict[str, set[Subscription]] = {}
        self._cursor: dict[str, str] = {}
        self._wake_key = f"api:wake:{uuid.uuid4().hex}"
        self._wake_cursor = "0-0"
        self._pending_wake = False
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self.rounds = 0  # XREAD calls made (for tests and benches)

    @property
    def streams(self) -> int:
        """Streams read now."""
        return len(self._subs)

    @property
    def running(self) -> bool:
        """True while the reading task runs (for tests: a fault never ends it)."""
        return self._task is not None and not self._task.done()

    @property
    def subscribers(self) -> int:
        """Subscribers now, over all streams."""
        return sum(len(s) for s in self._subs.values())

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="stream-hub")

    async def stop(self, grace: float = 2.0) -> None:
        """Stop reading. A read that does not end within ``grace`` seconds of its cancellation (a
        blocked ``XREAD`` redis-py is still cleaning up after) is left to the client's closing:
        a shutdown never hangs on it."""
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                log.warning("stream hub: its read did not end within %.1fs of being cancelled", grace)

    def subscribe(self, key: str, after: str, queue: asyncio.Queue[Event] | None = None) -> Subscription:
        """Follow stream ``key`` from after id ``after`` (``"0-0"``: from its start); ``queue``: a
        queue shared with the caller's other subscriptions (default: a new one). Raises
        ``ValueError`` for an ``after`` that is not a stream id Redis takes (``parse_event_id``)."""
        if parse_event_id(after) is None:
            raise ValueError(f"not a stream id: {after[:50]!r}")
        sub = Subscription(key, queue if queue is not None else asyncio.Queue(self.queue_size))
        subs = self._subs.get(key)
        if subs is None:
            self._subs[key] = {sub}
            self._cursor[key] = after
            self._wake()
        else:
            subs.add(sub)
            cursor = self._cursor[key]
            if id_tuple(cursor) > id_tuple(after):
                sub.backlog = (after, cursor)
        self._idle.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.key)
        if subs is None:
            return
        subs.discard(sub)
        if not subs:
            del self._subs[sub.key]
            self._cursor.pop(sub.key, None)

    def _wake(self) -> None:
        # The blocked XREAD must see the new stream now: an entry on our wake stream ends it.
        if self._pending_wake:
            return
        self._pending_wake = True
        asyncio.get_running_loop().create_task(self._send_wake())

    async def _send_wake(self) -> None:
        try:
            async with self.r.pipeline(transaction=False) as p:
                p.xadd(self._wake_key, {"w": "1"}, maxlen=10, approximate=False)
                p.expire(self._wake_key, 3600)
                await p.execute()
        except redis.RedisError:
            pass  # the XREAD ends by its timeout instead
        finally:
            self._pending_wake = False

    def _deliver(self, key: str, entries: list[RawEntry]) -> None:
        subs = self._subs.get(key)
        if not subs or not entries:
            return
        self._cursor[key] = entries[-1][0].decode()
        decoded: list[Event] = []
        for eid, fields in entries:
            try:
                decoded.append((key, eid.decode(), orjson.loads(fields[b"e"])))
            except (KeyError, orjson.JSONDecodeError):  # not an event of ours: skipped, never fatal
                log.warning("stream hub: skipping entry %s of %s (not an event)", eid.decode(), key)
        for sub in list(subs):
            try:
                for entry in decoded:
                    sub.queue.put_nowait(entry)
            except asyncio.QueueFull:
                subs.discard(sub)
                sub.lagging = True
        if not subs:
            self._subs.pop(key, None)
            self._cursor.pop(key, None)

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            if not self._subs:
                self._idle.clear()
                await self._idle.wait()
                continue
            # Built key by key: xread's parameter is a Dict (invariant) of redis' key and id types.
            streams: dict[KeyT, StreamIdT] = {key: cursor for key, cursor in self._cursor.items()}
            streams[self._wake_key] = self._wake_cursor
            try:
                res = cast(
                    "list[tuple[bytes, list[RawEntry]]] | None",
                    await self.r.xread(streams, count=self.count, block=self.block_ms),
                )
                backoff = 0.1
            except redis.ResponseError as exc:
                try:
                    dropped = await self._drop_unreadable()
                except (redis.RedisError, OSError):
                    dropped = False
                if dropped:
                    continue
                log.warning("stream hub: Redis refused the read (%s); retrying in %.1fs", exc, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except (redis.RedisError, OSError) as exc:
                log.warning("stream hub: Redis failed (%s); retrying in %.1fs", exc.__class__.__name__, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            self.rounds += 1
            for raw_key, entries in res or []:
                key = raw_key.decode()
                if key == self._wake_key:
                    self._wake_cursor = entries[-1][0].decode()
                    continue
                try:
                    self._deliver(key, entries)
                except Exception:  # a fault with one stream's entries: its readers go, the hub goes on
                    log.exception("stream hub: dropping the readers of %s", key)
                    self._drop(key)

    def _drop(self, key: str) -> None:
        """Stop reading ``key``: its subscribers are marked ``lagging`` and woken (an entry that
        names no stream, id ``0-0``, which readers skip), so their clients end now."""
        for sub in self._subs.pop(key, set()):
            sub.lagging = True
            try:
                sub.queue.put_nowait(("", "0-0", {}))
            except asyncio.QueueFull:
                pass  # a full queue's reader is not waiting: it finds the flag when it has drained
        self._cursor.pop(key, None)

    async def _drop_unreadable(self) -> bool:
        """Read each followed stream alone (no wait) and drop the subscribers of those Redis refuses;
        True when some were dropped. Raises redis-py's connection errors."""
        keys = list(self._cursor)
        async with self.r.pipeline(transaction=False) as p:
            for key in keys:
                p.xread({key: self._cursor[key]}, count=1)
            p.xread({self._wake_key: self._wake_cursor}, count=1)
            replies = await p.execute(raise_on_error=False)
        dropped = False
        for key, reply in zip(keys, replies):
            if isinstance(reply, redis.ResponseError):
                log.warning("stream hub: dropping the readers of %s (%s)", key, reply)
                self._drop(key)
                dropped = True
        if isinstance(replies[-1], redis.ResponseError):  # our own wake stream: start another
            self._wake_key, self._wake_cursor, dropped = f"api:wake:{uuid.uuid4().hex}", "0-0", True
        return dropped
