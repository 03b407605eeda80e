"""Human approval of tool calls: the records in Redis (``ApprovalRecords``, a part of the turn
store held as ``TurnStore.approvals``), the decisions, the gates.

Who must approve is ``worker.turn.approval_policy``; how the turn loop parks and resumes is
``worker.turn.gate``. Rule (docs/architecture.md, "Approvals"): a wait for a person is state in
Redis, never a task. When a step's plan holds calls that need approval, ``begin_tools`` records
one ``pending`` record per such call (same MULTI as the plan) and the turn takes status
``awaiting_approval``. Batches
run in emitted order as usual (``worker.turn.dispatch``); a batch holding an approval call is
*gated*: it is dispatched once (a) the batch before it passed its barrier and (b) every
approval call in it is decided. Whoever makes the second of those true (the barrier's last
call, or the decision) opens the gate with ``SET NX`` and dispatches, so a batch is sent
exactly once whatever the interleaving. Free calls before the first gated batch run at once.

Keys (beside ``worker.turn.store``'s; named in ``worker.turn.keys``, read and written only here):

- ``turn:{id}:approvals:{n}`` hash ``call_id`` -> record JSON (``ApprovalRecord``).
- ``turn:{id}:gate:{n}:{b}``: set once by whoever dispatches gated batch b.
- ``approvals:pending`` sorted set: turn id scored by its earliest approval deadline.

A decision is guarded (WATCH/MULTI on the turn and its records; the turn must be at step n,
phase ``tools``, not ended), recorded with ``by`` and the time, and idempotent: the same
decision again changes nothing; a different one raises ``ApprovalConflict``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Literal

import orjson
import redis

from worker.errors import AgentRuntimeError
from worker.tooling.validators import FieldError, compile_validator
from worker.turn.dispatch import Batch, PlannedCall
from worker.turn.guard import Writes
from worker.turn.keys import PENDING_APPROVALS_KEY as PENDING_KEY
from worker.turn.keys import WATCH_KEY
from worker.turn.keys import key as _k
from worker.turn.request import TurnStatus, unstorable
from worker.turn.state import EVENTS_MAXLEN, RETENTION_SECONDS, CallResult, event_json

Decision = Literal["approved", "rejected"]


class ApprovalError(AgentRuntimeError, ValueError):
    """A decision that cannot apply: unknown turn or call, turn ended or moved on, invalid edited params."""


class ApprovalConflict(ApprovalError):
    """The call was already decided the other way (or with other params)."""


@dataclass
class ApprovalRecord:
    """One call waiting for (or given) a person's decision.

    ``arguments``: the validated params the model sent (JSON); ``params``: edited params the
    approver substituted (None: run as sent); ``schema``: the tool's own parameters JSON Schema
    (edited params are checked against it); times are epoch seconds; ``status`` is
    ``pending``, ``approved`` or ``rejected``.
    """

    turn_id: str
    agent_id: str
    step: int
    call_id: str
    name: str
    activity: str
    arguments: dict[str, Any]
    requested_at: float
    deadline: float
    status: str = "pending"
    by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    params: dict[str, Any] | None = None
    schema: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ApprovalRecord:
        return cls(**orjson.loads(raw))

    def public(self) -> dict[str, Any]:
        """The record as shown to people (without the schema)."""
        d = asdict(self)
        d.pop("schema")
        return d


EVENT_ARGUMENTS_CHARS = 2_000  # bigger arguments (a whole file's content) stay in the record only


def requested_event(rec: ApprovalRecord) -> dict[str, Any]:
    """Fields of ``approval_requested`` (a UI shows "Wants to run: <activity> -- approve?").

    ``arguments`` is the params object, or None with ``arguments_preview`` (the JSON cut to
    ``EVENT_ARGUMENTS_CHARS``) when it is longer; ``pending_approvals`` always has them whole.
    """
    text = orjson.dumps(rec.arguments).decode()
    big = len(text) > EVENT_ARGUMENTS_CHARS
    return {
        "step": rec.step,
        "call_id": rec.call_id,
        "name": rec.name,
        "activity": rec.activity,
        "arguments": None if big else rec.arguments,
        **({"arguments_preview": text[:EVENT_ARGUMENTS_CHARS]} if big else {}),
        "deadline": rec.deadline,
    }


def new_records(
    turn_id: str, agent_id: str, step: int, calls: list[PlannedCall], schemas: dict[str, dict[str, Any]], timeout: float
) -> list[ApprovalRecord]:
    """Pending records for the step's calls that need approval (emitted order)."""
    now = time.time()
    return [
        ApprovalRecord(
            turn_id=turn_id,
            agent_id=agent_id,
            step=step,
            call_id=c.call_id,
            name=c.name,
            activity=c.activity,
            arguments=c.data or {},
            requested_at=now,
            deadline=now + timeout,
            schema=schemas.get(c.name, {}),
        )
        for c in calls
        if c.needs_approval and c.runnable
    ]


