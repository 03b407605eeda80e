"""The turn's state in Redis between steps.

One concept kept whole on purpose: every write to a turn's keys, so that the fencing rules (guards
on ``step`` and ``phase``) can be read and checked in one place (claims and the barrier, the reply
memo, approvals and usage are parts built on the same client: ``store.claims``, ``store.memo``,
``store.approvals``, ``store.usage``).

A turn is a chain of steps over this state; no task waits on another. Every transition is guarded:
one Lua script (``worker.turn.guard``) checks the turn's current ``step`` and ``phase`` and only
then applies the writes, so a duplicate or late message (``acks_late`` redelivery, watchdog
re-drive) changes nothing: it is fenced out.

The keys are listed and named in ``worker.turn.keys``. No module outside the store (this module,
``keys``, ``guard``, ``claims``, ``memo``, ``approvals``, ``usage``) reads or writes them, and the
client is private: the parts and the Celery edge call the methods below
(``tests/unit/turn/test_store_owns_keys.py``).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import orjson
import redis

from worker.model.items import unanswered_call_ids
from worker.turn.approvals import ApprovalRecords
from worker.turn.claims import Claims
from worker.turn.dispatch import Plan
from worker.turn.durability import NO_REPLICAS, ReplicaAck
from worker.turn.guard import CancelScript, CreateScript, GuardScript, Writes
from worker.turn.keys import CANCELS_KEPT, CANCELS_KEY, FINISHING_KEY, WATCH_KEY, creation_layout, idem_key, index_key
from worker.turn.keys import key as _k
from worker.turn.listing import TurnListing, title_of
from worker.turn.memo import ReplyMemo
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

HOOK_TIMEOUT = 60.0  # seconds before the watchdog re-sends a turn's end hooks


def _interrupted(status: TurnStatus, started: bool) -> str:
    """The output of a call the turn's end left without one (``TurnStore.fail``)."""
    if started:
        return f"Interrupted: the turn ended ({status.value}) before this call finished; its outcome is unknown."
    return f"Interrupted: the turn ended ({status.value}) before this call started; it did not run."


