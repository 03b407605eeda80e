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
import gc
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
import redis
import redis.asyncio

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


def _bulk(value: bytes) -> bytes:
    """``value`` as a bulk string of Redis's wire format (RESP)."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def id_tuple(stream_id: str) -> tuple[int, int]:
    """A stream id as comparable numbers: ``"1700000000000-3"`` -> ``(1700000000000, 3)``."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


class HubEvent(dict[str, Any]):
    """An event as the hub delivers it: the decoded JSON (a dict: equal to the plain one), with
    what every subscriber of its stream would otherwise compute again, once per entry:
    ``position``, its id as numbers (``id_tuple``), and ``frame``, the server-sent event
    (``id:``/``event:``/``data:``; ``control.api.sse.frame``'s bytes)."""

    __slots__ = ("position", "frame")

    position: tuple[int, int]
    frame: bytes


def hub_event(stream_id: str, raw: bytes) -> HubEvent:
    """``raw`` (an entry's ``e`` field, JSON) as a ``HubEvent`` of stream id ``stream_id``. The
    ``data:`` line is ``raw`` itself when it is one line (as ``orjson`` writes every event), else
    the event encoded again. Raises ``orjson.JSONDecodeError``, and ``TypeError`` for JSON that is
    not an object."""
    ev = HubEvent(orjson.loads(raw))
    ev.position = id_tuple(stream_id)
    data = raw if b"\n" not in raw and b"\r" not in raw else orjson.dumps(ev)
    kind = ev.get("kind", "event")
    ev.frame = b"".join((b"id: ", stream_id.encode(), b"\nevent: ", str(kind).encode(), b"\ndata: ", data, b"\n\n"))
    return ev


# Queued by the hub to a subscriber that asked for heartbeats (``subscribe(..., beats=True)``) and
# received nothing for a while: its client writes a keep-alive. Readers tell it by its id.
HEARTBEAT: Event = ("", "heartbeat", {})


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
    beats: bool = False  # gets ``HEARTBEAT`` when idle (``StreamHub(heartbeat=...)``)
    fed: bool = False  # something was queued since the last heartbeat tick


