"""Listing turns: newest first, by agent, status and creation time, a page at a time.

A part of the store (``worker.turn.keys`` names the keys): the creation script
(``worker.turn.guard.CreateScript``) adds every turn to two indexes, sorted sets scored by the
turn's ``created_at``: ``index_key(None)`` (every agent's turns, for tokens that cover all agents)
and ``index_key(agent_id)`` (one agent's). Entries older than twice the turns' retention are pruned
by the watchdog's sweep (``TurnListing.prune``: the index of every turn) and at one creation in
``guard.PRUNE_EVERY`` (an agent's), and an entry whose turn expired is skipped (and removed) when a
listing meets it.

A status filter is applied to the turns the index yields, not by an index of its own: a page
examines at most ``scan_limit`` entries, so a page may hold fewer than ``limit`` turns and still
have a ``next_cursor`` (a rare status far back in time costs several pages, never one long read).

Cursors are opaque to callers: the ``(created_at, turn_id)`` of the last entry examined, so a page
is stable under new turns arriving at the top.
"""

from __future__ import annotations

import base64
import binascii
import math
import time
from dataclasses import dataclass
from typing import Any, Sequence

from worker.turn.keys import hash_key, index_key
from worker.turn.request import TurnStatus
from worker.turn.state import RETENTION_SECONDS

FIELDS = ("status", "step", "model_calls", "agent_id", "created_at", "updated_at", "final_output", "error", "title")
TITLE_CHARS = 200
CHUNK = 100  # index entries read per key per round
TIES = 20  # extra entries read per key, for turns created in the same microsecond as the cursor's

Position = tuple[float, str]


@dataclass(frozen=True)
class TurnSummary:
    """One turn as listed: its status and counters, its final output or error once ended, and its
    ``title`` (the first ``TITLE_CHARS`` characters of the user's message; empty for a turn stored
    before titles were)."""

    turn_id: str
    agent_id: str
    status: TurnStatus
    step: int
    model_calls: int
    final_output: str | None
    error: str | None
    created_at: float
    updated_at: float
    title: str


@dataclass(frozen=True)
class TurnPage:
    """A page of turns, newest first; ``next_cursor`` is None when no turn is left to examine."""

    turns: list[TurnSummary]
    next_cursor: str | None


def title_of(request: dict[str, Any]) -> str:
    """The turn's title: the text of its message (a string ``input``), else of the last user
    message among its input items, cut to ``TITLE_CHARS`` characters, on one line."""
    value = request.get("input")
    text = ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, list):
        for item in reversed(value):
            if isinstance(item, dict) and item.get("role") == "user":
                content = item.get("content")
                if isinstance(content, str):
                    text = content
                elif isinstance(content, list):
                    text = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
                break
    return " ".join(text.split())[:TITLE_CHARS]


