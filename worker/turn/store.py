"""The turn's state in Redis between steps.

What is read of a turn, its creation, its events, its progress watch and end hooks, and its cancel
request, here; the rest are parts built on the same client, each one concept: ``store.moves`` (the
guarded transitions from step to step and the turn's end: ``worker.turn.moves``, where the fencing
rules on ``step`` and ``phase`` read as one), ``store.claims`` (who runs a step or a call),
``store.barrier`` (a call's result and whose result closes a batch), ``store.memo`` (model
replies), ``store.approvals`` (approval records and gates), ``store.usage`` (token usage per step).

The keys are listed and named in ``worker.turn.keys``. No module outside the store (this module,
``keys``, ``guard``, ``moves``, ``claims``, ``barrier``, ``memo``, ``approvals``, ``usage``) reads
or writes them, and the client is private: the parts and the Celery edge call the methods below
(``tests/unit/turn/test_store_owns_keys.py``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import orjson
import redis

from worker.turn.approvals import ApprovalRecords
from worker.turn.barrier import Barrier
from worker.turn.claims import Claims
from worker.turn.dispatch import Plan
from worker.turn.durability import NO_REPLICAS, ReplicaAck
from worker.turn.guard import CancelScript, CreateScript
from worker.turn.keys import CANCELS_KEPT, CANCELS_KEY, FINISHING_KEY, WATCH_KEY, creation_layout, idem_key, index_key
from worker.turn.keys import key as _k
from worker.turn.listing import TurnListing, title_of
from worker.turn.memo import ReplyMemo
from worker.turn.moves import HOOK_TIMEOUT, Moves, add_event
from worker.turn.request import END_HOOK_METADATA, TurnStatus
from worker.turn.state import (
    EVENTS_MAXLEN,
    RETENTION_SECONDS,
    AdvanceView,
    CallResult,
    CallView,
    TurnState,
    event_json,
    parse_results,
)
from worker.turn.usage import UsageLedger


class TurnStore:
    """Redis-backed turn state. ``client`` is a ``redis.Redis`` (bytes responses), held privately:
    every read and write of a turn's keys is a method of the store or of one of its parts, built
    here on the same client (the module docstring names them). ``progress_timeout``: seconds a
    turn may go without progress before the watchdog re-drives it; ``deadline_reuse``: seconds of
    the progress deadline a move may leave unpushed (``Moves``)."""

    def __init__(
        self,
        client: redis.Redis,
        *,
        progress_timeout: float = 600.0,
        durability: ReplicaAck = NO_REPLICAS,
        deadline_reuse: float = 0.0,
    ):
        # redis-py types every reply as ``bytes | str``; this client answers bytes
        # (``decode_responses`` off), and the parsing below says what each reply is.
        self._r: Any = client
        self.progress_timeout = progress_timeout
        # The writes that fence side effects or money wait for replicas (worker.turn.durability).
        self.durability = durability
        self.moves = Moves(client, progress_timeout=progress_timeout, deadline_reuse=deadline_reuse)
        self.claims = Claims(client, progress_timeout=progress_timeout, durability=durability)
        self.barrier = Barrier(client, progress_timeout=progress_timeout)
        self.memo = ReplyMemo(client, durability)
        self.approvals = ApprovalRecords(client, progress_timeout=progress_timeout)
        self.usage = UsageLedger(client)
        self.listing = TurnListing(client)
        self._create = CreateScript(client)
        self._cancel = CancelScript(client)
        self._plans: dict[tuple[str, int], Plan] = {}

    # ----- reading ---------------------------------------------------------
    def load(self, turn_id: str) -> TurnState | None:
        """The turn's state, or None for an unknown turn."""
        h = self._r.hgetall(_k(turn_id))
        return TurnState.from_hash(turn_id, h) if h else None

    def items(self, turn_id: str) -> list[dict[str, Any]]:
        """The Responses input items recorded so far (user input, model output, outputs), in order."""
        return [orjson.loads(x) for x in self._r.lrange(_k(turn_id, "items"), 0, -1)]

    def events(
        self, turn_id: str, after: str = "0-0", count: int = 1000, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Events after stream id ``after``: ``[(id, event_dict)]``; ``block_ms`` waits for new ones."""
        res = self._r.xread({_k(turn_id, "events"): after}, count=count, block=block_ms)
        out = []
        for _stream, entries in res or []:
            for eid, fields in entries:
                out.append((eid.decode(), orjson.loads(fields[b"e"])))
        return out

    def plan(self, turn_id: str, step: int) -> Plan | None:
        """The dispatch plan of ``step``, or None before it is recorded."""
        cached = self._plans.get((turn_id, step))
        if cached is not None:
            return cached
        with self._r.pipeline(transaction=False) as p:
            p.hmget(_k(turn_id), "plan_step", "plan")  # a layout-2 turn's current plan (``begin_tools_writes``)
            p.get(_k(turn_id, "plan", step))
            (in_step, in_hash), raw = p.execute()
        return self._parse_plan(turn_id, step, in_hash if in_step == str(step).encode() else raw)

    def _parse_plan(self, turn_id: str, step: int, raw: bytes | None) -> Plan | None:
        # A plan never changes once written: parse it once per process.
        if not raw:
            return None
        plan = Plan.from_json(orjson.loads(raw))
        if len(self._plans) > 256:
            self._plans.clear()
        self._plans[(turn_id, step)] = plan
        return plan

    def advance_view(self, turn_id: str, step: int) -> AdvanceView:
        """What closing a batch reads: state, cancel flag (the hash's field) and the step's results,
        in one round trip (the barrier's winner gets it from ``record_and_check``; a re-drive reads it here)."""
        with self._r.pipeline(transaction=False) as p:
            p.hgetall(_k(turn_id))
            p.hgetall(_k(turn_id, "results", step))
            h, results = p.execute()
        state = TurnState.from_hash(turn_id, h) if h else None
        return AdvanceView(state, h.get(b"cancel") == b"1", parse_results(results))

    def call_view(
        self, turn_id: str, step: int, call_id: str, owner: str, lease: float, started: str | None = None
    ) -> CallView:
        """State, plan, whether the call has a result, and the cancel flag, in one round trip,
        with the call's claim for ``owner`` (``lease`` seconds) when it can be taken at once
        (``Claims.begin_call``; ``started``: what the call's message carries, see there and
        ``Plan.started_at_once``)."""
        if started and started[0] == "!":  # a destructive call: at once only without replicas to wait for
            started = "" if self.durability.enabled else started[1:]
        read = self.claims.begin_call(turn_id, step, call_id, owner, lease, started)
        state = TurnState.from_hash(turn_id, read.turn_hash) if read.turn_hash else None
        plan = self._plans.get((turn_id, step)) or self._parse_plan(turn_id, step, read.raw_plan)
        return CallView(state, plan, read.has_result, read.cancelled, read.claim)

    def results(self, turn_id: str, step: int) -> dict[str, CallResult]:
        """Results of ``step`` by ``call_id``."""
        return parse_results(self._r.hgetall(_k(turn_id, "results", step)))

    def status(self, turn_id: str) -> TurnStatus | None:
        """The turn's status alone (one field read), or None for an unknown turn."""
        raw = self._r.hget(_k(turn_id), "status")
        return TurnStatus(raw.decode() if isinstance(raw, bytes) else raw) if raw else None

    def is_cancelled(self, turn_id: str) -> bool:
        """True once the control plane asked to cancel the turn."""
        return bool(self._r.exists(_k(turn_id, "cancel")))

    def cancelled_of(self, turn_ids: list[str]) -> set[str]:
        """Which of ``turn_ids`` were asked to cancel in the last ``CANCELS_KEPT`` s, for a node's watch
        over its model calls in flight: one read of the recent cancels for all of them."""
        if not turn_ids:
            return set()
        recent = self._r.zrangebyscore(CANCELS_KEY, time.time() - CANCELS_KEPT, "+inf")
        return set(turn_ids) & {x.decode() for x in recent}

    def find_by_idempotency_key(self, agent_id: str, key: str) -> str | None:
        """The turn id ``agent_id`` enqueued with this idempotency key, if any."""
        v = self._r.get(idem_key(agent_id, key))
        return v.decode() if v else None

    def agent_turns(self, agent_id: str, limit: int = 50) -> list[str]:
        """The agent's most recent turn ids, newest first (its listing index: ``worker.turn.listing``)."""
        return [x.decode() for x in self._r.zrevrange(index_key(agent_id), 0, limit - 1)]

    def overdue(self, now: float | None = None, limit: int = 100) -> list[str]:
        """Turn ids whose progress deadline has passed (for the watchdog)."""
        now = time.time() if now is None else now
        return [x.decode() for x in self._r.zrangebyscore(WATCH_KEY, "-inf", now, start=0, num=limit)]

    def watched_between(self, after: float, upto: float) -> list[str]:
        """Turn ids whose progress deadline (epoch seconds) is after ``after`` and at most ``upto``
        (the watchdog's reconciliation after a Redis restart)."""
        return [x.decode() for x in self._r.zrangebyscore(WATCH_KEY, f"({after}", upto)]

    def watched_count(self) -> int:
        """How many turns have a progress deadline: the turns queued or running (a metric)."""
        return int(self._r.zcard(WATCH_KEY))

    def statuses(self, turn_ids: Sequence[str]) -> list[TurnStatus | None]:
        """The status of each of ``turn_ids`` (None for an unknown turn), in one round trip."""
        with self._r.pipeline(transaction=False) as p:
            for turn_id in turn_ids:
                p.hget(_k(turn_id), "status")
            raw = p.execute()
        return [TurnStatus(v.decode()) if v else None for v in raw]

    # ----- writing ---------------------------------------------------------
    def event(self, turn_id: str, kind: str, **data: Any) -> None:
        """Append an activity event (``kind`` plus JSON fields) to the turn's stream."""
        self.add_events(turn_id, [(kind, data)])

    def add_events(self, turn_id: str, events: list[tuple[str, dict[str, Any]]]) -> None:
        """Append ``[(kind, fields)]`` events to the turn's stream in one round trip."""
        if not events:
            return
        with self._r.pipeline(transaction=False) as p:
            for kind, data in events:
                add_event(p, turn_id, kind, data)
            p.execute()

    def create(
        self,
        turn_id: str,
        request: dict[str, Any],
        initial_items: list[dict[str, Any]],
        idempotency_key: str | None = None,
        fields: dict[str, Any] | None = None,
    ) -> tuple[str, bool]:
        """Create the turn with its ``turn_queued`` event, atomically and in one round trip
        (``worker.turn.guard.CreateScript``); ``fields``: extra hash fields (e.g. the ``traceparent``).
        Returns ``(turn_id, True)`` for a new turn; ``(existing_id, False)``, storing nothing, when
        the agent already used ``idempotency_key`` (keys are scoped per agent), or when ``turn_id``
        already exists *for the same agent* (enqueueing is idempotent on the turn id). Raises
        ``TurnRefused`` when ``turn_id`` belongs to another agent: nothing is overwritten or returned."""
        keys, args = self.create_call(turn_id, request, initial_items, idempotency_key, fields)
        return self._create.run(turn_id, keys, args)

    def create_call(
        self,
        turn_id: str,
        request: dict[str, Any],
        initial_items: list[dict[str, Any]],
        idempotency_key: str | None = None,
        fields: dict[str, Any] | None = None,
        message: Sequence[tuple[str, str, bytes]] = (),
    ) -> tuple[list[str], list[Any]]:
        """``create``'s script call, ``(keys, args)`` for ``guard.CREATE_LUA``, sent by the caller on
        a client of its own (the HTTP API's asyncio one); ``message``: the first step's queue
        message as Redis commands, sent only if the turn is created. The reply: ``CreateScript.outcome``."""
        agent_id = request.get("agent_id", "agent")
        now = time.time()
        keys = [_k(turn_id), _k(turn_id, "items"), WATCH_KEY, _k(turn_id, "events")]
        keys += [index_key(None), index_key(agent_id)]  # listing turns (worker.turn.listing)
        hash_fields: dict[str, Any] = {
            "status": TurnStatus.queued.value,
            "step": 0,
            "phase": "model",
            "model_calls": 0,
            "request": orjson.dumps(request),
            # Read by every guarded transition, so the (possibly large) request need not be.
            "end_hooks": int(any((request.get("metadata") or {}).get(k) for k in END_HOOK_METADATA)),
            "agent_id": agent_id,
            "title": title_of(request),
            **{"terminate": "0", "invalid_counts": "{}", "loaded_tools": "[]", "created_at": now},
            # The watch's deadline as set here (``Moves._touch`` keeps it): a step's claim reads it with the hash.
            **{"updated_at": now, "deadline": now + self.progress_timeout, "redrives": 0, **(fields or {})},
        }
        layout = creation_layout()
        if layout > 1:  # the layout mark (``keys``): a turn without it keeps the earlier keys
            hash_fields["layout"] = layout
        items, idem = [orjson.dumps(i) for i in initial_items], idem_key(agent_id, idempotency_key or "")
        return CreateScript.arguments(
            keys, agent_id, turn_id, hash_fields, items, retention=RETENTION_SECONDS, deadline=now + self.progress_timeout,
            event=event_json("turn_queued", {}), events_maxlen=EVENTS_MAXLEN,
            idempotency_key=idem if idempotency_key else None, message=message,
        )  # fmt: skip

    def awaits_hooks(self, turn_id: str) -> bool:
        """True for an ended turn whose end hooks have not reported done (a workflow attempt or a
        background job: ``END_HOOK_METADATA``); other turns have none to run."""
        return self._r.zscore(FINISHING_KEY, turn_id) is not None

    def hooks_done(self, turn_id: str) -> None:
        """The turn's end hooks ran: stop re-sending them."""
        self._r.zrem(FINISHING_KEY, turn_id)

    def hooks_overdue(self, now: float | None = None, limit: int = 100) -> list[str]:
        """Ended turns whose hooks did not report done in time; their deadline is pushed as they are returned."""
        now = time.time() if now is None else now
        ids = [x.decode() for x in self._r.zrangebyscore(FINISHING_KEY, "-inf", now, start=0, num=limit)]
        if ids:
            self._r.zadd(FINISHING_KEY, {i: now + HOOK_TIMEOUT for i in ids})
        return ids

    def unwatch(self, turn_id: str) -> None:
        """Stop watching the progress of a turn that ended or is gone (the re-drive finds it so)."""
        self._r.zrem(WATCH_KEY, turn_id)

    def push_deadline(self, turn_id: str, seconds: float) -> None:
        """Push the turn's progress deadline to at least ``seconds`` from now (a long model call, a retry)."""
        self._r.zadd(WATCH_KEY, {turn_id: time.time() + max(seconds, self.progress_timeout)}, xx=True, gt=True)

    def note_redrive(self, turn_id: str) -> int:
        """Count a watchdog re-drive and push the progress deadline; returns the count."""
        n = self._r.hincrby(_k(turn_id), "redrives", 1)
        self._r.zadd(WATCH_KEY, {turn_id: time.time() + self.progress_timeout})
        return int(n)

    def request_cancel(self, turn_id: str, by: str = "control plane") -> None:
        """Set the cancel flag that steps, running tools and model calls observe (``keys``), and note it
        in the event stream: one round trip (``worker.turn.guard.CancelScript``)."""
        now = time.time()
        keys = [_k(turn_id), _k(turn_id, "cancel"), CANCELS_KEY, _k(turn_id, "events")]
        event = event_json("cancel_requested", {"by": by})
        self._cancel.run(keys, retention=RETENTION_SECONDS, now=now, turn_id=turn_id, kept_since=now - CANCELS_KEPT,
                         events_maxlen=EVENTS_MAXLEN, event=event)  # fmt: skip