class TurnStore:
    """Redis-backed turn state. ``client`` is a ``redis.Redis`` (bytes responses), held privately:
    every read and write of a turn's keys is a method of the store or of one of its parts, built
    here on the same client: ``claims`` (claims and the barrier), ``memo`` (model replies),
    ``approvals`` (approval records and gates), ``usage`` (token usage per step).
    ``progress_timeout``: seconds a turn may go without progress before the watchdog re-drives it."""

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
        # Seconds of the progress deadline a transition may leave unpushed (``_touch``): a move
        # made within this long of the last one keeps that one's deadline (the worker's: half
        # its ``progress_slack``; 0: every transition pushes it).
        self.deadline_reuse = deadline_reuse
        # The writes that fence side effects or money wait for replicas (worker.turn.durability).
        self.durability = durability
        self.claims = Claims(client, progress_timeout=progress_timeout, durability=durability)
        self.memo = ReplyMemo(client, durability)
        self.approvals = ApprovalRecords(client, progress_timeout=progress_timeout)
        self.usage = UsageLedger(client)
        self.listing = TurnListing(client)
        self._guard = GuardScript(client, FINISHING_KEY)
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
                self._xadd(p, turn_id, kind, data)
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
            # The watch's deadline as set here (``_touch`` keeps it): a step's claim reads it with the hash.
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

    def _guarded(
        self,
        turn_id: str,
        step: int,
        phase: str,
        write: Callable[[Writes], None],
        *,
        only_if_status: TurnStatus | None = None,
        ends: bool = False,
    ) -> bool:
        """Apply the writes ``write(w)`` records, in one round trip, only if the turn is at
        ``step``/``phase`` and not terminal (``worker.turn.guard``); ``only_if_status``: a turn in
        another status is left unchanged; ``ends``: the transition ends the turn (its end hooks
        are scheduled). Returns True when the ended turn has end hooks to run. Raises
        ``StaleStep`` when fenced out (nothing written)."""
        writes = Writes()
        write(writes)
        return self._guard.run(
            turn_id,
            step,
            phase,
            writes,
            only_if_status=only_if_status.value if only_if_status is not None else None,
            hooks_deadline=time.time() + HOOK_TIMEOUT if ends else None,
        )

    @staticmethod
    def hooks_deadline() -> float:
        """The deadline (epoch s) of the end hooks of a turn that ends now (``turns:finishing``)."""
        return time.time() + HOOK_TIMEOUT

    def _touch(
        self, pipe: Any, turn_id: str, fields: dict[str, Any], *, ends: bool = False, known_deadline: float = 0.0
    ) -> None:
        # Progress: a new deadline (none when it ``ends``: ``_retire`` unwatches), re-drives from 0.
        # The hash's ``deadline`` is the one set here, read by ``Claims.begin_step`` (which then
        # need not push the watch's); other writers of the watch only push it later, so the field
        # never claims a later deadline than the watch holds. ``known_deadline``: the hash's
        # ``deadline`` as the caller read it (under the fence that guards these writes: no other
        # transition can have moved it since); when it is at most ``deadline_reuse`` seconds short
        # of a new one, it stays (the hash's field and the watch's score with it): a turn is
        # re-driven after at least ``progress_timeout - deadline_reuse`` s without progress.
        now = time.time()
        if ends:
            pipe.hset(_k(turn_id), mapping={"redrives": 0, **fields, "updated_at": now})
            return
        if self.deadline_reuse > 0 and known_deadline >= now + self.progress_timeout - self.deadline_reuse:
            pipe.hset(_k(turn_id), mapping={"redrives": 0, **fields, "updated_at": now})
            return
        deadline = now + self.progress_timeout
        pipe.hset(_k(turn_id), mapping={"redrives": 0, **fields, "updated_at": now, "deadline": deadline})
        pipe.zadd(WATCH_KEY, {turn_id: deadline})

    @staticmethod
    def _count_model_call(pipe: Any, turn_id: str, fields: dict[str, Any], model_calls: int | None) -> None:
        """``model_calls`` (the count with this call) into ``fields``, else an ``HINCRBY`` (exact: docs/architecture.md)."""
        if model_calls is None:
            pipe.hincrby(_k(turn_id), "model_calls", 1)
        else:
            fields["model_calls"] = model_calls

    def mark_running(self, turn_id: str, step: int, event: dict[str, Any] | None = None) -> None:
        """``queued`` -> ``running`` at the first step, with the ``turn_started`` event ``event``
        in the same transaction (guarded; raises ``StaleStep`` if fenced out)."""

        def w(pipe: Any) -> None:
            self._touch(pipe, turn_id, {"status": TurnStatus.running.value})
            if event is not None:
                self._xadd(pipe, turn_id, "turn_started", event)

        self._guarded(turn_id, step, "model", w, only_if_status=TurnStatus.queued)

    def apply_begin_tools(self, turn_id: str, step: int, writes: Writes) -> None:
        """Apply ``begin_tools_writes``'s writes, guarded on ``step``'s model phase (or have
        ``ReplyMemo.save_and_check`` apply them with the reply). Raises ``StaleStep`` if another
        delivery already moved the turn on."""
        self._guarded(turn_id, step, "model", lambda w: w.recorded.extend(writes.recorded))

    def begin_tools_writes(
        self,
        turn_id: str,
        step: int,
        reply_items: list[dict[str, Any]],
        plan: Plan,
        pre_results: dict[str, CallResult],
        invalid_counts: dict[str, int],
        loaded_tools: list[str] | None = None,
        also: Callable[[Any], None] | None = None,
        events: Sequence[tuple[str, dict[str, Any]]] = (),
        model_calls: int | None = None,
        known_deadline: float = 0.0,
        usage: tuple[str, bytes] | None = None,
        layout: int = 1,
    ) -> Writes:
        """The writes that record the reply's items and the dispatch plan and move the step to its
        tools phase, unguarded (``apply_begin_tools``, or ``ReplyMemo.save_and_check``'s ``then``).
        ``events`` (``[(kind, fields)]``, e.g. ``call_planned``) are appended and ``also(w)`` adds
        writes (the approval requests of ``worker.turn.approvals``); ``model_calls``: ``_count_model_call``;
        ``known_deadline``: the hash's ``deadline`` as read (``_touch``); ``usage``: the step's usage
        record as a field of the turn hash and its value (a layout-2 turn whose reply moves it in the
        reply's own script: ``ReplyMemo.save_and_check``, which then writes no record of its own);
        ``layout``: the turn's (``TurnState.layout``): a layout-2 turn keeps the plan of a step that
        asks no approval in its hash (``plan``, ``plan_step``: the move's own ``HSET``), read by
        the step's calls with the hash; the plan of one that asks is kept in ``plan:{n}`` (the
        approvals' pages read it after the turn moved on)."""
        writes = Writes()

        def w(pipe: Any) -> None:
            if reply_items:
                pipe.rpush(_k(turn_id, "items"), *[orjson.dumps(i) for i in reply_items])
            # The calls a tool-call task may claim with its first read are named by their messages
            # (``Plan.started_at_once``), no longer in a hash of the step's.
            in_hash = layout >= 2 and also is None
            if not in_hash:
                pipe.set(_k(turn_id, "plan", step), orjson.dumps(plan.to_json()), ex=RETENTION_SECONDS)
            if pre_results:
                pipe.hset(
                    _k(turn_id, "results", step), mapping={k: orjson.dumps(v.to_json()) for k, v in pre_results.items()}
                )
                pipe.expire(_k(turn_id, "results", step), RETENTION_SECONDS)
            fields: dict[str, Any] = {"phase": "tools", "invalid_counts": orjson.dumps(invalid_counts)}
            if loaded_tools is not None:
                fields["loaded_tools"] = orjson.dumps(loaded_tools)
            self._count_model_call(pipe, turn_id, fields, model_calls)
            if usage is not None:
                fields[usage[0]] = usage[1]
            if in_hash:
                fields["plan"], fields["plan_step"] = orjson.dumps(plan.to_json()), step
                if pre_results:  # a result stored: the step is not closed without keeping them (``Claims``)
                    fields["results_step"] = step
            self._touch(pipe, turn_id, fields, known_deadline=known_deadline)
            for kind, data in events:
                self._xadd(pipe, turn_id, kind, data)
            if also is not None:
                also(pipe)

        w(writes)
        return writes

    def _xadd(self, pipe: Any, turn_id: str, kind: str, data: dict[str, Any]) -> None:
        pipe.xadd(_k(turn_id, "events"), {"e": event_json(kind, data)}, maxlen=EVENTS_MAXLEN, approximate=True)

    def finish_tools(
        self,
        turn_id: str,
        step: int,
        output_items: list[dict[str, Any]],
        terminal: TurnStatus | None = None,
        error: str | None = None,
        loaded_tools: list[str] | None = None,
    ) -> None:
        """Append the outputs (emitted order) and move to the next step, or end the turn with ``terminal``."""

        ended: dict[str, Any] = {}
        if terminal is not None:
            ended = {"status": terminal.value, **({"error": error} if error else {})}

        def w(pipe: Any) -> None:
            self._finish_tools(pipe, turn_id, step, output_items, loaded_tools, ended)
            if terminal is not None:
                self._retire(pipe, turn_id)

        self._guarded(turn_id, step, "tools", w, ends=terminal is not None)

    def next_step_writes(
        self,
        turn_id: str,
        step: int,
        output_items: list[dict[str, Any]],
        loaded_tools: list[str] | None = None,
        known_deadline: float = 0.0,
    ) -> Writes:
        """``finish_tools``'s writes for a step that goes on to ``step + 1``, unguarded: for
        ``Claims.record_and_check``, which applies them with the step's last result when the turn
        is still at ``step``'s tools phase (``BatchCompletion.closing_writes``). ``known_deadline``:
        the hash's ``deadline`` as the caller read it (``_touch``)."""
        writes = Writes()
        self._finish_tools(writes, turn_id, step, output_items, loaded_tools, known_deadline=known_deadline)
        return writes

    def _finish_tools(
        self,
        pipe: Any,
        turn_id: str,
        step: int,
        output_items: list[dict[str, Any]],
        loaded_tools: list[str] | None,
        ended: dict[str, Any] | None = None,
        known_deadline: float = 0.0,
    ) -> None:
        if output_items:
            pipe.rpush(_k(turn_id, "items"), *[orjson.dumps(i) for i in output_items])
        fields: dict[str, Any] = {"step": step + 1, "phase": "model", **(ended or {})}
        if loaded_tools is not None:
            fields["loaded_tools"] = orjson.dumps(loaded_tools)
        self._touch(pipe, turn_id, fields, ends=bool(ended), known_deadline=known_deadline)

    def continue_after_reply(
        self, turn_id: str, step: int, items: list[dict[str, Any]], fields: dict[str, Any] | None = None
    ) -> None:
        """Record a reply that ran no tool plus follow-up input items, and move to step + 1."""

        def w(pipe: Any) -> None:
            if items:
                pipe.rpush(_k(turn_id, "items"), *[orjson.dumps(i) for i in items])
            self._touch(pipe, turn_id, {"step": step + 1, "phase": "model", **(fields or {})})
            pipe.hincrby(_k(turn_id), "model_calls", 1)

        self._guarded(turn_id, step, "model", w)

    def end_at_model_step(
        self,
        turn_id: str,
        step: int,
        reply_items: list[dict[str, Any]],
        status: TurnStatus,
        final_output: str | None = None,
        error: str | None = None,
        count_model_call: bool = True,
        finished_event: dict[str, Any] | None = None,
        model_calls: int | None = None,
        layout: int = 1,
    ) -> bool:
        """End the turn at a model step (final answer, cap reached, failure), with the
        ``turn_finished`` event ``finished_event`` if given. Returns True when the turn has end
        hooks to run (``END_HOOK_METADATA``). ``layout``: the turn's (``TurnState.layout``; its
        keys to retire)."""

        def w(pipe: Any) -> None:
            self._end_at_model_step(pipe, turn_id, reply_items, status, final_output, error,
                                    model_calls if count_model_call else -1, layout=layout)  # fmt: skip
            if finished_event is not None:
                self._xadd(pipe, turn_id, "turn_finished", finished_event)

        return self._guarded(turn_id, step, "model", w, ends=True)

    def end_writes(
        self,
        turn_id: str,
        reply_items: list[dict[str, Any]],
        status: TurnStatus,
        *,
        final_output: str | None,
        error: str | None,
        model_calls: int,
        usage: tuple[str, bytes],
        finished_event: dict[str, Any],
    ) -> Writes:
        """``end_at_model_step``'s writes for a layout-2 turn whose final reply ends it, unguarded,
        with the ``turn_finished`` event ``finished_event``: for ``ReplyMemo.save_and_check``'s
        ``then``, which applies them with the reply (the fence is its own) and schedules the end
        hooks. ``usage``: the step's record, a field of the turn hash (``UsageLedger.row``)."""
        writes = Writes()
        self._end_at_model_step(writes, turn_id, reply_items, status, final_output, error, model_calls,
                                layout=2, usage=usage)  # fmt: skip
        self._xadd(writes, turn_id, "turn_finished", finished_event)
        return writes

    def _end_at_model_step(
        self,
        pipe: Any,
        turn_id: str,
        reply_items: list[dict[str, Any]],
        status: TurnStatus,
        final_output: str | None,
        error: str | None,
        model_calls: int | None,
        *,
        layout: int,
        usage: tuple[str, bytes] | None = None,
    ) -> None:
        # ``model_calls``: -1 counts no model call, None increments (``_count_model_call``).
        if reply_items:
            pipe.rpush(_k(turn_id, "items"), *[orjson.dumps(i) for i in reply_items])
        fields: dict[str, Any] = {"status": status.value}
        if final_output is not None:
            fields["final_output"] = final_output
        if error:
            fields["error"] = error
        if model_calls != -1:
            self._count_model_call(pipe, turn_id, fields, model_calls)
        if usage is not None:
            fields[usage[0]] = usage[1]
        self._touch(pipe, turn_id, fields, ends=True)
        self._retire(pipe, turn_id, layout)

    def fail(self, turn_id: str, status: TurnStatus, error: str) -> bool:
        """End a non-terminal turn whatever its step (cancel, gateway failure, watchdog give-up).

        Every ``function_call`` still without an output gets one (docs/architecture.md, "Batches"):
        its stored result if the call finished, else an "Interrupted" output that says whether
        the call started (a claim exists: its outcome is unknown) or never did (not run: an
        approved call whose gate never opened, a call still queued); the cancel
        flag is set so tools still running stop. Returns False if the turn had already ended.
        """
        key = _k(turn_id)
        ended = False

        def txn(pipe: Any) -> None:
            nonlocal ended
            ended = False  # redis-py runs this again when EXEC aborts (the turn changed meanwhile)
            h = pipe.hgetall(key)
            if not h or TurnStatus(h[b"status"].decode()).terminal:
                return
            items = [orjson.loads(x) for x in pipe.lrange(_k(turn_id, "items"), 0, -1)]
            missing = unanswered_call_ids(items)
            results: dict[str, CallResult] = {}
            started: set[bytes] = set()
            if missing:
                step = int(h[b"step"])
                results = parse_results(pipe.hgetall(_k(turn_id, "results", step)))
                started = set(pipe.hkeys(_k(turn_id, "claims", step)))
            pipe.multi()
            outputs = []
            for call_id in missing:
                res = results.get(call_id)
                text = res.output if res else _interrupted(status, call_id.encode() in started)
                outputs.append(orjson.dumps({"type": "function_call_output", "call_id": call_id, "output": text}))
            if outputs:
                pipe.rpush(_k(turn_id, "items"), *outputs)
            pipe.set(_k(turn_id, "cancel"), "1", ex=RETENTION_SECONDS)
            pipe.zadd(CANCELS_KEY, {turn_id: time.time()})  # model calls in flight see it (``cancelled_of``)
            pipe.zremrangebyscore(CANCELS_KEY, "-inf", f"({time.time() - CANCELS_KEPT}")
            self._touch(pipe, turn_id, {"status": status.value, "error": error, "cancel": 1}, ends=True)
            self._retire(pipe, turn_id, int(h.get(b"layout", b"1")))
            if h.get(b"end_hooks") == b"1":  # until its hooks have run (``hooks_done``), the watchdog re-sends them
                pipe.zadd(FINISHING_KEY, {turn_id: time.time() + HOOK_TIMEOUT})
            ended = True

        self._r.transaction(txn, key)
        return ended

    def _retire(self, pipe: Any, turn_id: str, layout: int = 1) -> None:
        """Queue the retirement of an ended turn in ``pipe``: no longer watched, its keys expire. (Its
        end hooks are scheduled by the caller: ``_guarded(ends=True)`` or ``fail``.) Not the cancel
        flag's: set with it. ``layout``: the turn's; a layout-2 turn has no usage hash (its records
        are the turn hash's fields)."""
        pipe.zrem(WATCH_KEY, turn_id)
        pipe.expire(_k(turn_id), RETENTION_SECONDS)
        pipe.expire(_k(turn_id, "items"), RETENTION_SECONDS)
        pipe.expire(_k(turn_id, "events"), RETENTION_SECONDS)
        if layout < 2:  # the usage hash has no expiry of its own before (``ReplyMemo.save_and_check``)
            pipe.expire(_k(turn_id, "usage"), RETENTION_SECONDS)

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