def encode_cursor(position: Position) -> str:
    """The opaque cursor of an index position."""
    return base64.urlsafe_b64encode(f"{position[0]!r}|{position[1]}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> Position:
    """The index position of a cursor ``encode_cursor`` made. Raises ``ValueError`` for anything else."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        score, _, turn_id = raw.partition("|")
        value = float(score)
    except (binascii.Error, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"not a cursor of this listing: {cursor[:60]!r}") from exc
    if not turn_id or not math.isfinite(value) or len(cursor) > 200:
        raise ValueError(f"not a cursor of this listing: {cursor[:60]!r}")
    return value, turn_id


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _summary(turn_id: str, row: list[Any]) -> TurnSummary:
    status, step, calls, agent, created, updated, final, error, title = row
    return TurnSummary(
        turn_id=turn_id,
        agent_id=_text(agent) if agent else "",
        status=TurnStatus(_text(status)),
        step=int(step or 0),
        model_calls=int(calls or 0),
        final_output=_text(final) if final is not None else None,
        error=_text(error) if error is not None else None,
        created_at=float(created or 0),
        updated_at=float(updated or 0),
        title=_text(title) if title else "",
    )


class TurnListing:
    """Pages of turns in the Redis at ``client`` (a ``redis.Redis``, bytes replies). Every method
    raises redis-py's errors."""

    def __init__(self, client: Any):
        self._r: Any = client
        self._pruned_at = 0.0  # prune's last run (epoch s)

    def page(
        self,
        *,
        agents: Sequence[str] | None,
        statuses: frozenset[TurnStatus] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        cursor: str | None = None,
        limit: int = 20,
        scan_limit: int = 2000,
    ) -> TurnPage:
        """Turns newest first: of ``agents`` (None: every agent's), in ``statuses`` (None: any),
        created after ``created_after`` and before ``created_before`` (epoch seconds, both
        exclusive), after ``cursor`` (a previous page's ``next_cursor``); at most ``limit`` turns
        and ``scan_limit`` index entries examined. Raises ``ValueError`` for a bad cursor."""
        position = decode_cursor(cursor) if cursor else None
        keys = [index_key(None)] if agents is None else [index_key(a) for a in sorted(set(agents))]
        allowed = None if agents is None else set(agents)
        out: list[TurnSummary] = []
        examined = 0
        if not keys:
            return TurnPage([], None)
        while True:
            batch, exhausted = self._entries(keys, position, created_after, created_before)
            rows = self._rows([tid for _, tid in batch])
            stale: list[str] = []
            for (score, turn_id), row in zip(batch, rows):
                position, examined = (score, turn_id), examined + 1
                if row[0] is None:
                    stale.append(turn_id)
                    continue
                found = _summary(turn_id, row)
                if (statuses is None or found.status in statuses) and (allowed is None or found.agent_id in allowed):
                    out.append(found)
                if len(out) >= limit or examined >= scan_limit:
                    break
            if stale:
                self._forget(keys, stale)
            last = not batch or (exhausted and position == batch[-1])
            if last:
                return TurnPage(out, None)
            if len(out) >= limit or examined >= scan_limit:
                return TurnPage(out, encode_cursor(position) if position else None)

    def _entries(
        self, keys: list[str], position: Position | None, after: float | None, before: float | None
    ) -> tuple[list[Position], bool]:
        """The next index entries below ``position`` over ``keys``, newest first, and whether
        every key is exhausted past them."""
        top = repr(position[0]) if position else ("+inf" if before is None else f"({before!r}")
        bottom = "-inf" if after is None else f"({after!r}"
        n = CHUNK + TIES
        with self._r.pipeline(transaction=False) as p:
            for k in keys:
                p.zrevrangebyscore(k, top, bottom, start=0, num=n, withscores=True)
            replies = p.execute()
        merged: list[Position] = []
        bound: Position | None = None  # entries at or above it are complete over every key
        for reply in replies:
            entries = [(float(s), _text(m)) for m, s in reply]
            if len(entries) == n:
                bound = entries[-1] if bound is None else max(bound, entries[-1])
            merged += [e for e in entries if position is None or e < position]
        merged.sort(reverse=True)
        if bound is not None:
            merged = [e for e in merged if e >= bound]
        return merged, bound is None

    def _rows(self, turn_ids: list[str]) -> list[list[Any]]:
        if not turn_ids:
            return []
        with self._r.pipeline(transaction=False) as p:
            for turn_id in turn_ids:
                p.hmget(hash_key(turn_id), FIELDS)
            rows: list[list[Any]] = p.execute()
        return rows

    def prune(self, now: float | None = None, every: float = 60.0) -> int:
        """Drop the entries of the index of every turn created more than twice the retention ago
        (the creation script no longer does: ``worker.turn.guard``), at most once per ``every``
        seconds in this process (the watchdog's sweep calls it at each run): one command. Returns
        how many were dropped."""
        now = time.time() if now is None else now
        if now - self._pruned_at < every:
            return 0
        self._pruned_at = now
        return int(self._r.zremrangebyscore(index_key(None), "-inf", f"({now - 2 * RETENTION_SECONDS!r}"))

    def _forget(self, keys: list[str], turn_ids: list[str]) -> None:
        """Drop index entries whose turn expired."""
        with self._r.pipeline(transaction=False) as p:
            for k in keys:
                p.zrem(k, *turn_ids)
            p.execute()