_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples", "example"})
# A node with one of these says what other keys may hold, or may declare more keys elsewhere.
_OPEN_KEYWORDS = (
    "additionalProperties",
    "patternProperties",
    "unevaluatedProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "if",
    "dependentSchemas",
    "$ref",
)


def closed_schema(schema: Any, *, in_all_of: bool = False) -> Any:
    """A copy of ``schema`` where every object schema that lists ``properties`` and says nothing
    about other keys (no ``additionalProperties``, ``patternProperties`` or
    ``unevaluatedProperties``) refuses unknown keys.

    A tool that says what extra keys may hold keeps its rule. An object whose keys are also named
    elsewhere (the branches of an ``allOf`` with several entries, a node that combines its
    ``properties`` with ``allOf``/``anyOf``/``oneOf``/``if``/``$ref``) stays open: closing it
    would refuse keys the other part declares.
    """
    if isinstance(schema, list):
        return [closed_schema(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for k, v in schema.items():
        if k in _DATA_KEYWORDS:  # values, not schemas
            out[k] = v
        elif k == "allOf" and isinstance(v, list):
            out[k] = [closed_schema(x, in_all_of=len(v) > 1) for x in v]
        elif k in ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas") and isinstance(
            v, dict
        ):
            out[k] = {name: closed_schema(sub) for name, sub in v.items()}
        else:
            out[k] = closed_schema(v)
    if "properties" in out and not in_all_of and not any(k in out for k in _OPEN_KEYWORDS):
        out["additionalProperties"] = False
    return out


def check_params(rec: ApprovalRecord, params: dict[str, Any]) -> None:
    """Check edited params the way the call's own arguments were checked, and stricter on keys.

    The record's ``schema`` is the tool's own parameters schema (a pydantic model's JSON Schema or
    the raw schema, never the strict copy), validated with the tool layer's validator
    (``worker.tooling.validators.compile_validator``: the schema's draft, format checking on)
    after ``closed_schema``: a key the tool does not declare (``"sudo": true``) is refused, not
    passed on or silently dropped. The worker validates the edited params again with the tool's
    own validator before it runs them (``validate_params``). Raises ``ApprovalError`` naming each
    failing field, or what the record's JSON cannot hold (an integer beyond 64 bits, a lone
    surrogate, nesting over 254 levels); nothing is recorded then, and the call stays pending.
    """
    if not isinstance(params, dict):
        raise ApprovalError("edited params must be a JSON object")
    try:
        errors = compile_validator(closed_schema(rec.schema or {"type": "object"})).field_errors(params)
    except RecursionError:
        errors = [FieldError("<root>", "the params are nested too deeply")]
    if errors:
        detail = "; ".join(f"{e.loc}: {e.msg}" for e in errors)
        raise ApprovalError(f"edited params for {rec.name} are invalid (nothing was recorded): {detail}")
    held = {"params": params}  # as the record holds them, one level down
    try:  # what the schema takes and the record's JSON cannot hold (a 500 when it was stored)
        orjson.dumps(held)
    except TypeError as exc:
        why = unstorable(held, exc)
        raise ApprovalError(f"edited params for {rec.name} cannot be stored (nothing was recorded): {why}") from None


def rejection_result(rec: ApprovalRecord) -> CallResult:
    """The stored result of a rejected call: its ``function_call_output`` carries the reason."""
    who = "the approval deadline" if rec.by == "deadline" else (rec.by or "a person")
    reason = rec.reason or "no reason given"
    return CallResult(
        output=f"Rejected by {who}: {reason}. The call did not run.",
        is_error=True,
        details={"error": "expired" if rec.by == "deadline" else "rejected", "by": rec.by, "reason": rec.reason},
        activity=f"Rejected: {rec.activity}",
        ms=0.0,
    )


def refused_edit_result(rec: ApprovalRecord, why: str) -> CallResult:
    """The stored result of an approved call whose edited params fail ``check_params`` at run time."""
    return CallResult(
        output=f"Error: the approver's edited arguments were refused ({why}). The call did not run.",
        is_error=True,
        details={"error": "invalid_edit", "by": rec.by},
        activity=f"Not run: {rec.activity}",
        ms=0.0,
    )


# ----- gates -----------------------------------------------------------------------


def split_for_approval(batches: list[Batch], calls: list[PlannedCall]) -> list[Batch]:
    """Let free calls run before a decision without breaking the batch rules of ``worker.turn.dispatch``.

    A sequential batch (a chain) is cut before its first call that needs approval: the calls
    before it run now, the rest (in order) waits. A parallel batch (a group, no order among its
    calls) is split into its free calls, then its calls that need approval.
    """
    need = {c.call_id for c in calls if c.needs_approval}
    out: list[Batch] = []
    for b in batches:
        ids = b.call_ids
        if not need.intersection(ids):
            out.append(b)
            continue
        if b.mode == "sequential":
            cut = next(i for i, cid in enumerate(ids) if cid in need)
            parts = [ids[:cut], ids[cut:]]
        else:
            parts = [[c for c in ids if c not in need], [c for c in ids if c in need]]
        out.extend(Batch(b.mode, part) for part in parts if part)
    return out


def gated(batch: Batch, calls: list[PlannedCall]) -> bool:
    """True when the batch holds a call that needs approval."""
    need = {c.call_id for c in calls if c.needs_approval}
    return any(cid in need for cid in batch.call_ids)


# ----- the records in Redis ------------------------------------------------------------


def _approvals_key(turn_id: str, step: int) -> str:
    return _k(turn_id, "approvals", step)


def _gate_key(turn_id: str, step: int, batch_index: int) -> str:
    return _k(turn_id, "gate", step, batch_index)


class ApprovalRecords:
    """The approval records, gate keys and parked turns of turns in the Redis at ``client`` (the
    module docstring's keys). A part of the turn store, held as ``TurnStore.approvals``;
    ``progress_timeout``: seconds of the progress deadline a decision pushes."""

    def __init__(self, client: redis.Redis, *, progress_timeout: float = 600.0):
        # Bytes replies (``decode_responses`` off); the parsing below says what each reply is.
        self._r: Any = client
        self.progress_timeout = progress_timeout

    def request_writes(self, turn_id: str, records: list[ApprovalRecord]) -> Callable[[Writes], None]:
        """The writes that store the pending ``records``, park the turn and announce them, for
        ``Moves.begin_tools_writes(also=...)`` (the same transaction as the step's plan)."""

        def write(pipe: Writes) -> None:
            if not records:
                return
            step = records[0].step
            pipe.hset(_approvals_key(turn_id, step), mapping={r.call_id: r.to_json() for r in records})
            pipe.expire(_approvals_key(turn_id, step), RETENTION_SECONDS)
            pipe.hset(_k(turn_id), "status", TurnStatus.awaiting_approval.value)
            pipe.zadd(PENDING_KEY, {turn_id: min(r.deadline for r in records)})
            for rec in records:
                pipe.xadd(
                    _k(turn_id, "events"),
                    {"e": event_json("approval_requested", requested_event(rec))},
                    maxlen=EVENTS_MAXLEN,
                    approximate=True,
                )

        return write

    def records(self, turn_id: str, step: int) -> dict[str, ApprovalRecord]:
        """The step's approval records by ``call_id``."""
        raw = self._r.hgetall(_approvals_key(turn_id, step))
        return {k.decode(): ApprovalRecord.from_json(v) for k, v in raw.items()}

    def record(self, turn_id: str, step: int, call_id: str) -> ApprovalRecord | None:
        """One call's approval record, or None."""
        raw = self._r.hget(_approvals_key(turn_id, step), call_id)
        return ApprovalRecord.from_json(raw) if raw else None

    def pending(self, turn_id: str | None = None, agent_id: str | None = None) -> list[ApprovalRecord]:
        """Undecided records of parked turns: of one turn, of one agent's turns, or all (oldest
        first). A turn that ended or moved on leaves the parked turns as it is met."""
        r = self._r
        ids = [turn_id] if turn_id else [x.decode() for x in r.zrange(PENDING_KEY, 0, -1)]
        out: list[ApprovalRecord] = []
        for tid in ids:
            h = r.hmget(_k(tid), "status", "step", "phase", "agent_id")
            if h[0] is None:
                r.zrem(PENDING_KEY, tid)
                continue
            if agent_id and (h[3] or b"").decode() != agent_id:
                continue
            if TurnStatus(h[0].decode()).terminal or h[2] != b"tools":
                r.zrem(PENDING_KEY, tid)  # ended or moved on: nothing waits anymore
                continue
            out.extend(rec for rec in self.records(tid, int(h[1])).values() if rec.status == "pending")
        return sorted(out, key=lambda rec: (rec.requested_at, rec.turn_id, rec.call_id))

    def decide(
        self,
        turn_id: str,
        call_id: str,
        decision: Decision,
        *,
        by: str,
        reason: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[ApprovalRecord, bool]:
        """Record a decision on a pending call of the turn's current step.

        Returns ``(record, changed)``; ``changed`` is False when the same decision was already
        recorded (idempotent). The last decision of the step sets the turn back to ``running``.
        ``by`` (required, non-empty) names who decides. Raises ``ApprovalError`` (no ``by``,
        unknown turn or call, turn ended, invalid edited params (``check_params``): nothing
        changes) and ``ApprovalConflict`` (decided otherwise before).
        """
        if decision not in ("approved", "rejected"):
            raise ApprovalError(f"decision must be 'approved' or 'rejected', not {decision!r}")
        if params is not None and decision != "approved":
            raise ApprovalError("edited params go with an approval only")
        if not isinstance(by, str) or not by.strip():
            raise ApprovalError("a decision needs `by`: who decides (recorded with the time)")
        result: list[tuple[ApprovalRecord, bool]] = []

        def txn(pipe: Any) -> None:
            result[:] = [self._decide(pipe, turn_id, call_id, decision, by, reason, params)]

        self._r.transaction(txn, _k(turn_id))
        return result[0]

    def _decide(
        self,
        pipe: Any,
        turn_id: str,
        call_id: str,
        decision: Decision,
        by: str,
        reason: str | None,
        params: dict[str, Any] | None,
    ) -> tuple[ApprovalRecord, bool]:
        # One try of ``decide``'s transaction (WATCH on the turn's hash and the step's records).
        h = pipe.hgetall(_k(turn_id))
        if not h:
            raise ApprovalError(f"unknown turn {turn_id}")
        status = TurnStatus(h[b"status"].decode())
        step, raw = int(h[b"step"]), None
        # The current step's records first; an older step's only to answer a repeated decision.
        for n in range(int(h[b"step"]), -1, -1):
            pipe.watch(_approvals_key(turn_id, n))  # watched before read: a concurrent decision retries us
            raw = pipe.hget(_approvals_key(turn_id, n), call_id)
            if raw is not None:
                step = n
                break
        if raw is None:
            raise ApprovalError(f"call {call_id} of turn {turn_id} is not waiting for approval")
        akey = _approvals_key(turn_id, step)
        rec = ApprovalRecord.from_json(raw)
        if rec.status != "pending":
            if rec.status == decision and (params is None or params == rec.params):
                pipe.multi()
                return rec, False
            raise ApprovalConflict(
                f"call {call_id} was already {rec.status} by {rec.by} at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(rec.decided_at or 0))}"
            )
        if status.terminal or h[b"phase"] != b"tools" or int(h[b"step"]) != step:
            raise ApprovalError(f"turn {turn_id} is {status.value}: nothing waits for a decision")
        if params is not None:
            check_params(rec, params)
        others = [ApprovalRecord.from_json(v) for k, v in pipe.hgetall(akey).items() if k.decode() != call_id]
        rec.status, rec.by, rec.decided_at = decision, by, time.time()
        rec.reason, rec.params = reason, params
        last = all(o.status != "pending" for o in others)
        pipe.multi()
        pipe.hset(akey, call_id, rec.to_json())
        event = {
            "step": step,
            "call_id": call_id,
            "name": rec.name,
            "activity": rec.activity,
            "decision": decision,
            "by": by,
            "reason": reason,
            "edited": params is not None,
        }
        pipe.xadd(
            _k(turn_id, "events"), {"e": event_json("approval_decided", event)}, maxlen=EVENTS_MAXLEN, approximate=True
        )
        now = time.time()
        fields: dict[str, Any] = {"updated_at": now, "redrives": 0}
        if last:
            fields["status"] = TurnStatus.running.value
            pipe.zrem(PENDING_KEY, turn_id)
        pipe.hset(_k(turn_id), mapping=fields)
        pipe.zadd(WATCH_KEY, {turn_id: now + self.progress_timeout})
        return rec, True

    def try_open(
        self, turn_id: str, step: int, batch_index: int, batches: list[Batch], calls: list[PlannedCall]
    ) -> bool:
        """True exactly once, for the caller that finds gated batch ``batch_index`` ready to
        dispatch: the batch before it passed its barrier and every approval call in it is decided."""
        if batch_index > 0 and not self._r.exists(_k(turn_id, "adv", step, batch_index - 1)):
            return False
        need = {c.call_id for c in calls if c.needs_approval} & set(batches[batch_index].call_ids)
        recs = self.records(turn_id, step)
        if any(recs.get(cid) is None or recs[cid].status == "pending" for cid in need):
            return False
        return bool(self._r.set(_gate_key(turn_id, step, batch_index), "1", nx=True, ex=RETENTION_SECONDS))

    def is_open(self, turn_id: str, step: int, batch_index: int) -> bool:
        """True once gated batch ``batch_index`` was opened (``try_open``): it was dispatched."""
        return bool(self._r.exists(_gate_key(turn_id, step, batch_index)))

    def next_gated(self, turn_id: str, step: int, batches: list[Batch], calls: list[PlannedCall]) -> int | None:
        """Index of the first gated batch not yet opened, or None."""
        for i, b in enumerate(batches):
            if gated(b, calls) and not self.is_open(turn_id, step, i):
                return i
        return None

    def forget(self, turn_id: str) -> None:
        """Drop an ended turn from the parked turns."""
        self._r.zrem(PENDING_KEY, turn_id)

    def overdue_turns(self, now: float | None = None, limit: int = 100) -> list[str]:
        """Parked turns whose earliest approval deadline has passed (for the watchdog sweep)."""
        now = time.time() if now is None else now
        return [x.decode() for x in self._r.zrangebyscore(PENDING_KEY, "-inf", now, start=0, num=limit)]
