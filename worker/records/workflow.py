"""Workflow tasks: records in Redis, attempts, commit and retry.

One concept, a task's record and its transitions (start, launch, cancel, retry, commit);
the result schema rules are in ``worker.records.result_schema``.

A workflow task is an isolated unit of work (a title, instructions and a
result JSON Schema). Each attempt runs as its own turn with a fresh
conversation: ``toolset="workflow_task"``, ``queue="workflow"``,
``finish_tool="submit_result"`` and ``metadata={"workflow_task_id",
"attempt", "result_schema"}`` (docs/architecture.md, "Workflow tasks"). Attempts never share conversation state: each one gets a new turn
whose only input is the task's instructions.

Plain Python (no Celery): ``WorkflowService`` is used by the main-turn tools
(``worker.tools.workflow``), the ``submit_result`` tool, the turn-end hook
(``tasks.hooks``) and the control-plane client (``control.workflow``).

Redis layout:

- ``workflow:{task_id}`` hash: ``task_id``, ``agent_id``, ``title``,
  ``instructions``, ``status`` (``queued`` | ``running`` | ``succeeded`` |
  ``failed`` | ``cancelled``), ``result_schema`` (JSON; the *persisted*
  schema, the one the commit validates against), ``use_brain`` (0/1),
  ``model``, ``strict`` (0/1) and ``strict_note`` (why ``submit_result`` is not
  strict, if so), ``origin`` (the turn that started it, or ``control-plane``),
  ``approval`` (JSON: the starting turn's approval policy, which every attempt's
  turn carries; ``null`` for a control-plane task: the worker's settings),
  ``attempts`` (JSON list, below), ``result`` (JSON, only once succeeded),
  ``error`` (the failure reason), ``created_at`` / ``updated_at`` (epoch s).
- each attempt: ``{"attempt": n, "turn_id", "status", "started_at",
  "ended_at", "turn_status", "reason", "submitted"}``; ``submitted`` is the
  value the model submitted (kept for inspection even when the commit
  refused it).
- ``workflows:agent:{agent_id}`` sorted set: task ids by creation time.

Every change is a ``WATCH``/``MULTI`` transaction on the task's hash, so the
turn-end hook (delivered at least once: ``acks_late``) records an attempt's
outcome exactly once.

Status rules:

- ``queued`` after start or retry; ``running`` once the attempt's turn has
  started (seen by ``show``/``list``, which look at the turn);
- ``succeeded`` only when the turn ended through an accepted ``submit_result``
  *and* the submitted value validates against the persisted schema, checked
  again here before the commit (the tool's own check ran in the worker, which
  is not trusted to decide the task's outcome);
- ``failed`` for every other ending, with the reason (turn status and error);
- ``cancelled`` by ``cancel``; a cancelled task never commits a result;
- ``retry`` (from ``failed`` or ``cancelled``) starts attempt ``n + 1`` as a
  new turn, at most ``MAX_ATTEMPTS`` attempts per task.
"""

from __future__ import annotations

import enum
import hashlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Final, TypeVar, cast

import orjson
import redis as redis_lib
from redis.typing import EncodableT, FieldT

from worker.records.result_schema import FINISH_TOOL, WorkflowError, check_result_schema, result_errors, strict_plan
from worker.turn.request import TurnStatus
from worker.turn.store import TurnStore

TOOLSET = "workflow_task"
QUEUE = "workflow"
MAX_ATTEMPTS = 5
MAX_TITLE_CHARS = 200
MAX_INSTRUCTIONS_CHARS = 20_000
STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
TERMINAL = frozenset({"succeeded", "failed", "cancelled"})

TASK_INSTRUCTIONS = (
    "You are running one isolated workflow task. Work only from the task below and the tools you have. "
    "When you have the answer, call `submit_result` with `result` set to a value matching its schema. "
    "The task can only end through `submit_result`: do not answer in prose. If a submission is rejected, "
    "read the failing fields and call `submit_result` again with a corrected value."
)
BRAIN_HINT = (
    "The agent's Brain (its knowledge pages) is available: use `recall` to find pages and `get_page` to read them."
)


