"""The turn's moves: its guarded transitions from step to step, and its end.

A turn is a chain of steps over its state in Redis; no task waits on another. Every transition is
guarded: one Lua script (``worker.turn.guard``) checks the turn's current ``step`` and ``phase`` and
only then applies the writes, so a duplicate or late message (``acks_late`` redelivery, watchdog
re-drive) changes nothing: it is fenced out. A move's writes are recorded (``Writes``) and applied by
the guard, or handed unguarded to the script that fences them itself (a reply's: ``ReplyMemo``, a
result's: ``Barrier``). The one move that is not a guard script is ``fail``, which ends a turn
whatever its step (a ``WATCH`` transaction).

``TurnStore`` (``worker.turn.store``) holds one ``Moves`` on its Redis client, as ``store.moves``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import orjson
import redis
from redis.typing import EncodableT, FieldT

from worker.model.items import unanswered_call_ids
from worker.turn.dispatch import Plan
from worker.turn.guard import GuardScript, Writes, WriteTarget
from worker.turn.keys import CANCELS_KEPT, CANCELS_KEY, FINISHING_KEY, WATCH_KEY
from worker.turn.keys import key as _k
from worker.turn.request import TurnStatus
from worker.turn.state import EVENTS_MAXLEN, RETENTION_SECONDS, CallResult, event_json, parse_results

HOOK_TIMEOUT = 60.0  # seconds before the watchdog re-sends a turn's end hooks

Fields = dict[FieldT, EncodableT]
"""Fields of the turn hash as a move writes them (``HSET``'s mapping)."""


class Moves:
    """The guarded transitions of the turns in the Redis at ``client`` (see the module docstring).
    ``progress_timeout``: seconds a turn may go without progress before the watchdog re-drives it;
    ``deadline_reuse``: seconds of the progress deadline a move may leave unpushed (``_touch``)."""

    def __init__(self, client: redis.Redis, *, progress_timeout: float = 600.0, deadline_reuse: float = 0.0):
        self._r: Any = client  # ``fail``'s transaction; every other move goes through the guard
        self.progress_timeout = progress_timeout
        # The worker's: half its ``progress_slack``; 0: every move pushes the deadline.
        self.deadline_reuse = deadline_reuse
        self._guard = GuardScript(client, FINISHING_KEY)

    @staticmethod
    def hooks_deadline() -> float:
        """The deadline (epoch s) of the end hooks of a turn that ends now (``turns:finishing``)."""
        return time.time() + HOOK_TIMEOUT

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
            hooks_deadline=self.hooks_deadline() if ends else None,
        )

    def _touch(
        self, pipe: WriteTarget, turn_id: str, fields: Fields, *, ends: bool = False, known_deadline: float = 0.0
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
        reused = self.deadline_reuse > 0 and known_deadline >= now + self.progress_timeout - self.deadline_reuse
        if ends or reused:
            pipe.hset(_k(turn_id), mapping={"redrives": 0, **fields, "updated_at": now})
            return
        deadline = now + self.progress_timeout
        pipe.hset(_k(turn_id), mapping={"redrives": 0, **fields, "updated_at": now, "deadline": deadline})
        pipe.zadd(WATCH_KEY, {turn_id: deadline})

    def mark_running(self, turn_id: str, step: int, event: dict[str, Any] | None = None) -> None:
        """``queued`` -> ``running`` at the first step, with the ``turn_started`` event ``event``
        in the same transaction (guarded; raises ``StaleStep`` if fenced out)."""

        def w(pipe: Writes) -> None:
            self._touch(pipe, turn_id, {"status": TurnStatus.running.value})
            if event is not None:
                add_event(pipe, turn_id, "turn_started", event)

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
        also: Callable[[Writes], None] | None = None,
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
        pipe = Writes()
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
        fields: Fields = {"phase": "tools", "invalid_counts": orjson.dumps(invalid_counts)}
        if loaded_tools is not None:
            fields["loaded_tools"] = orjson.dumps(loaded_tools)
        _count_model_call(pipe, turn_id, fields, model_calls)
        if usage is not None:
            fields[usage[0]] = usage[1]
        if in_hash:
            fields["plan"], fields["plan_step"] = orjson.dumps(plan.to_json()), step
            if pre_results:  # a result stored: the step is not closed without keeping them (``Barrier``)
                fields["results_step"] = step
        self._touch(pipe, turn_id, fields, known_deadline=known_deadline)
        for kind, data in events:
            add_event(pipe, turn_id, kind, data)
        if also is not None:
            also(pipe)
        return pipe

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

        ended: Fields = {}
        if terminal is not None:
            ended = {"status": terminal.value, **({"error": error} if error else {})}

        def w(pipe: Writes) -> None:
            self._finish_tools(pipe, turn_id, step, output_items, loaded_tools, ended)
            if terminal is not None:
                _retire(pipe, turn_id)

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
        ``Barrier.record_and_check``, which applies them with the step's last result when the turn
        is still at ``step``'s tools phase (``BatchCompletion.closing_writes``). ``known_deadline``:
        the hash's ``deadline`` as the caller read it (``_touch``)."""
        writes = Writes()
        self._finish_tools(writes, turn_id, step, output_items, loaded_tools, known_deadline=known_deadline)
        return writes

    def _finish_tools(
        self,
        pipe: Writes,
        turn_id: str,
        step: int,
        output_items: list[dict[str, Any]],
        loaded_tools: list[str] | None,
        ended: Fields | None = None,
        known_deadline: float = 0.0,
    ) -> None:
        if output_items:
            pipe.rpush(_k(turn_id, "items"), *[orjson.dumps(i) for i in output_items])
        fields: Fields = {"step": step + 1, "phase": "model", **(ended or {})}
        if loaded_tools is not None:
            fields["loaded_tools"] = orjson.dumps(loaded_tools)
        self._touch(pipe, turn_id, fields, ends=bool(ended), known_deadline=known_deadline)

    def continue_after_reply(
        self, turn_id: str, step: int, items: list[dict[str, Any]], fields: Fields | None = None
    ) -> None:
        """Record a reply that ran no tool plus follow-up input items, and move to step + 1."""

        def w(pipe: Writes) -> None:
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

        def w(pipe: Writes) -> None:
            self._end_at_model_step(pipe, turn_id, reply_items, status, final_output, error,
                                    model_calls if count_model_call else -1, layout=layout)  # fmt: skip
            if finished_event is not None:
                add_event(pipe, turn_id, "turn_finished", finished_event)

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
        add_event(writes, turn_id, "turn_finished", finished_event)
        return writes

    def _end_at_model_step(
        self,
        pipe: Writes,
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
        fields: Fields = {"status": status.value}
        if final_output is not None:
            fields["final_output"] = final_output
        if error:
            fields["error"] = error
        if model_calls != -1:
            _count_model_call(pipe, turn_id, fields, model_calls)
        if usage is not None:
            fields[usage[0]] = usage[1]
        self._touch(pipe, turn_id, fields, ends=True)
        _retire(pipe, turn_id, layout)

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

        def txn(pipe: Any) -> None:  # replies are bytes (the client's), the stubs say ``bytes | str``
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
            pipe.zadd(CANCELS_KEY, {turn_id: time.time()})  # model calls in flight see it (``TurnStore.cancelled_of``)
            pipe.zremrangebyscore(CANCELS_KEY, "-inf", f"({time.time() - CANCELS_KEPT}")
            self._touch(pipe, turn_id, {"status": status.value, "error": error, "cancel": 1}, ends=True)
            _retire(pipe, turn_id, int(h.get(b"layout", b"1")))
            # until its hooks have run (``TurnStore.hooks_done``), the watchdog re-sends them
            if h.get(b"end_hooks") == b"1":
                pipe.zadd(FINISHING_KEY, {turn_id: time.time() + HOOK_TIMEOUT})
            ended = True

        self._r.transaction(txn, key)
        return ended


def add_event(pipe: WriteTarget, turn_id: str, kind: str, data: dict[str, Any]) -> None:
    """Queue the append of a ``kind`` event with ``data`` to the turn's stream in ``pipe``."""
    pipe.xadd(_k(turn_id, "events"), {"e": event_json(kind, data)}, maxlen=EVENTS_MAXLEN, approximate=True)


def _count_model_call(pipe: Writes, turn_id: str, fields: Fields, model_calls: int | None) -> None:
    """``model_calls`` (the count with this call) into ``fields``, else an ``HINCRBY`` (exact: docs/architecture.md)."""
    if model_calls is None:
        pipe.hincrby(_k(turn_id), "model_calls", 1)
    else:
        fields["model_calls"] = model_calls


def _retire(pipe: WriteTarget, turn_id: str, layout: int = 1) -> None:
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


def _interrupted(status: TurnStatus, started: bool) -> str:
    """The output of a call the turn's end left without one (``Moves.fail``)."""
    if started:
        return f"Interrupted: the turn ended ({status.value}) before this call finished; its outcome is unknown."
    return f"Interrupted: the turn ended ({status.value}) before this call started; it did not run."