class StreamHub:
    """``subscribe(key, after)`` / ``unsubscribe(sub)``; ``start()`` in the event loop, ``stop()`` at exit.

    ``block_ms``: longest single ``XREAD`` wait; ``count``: entries read per stream per round;
    ``queue_size``: entries buffered per subscriber before it is dropped as lagging; ``heartbeat``
    (seconds): a subscriber with ``beats`` that was queued nothing for between half of it and all
    of it gets ``HEARTBEAT`` (one timer for the process, where a timer per waiting client cost
    about as much as the client's write, per event).
    """

    def __init__(
        self,
        client: redis.asyncio.Redis,
        *,
        block_ms: int = 10_000,
        count: int = 500,
        queue_size: int = 5000,
        heartbeat: float = 15.0,
    ):
        self.r = client
        self.block_ms, self.count, self.queue_size, self.heartbeat = block_ms, count, queue_size, heartbeat
        self._beat_task: asyncio.Task[None] | None = None
        self._subs: dict[str, set[Subscription]] = {}
        self._cursor: dict[str, str] = {}
        self._wake_key = f"api:wake:{uuid.uuid4().hex}"
        self._wake_cursor = "0-0"
        self._pending_wake = False
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self.rounds = 0  # XREAD calls made (for tests and benches)
        self._delivered_at = 0.0  # time.monotonic() once the last round's clients ran (``idle_for``)
        self._key_segs: dict[str, bytes] = {}  # each followed stream's name, packed (``_command``)

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
            self._beat_task = asyncio.get_running_loop().create_task(self._beat(), name="stream-hub-heartbeat")

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat / 2)
            for subs in list(self._subs.values()):
                for sub in subs:
                    if sub.beats and not sub.fed:
                        try:
                            sub.queue.put_nowait(HEARTBEAT)
                        except asyncio.QueueFull:
                            pass  # its reader is not waiting: it has entries to drain
                    sub.fed = False

    async def stop(self, grace: float = 2.0) -> None:
        """Stop reading. A read that does not end within ``grace`` seconds of its cancellation (a
        blocked ``XREAD`` redis-py is still cleaning up after) is left to the client's closing:
        a shutdown never hangs on it."""
        if self._beat_task is not None:
            self._beat_task.cancel()
            self._beat_task = None
        if self._task is not None:
            task, self._task = self._task, None
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=grace)
            if not done:
                log.warning("stream hub: its read did not end within %.1fs of being cancelled", grace)

    def subscribe(
        self, key: str, after: str, queue: asyncio.Queue[Event] | None = None, *, beats: bool = False
    ) -> Subscription:
        """Follow stream ``key`` from after id ``after`` (``"0-0"``: from its start); ``queue``: a
        queue shared with the caller's other subscriptions (default: a new one); ``beats``: queue
        ``HEARTBEAT`` when idle (see the class). Raises ``ValueError`` for an ``after`` that is not
        a stream id Redis takes (``parse_event_id``)."""
        if parse_event_id(after) is None:
            raise ValueError(f"not a stream id: {after[:50]!r}")
        sub = Subscription(key, queue if queue is not None else asyncio.Queue(self.queue_size), beats=beats)
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
            # Decoded and framed once for every subscriber of the stream (``HubEvent``).
            try:
                stream_id = eid.decode()
                decoded.append((key, stream_id, hub_event(stream_id, fields[b"e"])))
            except (KeyError, TypeError, ValueError):  # not an event of ours: skipped, never fatal
                log.warning("stream hub: skipping entry %s of %s (not an event)", eid.decode(), key)
        for sub in list(subs):
            sub.fed = True
            try:
                for entry in decoded:
                    sub.queue.put_nowait(entry)
            except asyncio.QueueFull:
                subs.discard(sub)
                sub.lagging = True
        if not subs:
            self._subs.pop(key, None)
            self._cursor.pop(key, None)

    def _command(self) -> bytes:
        """The round's ``XREAD`` over every followed stream and the wake stream, in Redis's wire
        format, packed here: redis-py's packing of each argument took about 7 ms for 2,000
        streams on this machine (every round, in the event loop, before any client is written to);
        joining cached parts takes a tenth of a millisecond."""
        keys = list(self._cursor)
        segs = self._key_segs
        if len(segs) > 2 * len(keys) + 64:  # streams no longer followed: forget their parts
            segs.clear()
        parts = [b"*%d\r\n" % (8 + 2 * len(keys)), _bulk(b"XREAD"), _bulk(b"COUNT"), _bulk(b"%d" % self.count)]
        parts += [_bulk(b"BLOCK"), _bulk(b"%d" % self.block_ms), _bulk(b"STREAMS")]
        for key in keys:
            seg = segs.get(key)
            if seg is None:
                seg = segs[key] = _bulk(key.encode())
            parts.append(seg)
        parts.append(_bulk(self._wake_key.encode()))
        parts += [_bulk(self._cursor[key].encode()) for key in keys]
        parts.append(_bulk(self._wake_cursor.encode()))
        return b"".join(parts)

    async def _xread(self) -> Any:
        """One ``XREAD`` round on a connection of the hub's client: Redis's reply (``_entries``
        reads it). Raises ``redis.ResponseError`` when Redis refuses the read,
        redis-py's connection errors when it fails (the connection is then dropped: a reply may
        still be on its way)."""
        pool = self.r.connection_pool
        conn = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py: untyped
        try:
            await conn.send_packed_command(self._command())
            reply = await conn.read_response()
        except redis.ResponseError:
            raise
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        return reply

    @staticmethod
    def _entries(reply: Any) -> list[tuple[bytes, list[RawEntry]]]:
        """An ``XREAD`` reply as its streams with new entries (none: the wait ended empty)."""
        streams = reply.items() if isinstance(reply, dict) else reply or []  # RESP3 answers a map
        return [(key, [(eid, dict(zip(flat[::2], flat[1::2]))) for eid, flat in entries]) for key, entries in streams]

    async def _run(self) -> None:
        backoff = 0.1
        while True:
            if not self._subs:
                self._idle.clear()
                await self._idle.wait()
                continue
            try:
                res = await self._xread()
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
            # No collection between a round's reply and its clients' writes: a collection walks
            # every object the open streams hold (about 250 each: at 2,000 streams a young one
            # took 100-130 ms), and it stopped the loop in the middle of a burst. Turned back on
            # once the clients this round woke have run (``call_soon`` runs in order: their wakeups
            # were queued first), so a collection that is due runs after them. (The API process
            # collects from its own task, ``control.api.collector``: the collector is off, and
            # ``idle_for`` tells that task when a burst has gone out.)
            paused = gc.isenabled()
            if paused:
                gc.disable()
            try:
                self._round(res)
            finally:
                asyncio.get_running_loop().call_soon(self._after_round, paused)

    def _after_round(self, paused: bool) -> None:
        self._delivered_at = time.monotonic()
        if paused:
            gc.enable()

    def idle_for(self) -> float:
        """Seconds since the clients woken by the last read's events have run (a large number
        before any)."""
        return time.monotonic() - self._delivered_at

    def _round(self, reply: Any) -> None:
        """Deliver one ``XREAD`` reply's entries to the subscribers of their streams."""
        for raw_key, entries in self._entries(reply):
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