class _NoChange(enum.Enum):
    NO_CHANGE = "no change"


NO_CHANGE: Final = _NoChange.NO_CHANGE
"""What an update of a task returns to write nothing."""
_T = TypeVar("_T")


# ----- the result schema ----------------------------------------------------------------------

# Keywords whose value is a subschema, a list of subschemas or a map of subschemas (every draft
# jsonschema validates). Only these are walked for ``$ref``: a ``"$ref"`` key inside ``const``,
# ``enum``, ``default``, ``examples`` or an unknown keyword is data, not a reference.


# ----- records -------------------------------------------------------------------------------


def task_key(task_id: str) -> str:
    """Redis key of a workflow task: ``workflow:<task_id>``."""
    return f"workflow:{task_id}"


def agent_index_key(agent_id: str) -> str:
    """Sorted set of the agent's workflow task ids by creation time."""
    return f"workflows:agent:{agent_id}"


@dataclass
class WorkflowTask:
    """A snapshot of ``workflow:{task_id}`` (fields: see the module docstring)."""

    task_id: str
    agent_id: str
    title: str
    instructions: str
    result_schema: dict[str, Any]
    status: str = "queued"
    use_brain: bool = False
    model: str | None = None
    strict: bool = True
    strict_note: str | None = None
    origin: str = "control-plane"
    approval: dict[str, Any] | None = None
    attempts: list[dict[str, Any]] = field(default_factory=list)
    has_result: bool = False
    result: Any = None
    error: str | None = None
    created_at: float = 0.0
    updated_at: float = 0.0

    @property
    def done(self) -> bool:
        """True once the task succeeded, failed or was cancelled."""
        return self.status in TERMINAL

    @property
    def current(self) -> dict[str, Any] | None:
        """The latest attempt, or None before the first."""
        return self.attempts[-1] if self.attempts else None

    def to_hash(self) -> dict[FieldT, EncodableT]:
        """Redis hash form (JSON-encoded fields)."""
        h: dict[FieldT, EncodableT] = {
            "task_id": self.task_id,
            "agent_id": self.agent_id,
            "title": self.title,
            "instructions": self.instructions,
            "result_schema": orjson.dumps(self.result_schema),
            "status": self.status,
            "use_brain": int(self.use_brain),
            "model": self.model or "",
            "strict": int(self.strict),
            "strict_note": self.strict_note or "",
            "origin": self.origin,
            "approval": orjson.dumps(self.approval),
            "attempts": orjson.dumps(self.attempts),
            "error": self.error or "",
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.has_result:
            h["result"] = orjson.dumps(self.result)
        return h

    @classmethod
    def from_hash(cls, h: dict[bytes, bytes]) -> "WorkflowTask":
        """Inverse of ``to_hash``."""

        def s(k: str, d: str = "") -> str:
            return h[k.encode()].decode() if k.encode() in h else d

        return cls(
            task_id=s("task_id"),
            agent_id=s("agent_id"),
            title=s("title"),
            instructions=s("instructions"),
            result_schema=orjson.loads(h.get(b"result_schema", b"{}")),
            status=s("status", "queued"),
            use_brain=s("use_brain", "0") == "1",
            model=s("model") or None,
            strict=s("strict", "1") == "1",
            strict_note=s("strict_note") or None,
            origin=s("origin", "control-plane"),
            approval=orjson.loads(h.get(b"approval", b"null")),
            attempts=orjson.loads(h.get(b"attempts", b"[]")),
            has_result=b"result" in h,
            result=orjson.loads(h[b"result"]) if b"result" in h else None,
            error=s("error") or None,
            created_at=float(s("created_at", "0")),
            updated_at=float(s("updated_at", "0")),
        )

    def view(self, *, with_schema: bool = False) -> dict[str, Any]:
        """JSON view for tools and clients: ``task_id``, ``title``, ``status``, ``attempts``,
        ``result`` (when succeeded), ``error`` (when failed/cancelled), ``use_brain``, ``strict``..."""
        out: dict[str, Any] = {
            "task_id": self.task_id,
            "title": self.title,
            "status": self.status,
            "attempts": [{k: v for k, v in a.items() if v is not None} for a in self.attempts],
            "use_brain": self.use_brain,
            "strict": self.strict,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }
        if self.has_result:
            out["result"] = self.result
        if self.error:
            out["error"] = self.error
        if self.strict_note:
            out["strict_note"] = self.strict_note
        if with_schema:
            out["instructions"] = self.instructions
            out["result_schema"] = self.result_schema
        return out


class WorkflowService:
    """Workflow operations over Redis.

    - ``redis``: a ``redis.Redis`` client (bytes responses);
    - ``enqueue_turn(request_dict, turn_id) -> turn_id``: starts a turn (the
      ``enqueue_turn`` turn service, ``tasks.services.enqueue_turn``); needed by
      ``start`` and ``retry`` only;
    - ``cancel_turn(turn_id)``: stops a running attempt's turn (default:
      ``TurnStore.request_cancel``, the turn's Redis cancel flag).
    """

    def __init__(
        self,
        redis: redis_lib.Redis,
        enqueue_turn: Callable[..., str] | None = None,
        cancel_turn: Callable[[str], object] | None = None,
    ):
        self.r = redis
        self.enqueue_turn = enqueue_turn
        self.cancel_turn = cancel_turn or (lambda turn_id: TurnStore(redis).request_cancel(turn_id, by="workflow"))

    # ----- storage ----------------------------------------------------------
    def load(self, task_id: str) -> WorkflowTask | None:
        """The task, or None if unknown."""
        h = _bytes_hash(self.r.hgetall(task_key(task_id)))
        return WorkflowTask.from_hash(h) if h else None

    def _update(self, task_id: str, fn: Callable[[WorkflowTask], _T]) -> tuple[WorkflowTask, _T]:
        """Apply ``fn`` to the task under ``WATCH``; ``fn`` mutates it and returns a value
        (``NO_CHANGE`` to write nothing). Raises ``WorkflowError`` for an unknown task."""
        key = task_key(task_id)
        with self.r.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves Pipeline.watch untyped
                    h = _bytes_hash(pipe.hgetall(key))
                    if not h:
                        raise WorkflowError(f"unknown workflow task {task_id!r}")
                    task = WorkflowTask.from_hash(h)
                    out = fn(task)
                    if out is NO_CHANGE:
                        pipe.reset()
                        return task, out
                    task.updated_at = time.time()
                    pipe.multi()
                    pipe.hset(key, mapping=task.to_hash())
                    if not task.has_result:
                        pipe.hdel(key, "result")
                    pipe.execute()
                    return task, out
                except redis_lib.WatchError:
                    continue

    # ----- operations -------------------------------------------------------
    def start(
        self,
        *,
        agent_id: str,
        title: str,
        instructions: str,
        result_schema: dict[str, Any],
        use_brain: bool = False,
        model: str | None = None,
        task_id: str | None = None,
        origin: str = "control-plane",
        max_model_calls: int | None = None,
        approval: dict[str, Any] | None = None,
    ) -> tuple[WorkflowTask, bool]:
        """Create a task and enqueue its first attempt. Returns ``(task, created)``.

        ``task_id`` makes the start idempotent (a second start with the same id
        returns the existing task, ``created=False``); by default a new
        ``wf_<hex>`` id. Raises ``WorkflowError`` for a bad title, instructions
        or schema (``check_result_schema``), or without an ``enqueue_turn``.
        ``approval``: the ``TurnRequest.approval`` of every attempt's turn (a turn that starts a
        task passes its own, ``worker.turn.approval_policy.inherited_approval``).
        """
        if self.enqueue_turn is None:
            raise WorkflowError("cannot start workflow tasks here: no enqueue_turn service")
        title = " ".join((title or "").split())
        if not title or len(title) > MAX_TITLE_CHARS:
            raise WorkflowError(f"title must have 1 to {MAX_TITLE_CHARS} characters")
        if not instructions or not instructions.strip() or len(instructions) > MAX_INSTRUCTIONS_CHARS:
            raise WorkflowError(f"instructions must have 1 to {MAX_INSTRUCTIONS_CHARS} characters")
        schema = check_result_schema(result_schema)
        strict, note = strict_plan(schema)
        tid = task_id or f"wf_{uuid.uuid4().hex[:20]}"
        now = time.time()
        task = WorkflowTask(
            task_id=tid,
            agent_id=agent_id,
            title=title,
            instructions=instructions,
            result_schema=schema,
            use_brain=use_brain,
            model=model,
            strict=strict,
            strict_note=note,
            origin=origin,
            approval=approval,
            created_at=now,
            updated_at=now,
        )
        key = task_key(tid)
        p = self.r.pipeline(transaction=True)
        p.hsetnx(key, "task_id", tid)
        created = bool(p.execute()[0])
        if not created:
            existing = self.load(tid)
            assert existing is not None
            return existing, False
        p = self.r.pipeline(transaction=True)
        p.hset(key, mapping=task.to_hash())
        p.zadd(agent_index_key(agent_id), {tid: now})
        p.execute()
        return self._launch(tid, max_model_calls=max_model_calls), True

    def _request(self, task: WorkflowTask, attempt: int, max_model_calls: int | None) -> dict[str, Any]:
        instructions = TASK_INSTRUCTIONS + ("\n\n" + BRAIN_HINT if task.use_brain else "")
        req: dict[str, Any] = {
            "agent_id": task.agent_id,
            "input": f"# Workflow task: {task.title}\n\n{task.instructions}",
            "instructions": instructions,
            "toolset": TOOLSET,
            "supports": {"brain": task.use_brain},
            "queue": QUEUE,
            "finish_tool": FINISH_TOOL,
            "idempotency_key": f"workflow:{task.task_id}:{attempt}",
            "metadata": {"workflow_task_id": task.task_id, "attempt": attempt, "result_schema": task.result_schema},
        }
        if task.approval:
            req["approval"] = task.approval
        if task.model:
            req["model"] = task.model
        if max_model_calls:
            req["max_model_calls"] = max_model_calls
        return req

    def _launch(
        self, task_id: str, *, allowed: tuple[str, ...] = ("queued",), max_model_calls: int | None = None
    ) -> WorkflowTask:
        """Append attempt ``n + 1`` (status ``queued``) and enqueue its turn (fresh input, new turn id)."""
        turn_id = uuid.uuid4().hex

        def add(t: WorkflowTask) -> dict[str, Any]:
            if t.status not in allowed:
                raise WorkflowError(f"workflow task {t.task_id} is {t.status}; expected {' or '.join(allowed)}")
            if t.current is not None and t.current["status"] in ("queued", "running"):
                raise WorkflowError(
                    f"workflow task {t.task_id} already has attempt {t.current['attempt']} {t.current['status']}"
                )
            if len(t.attempts) >= MAX_ATTEMPTS:
                raise WorkflowError(f"workflow task {t.task_id} already had {MAX_ATTEMPTS} attempts (the limit)")
            att = {
                "attempt": len(t.attempts) + 1,
                "turn_id": turn_id,
                "status": "queued",
                "started_at": time.time(),
                "ended_at": None,
                "turn_status": None,
                "reason": None,
            }
            t.attempts.append(att)
            t.status, t.error, t.has_result, t.result = "queued", None, False, None
            return att

        task, att = self._update(task_id, add)
        try:
            assert self.enqueue_turn is not None
            self.enqueue_turn(self._request(task, att["attempt"], max_model_calls), turn_id)
        except Exception as exc:
            reason = f"could not enqueue attempt {att['attempt']}: {exc.__class__.__name__}: {exc}"

            def failed(t: WorkflowTask) -> None:
                a = next(a for a in t.attempts if a["turn_id"] == turn_id)
                a.update(status="failed", reason=reason, ended_at=time.time())
                t.status, t.error = "failed", reason

            task, _ = self._update(task_id, failed)
        return task

    def show(self, task_id: str) -> WorkflowTask:
        """The task, with ``queued`` turned into ``running`` once its attempt's turn has started.

        Raises ``WorkflowError`` for an unknown task.
        """
        task = self.load(task_id)
        if task is None:
            raise WorkflowError(f"unknown workflow task {task_id!r}")
        return self._refresh(task)

    def _refresh(self, task: WorkflowTask) -> WorkflowTask:
        att = task.current
        if task.status != "queued" or att is None or att["status"] != "queued":
            return task
        turn_status = TurnStore(self.r).status(att["turn_id"])
        if turn_status in (None, TurnStatus.queued):
            return task

        def running(t: WorkflowTask) -> _NoChange | None:
            a = t.current
            if t.status != "queued" or a is None or a["turn_id"] != att["turn_id"] or a["status"] != "queued":
                return NO_CHANGE
            a["status"] = "running"
            t.status = "running"
            return None

        return self._update(task.task_id, running)[0]

    def list(self, agent_id: str, limit: int = 50) -> list[WorkflowTask]:
        """The agent's tasks, newest first (at most ``limit``)."""
        ids = self.r.zrevrange(agent_index_key(agent_id), 0, max(0, limit - 1))
        out = []
        for raw in ids:
            task = self.load(raw.decode() if isinstance(raw, bytes) else str(raw))
            if task is not None:
                out.append(self._refresh(task))
        return out

    def cancel(self, task_id: str, reason: str = "cancelled by request") -> WorkflowTask:
        """Cancel a queued or running task and stop its attempt's turn. Cancelling a cancelled task is a no-op.

        Raises ``WorkflowError`` for an unknown task or one that already succeeded or failed.
        """
        stop: list[str] = []

        def cancel(t: WorkflowTask) -> _NoChange | None:
            if t.status == "cancelled":
                return NO_CHANGE
            if t.status in ("succeeded", "failed"):
                raise WorkflowError(f"workflow task {t.task_id} already {t.status}; nothing to cancel")
            t.status, t.error = "cancelled", reason
            a = t.current
            if a is not None and a["status"] in ("queued", "running"):
                a.update(status="cancelled", reason=reason, ended_at=time.time())
                stop.append(a["turn_id"])
            return None

        task, _ = self._update(task_id, cancel)
        for turn_id in stop:
            self.cancel_turn(turn_id)
        return task

    def retry(self, task_id: str, max_model_calls: int | None = None) -> WorkflowTask:
        """Start a new attempt of a failed or cancelled task: a new turn with a fresh conversation,
        validated against the schema persisted now. Raises ``WorkflowError`` otherwise or past
        ``MAX_ATTEMPTS``."""
        if self.enqueue_turn is None:
            raise WorkflowError("cannot retry workflow tasks here: no enqueue_turn service")
        return self._launch(task_id, allowed=("failed", "cancelled"), max_model_calls=max_model_calls)

    # ----- the task turn's side -----------------------------------------------
    def record_submission(self, task_id: str, turn_id: str, value: Any) -> bool:
        """Keep an accepted ``submit_result`` value on its attempt (before the commit). False if no such attempt."""

        def rec(t: WorkflowTask) -> _NoChange | bool:
            a = next((a for a in t.attempts if a["turn_id"] == turn_id), None)
            if a is None:
                return NO_CHANGE
            a["submitted"] = value
            return True

        try:
            return self._update(task_id, rec)[1] is True
        except WorkflowError:
            return False

    def commit_turn(
        self,
        turn_id: str,
        turn_status: str,
        turn_error: str | None,
        metadata: dict[str, Any],
        submission: tuple[bool, Any],
    ) -> dict[str, Any]:
        """Record how an attempt's turn ended, and commit or fail the task.

        ``submission`` is ``(found, value)``: the value of the ``submit_result``
        call that terminated the turn. A ``terminated`` turn with a submission
        commits only if the value validates against the *persisted*
        ``result_schema`` (not the one in the turn's metadata); otherwise the
        task fails with the field errors and the value stays on the attempt
        (``submitted``). Any other ending fails the attempt with the turn's
        status and error. Idempotent: an attempt already recorded is left as is.
        Only the task's latest attempt changes the task's status; a cancelled
        task stays cancelled.

        Returns a report: ``{"action": "committed" | "failed" | "recorded" |
        "duplicate" | "unknown_task" | "unknown_attempt", "task_id", ...}``.
        """
        task_id = metadata.get("workflow_task_id")
        found, value = submission
        skipped: list[str] = []

        def commit(t: WorkflowTask) -> _NoChange | dict[str, Any]:
            a = next((a for a in t.attempts if a["turn_id"] == turn_id), None)
            if a is None or a.get("turn_status"):
                skipped.append("unknown_attempt" if a is None else "duplicate")
                return NO_CHANGE
            got, val = (found, value) if found else (("submitted" in a), a.get("submitted"))
            a["turn_status"] = turn_status
            a["ended_at"] = time.time()
            if got:
                a["submitted"] = val
            if turn_status == "terminated" and got:
                errors = result_errors(t.result_schema, val)
                if errors:
                    status = "failed"
                    reason = (
                        "the submitted result does not match the task's persisted result schema "
                        f"(it may have changed since the attempt started): {'; '.join(errors)}"
                    )
                else:
                    status, reason = "succeeded", None
            else:
                status = "failed"
                reason = (
                    f"attempt {a['attempt']} ended without an accepted submit_result "
                    f"(turn {turn_status}{': ' + turn_error if turn_error else ''})"
                )
            if a["status"] == "cancelled":
                a["reason"] = a.get("reason") or reason
                return {"action": "recorded", "attempt_status": "cancelled"}
            a["status"], a["reason"] = status, reason
            if t.status == "cancelled" or a is not t.current:
                return {"action": "recorded", "attempt_status": status}
            t.status, t.error = status, reason
            if status == "succeeded":
                t.has_result, t.result = True, val
                return {"action": "committed"}
            return {"action": "failed", "reason": reason}

        try:
            task, out = self._update(task_id, commit) if task_id else (None, {"action": "unknown_task"})
        except WorkflowError:
            return {"action": "unknown_task", "task_id": task_id}
        if out is NO_CHANGE:
            return {"action": skipped[-1] if skipped else "duplicate", "task_id": task_id}
        return {**out, "task_id": task_id, "status": task.status if task else None}


def _bytes_hash(h: object) -> dict[bytes, bytes]:
    """An ``HGETALL`` answer of the service's client, which answers bytes (``decode_responses`` off)."""
    return cast("dict[bytes, bytes]", h)


def start_task_id(turn_id: str, call_id: str) -> str:
    """Deterministic task id for a ``workflow_start`` call: a re-run of the same call starts nothing new
    (``call_id`` scoped by turn is the call's idempotency key, docs/architecture.md, "Claims and fencing")."""
    return "wf_" + hashlib.sha1(f"{turn_id}:{call_id}".encode()).hexdigest()[:20]


def find_submission(turn_store: TurnStore, turn_id: str, step: int) -> tuple[bool, Any]:
    """The accepted ``submit_result`` value of a turn that terminated at tool step ``step``.

    Reads the step's plan and results from the turn store; the first
    ``submit_result`` call (emitted order) whose result has ``terminate`` and
    ``details.submitted`` wins. Returns ``(False, None)`` when there is none.
    """
    plan = turn_store.plan(turn_id, step) if step >= 0 else None
    if plan is None:
        return False, None
    calls, _ = plan
    results = turn_store.results(turn_id, step)
    for call in sorted(calls, key=lambda c: c.index):
        res = results.get(call.call_id) if call.name == FINISH_TOOL else None
        if res is not None and res.terminate and "submitted" in res.details:
            return True, res.details["submitted"]
    return False, None
