"""The control-plane client: enqueue a turn, wait for it, read its items and events, cancel it,
and decide the tool calls that wait for a person's approval.

Usable from any Python process that can reach the Redis broker; it never
imports tool code. ``ControlPlane(redis_url)`` raises ``ControlPlaneError``
with a clear message when Redis is unreachable.

The public API for embedders is what ``__all__`` names (docs/control-plane.md, "The Python
client"): the client, what it returns, the request it takes and the errors it raises (all of them
``AgentRuntimeError``s). Tool authors import from ``worker.api``.
"""

from __future__ import annotations

import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

import kombu.exceptions
import redis

from control.errors import Conflict, ControlPlaneError, ControlPlaneUnavailable, NotFound, Refused
from tasks.dispatcher import CeleryDispatcher
from worker.errors import AgentRuntimeError
from worker.placement.records import Placement
from worker.redis_connection import RedisEndpoint, redis_endpoint
from worker.settings import get_settings
from worker.tools.toolsets import toolset_names
from worker.turn import approvals, telemetry
from worker.turn.durability import ReplicaAck
from worker.turn.engine import TurnEngine
from worker.turn.guard import CreateScript
from worker.turn.intake import NewTurn
from worker.turn.interfaces import step_label
from worker.turn.request import TurnRefused, TurnRequest, TurnStatus, request_problem
from worker.turn.store import TurnStore

if TYPE_CHECKING:
    from control.workflow import WorkflowClient

__all__ = [
    "AgentRuntimeError",
    "Conflict",
    "ControlPlane",
    "ControlPlaneError",
    "ControlPlaneUnavailable",
    "NotFound",
    "Refused",
    "TurnRequest",
    "TurnStatus",
    "TurnView",
]


# Toolsets whose turns the runtime starts itself (they need more than a turn request): refused
# from the CLI and the HTTP API, with the reason.
INTERNAL_TOOLSETS = {
    "workflow_task": "workflow task turns are started with ControlPlane().workflows().start_workflow_task"
}


@dataclass(frozen=True)
class CreateCall:
    """``ControlPlane.create_call``: the creation script's ``keys`` and ``args``
    (``worker.turn.guard.CREATE_LUA``) for the turn ``turn_id``. ``sends_message``: the first
    step's message rides in the script; when False (a publish that cannot be recorded), call
    ``send_step()`` (synchronous, one round trip; raises ``ControlPlaneUnavailable``) once the
    script created the turn."""

    turn_id: str
    keys: list[str]
    args: list[Any]
    sends_message: bool
    send_step: Callable[[], None]

    def result(self, reply: Any) -> tuple[str, bool]:
        """``(turn_id, created)`` from the script's reply, as ``ControlPlane.create`` returns it.
        Raises ``Refused`` when the turn id is another agent's."""
        try:
            return CreateScript.outcome(self.turn_id, reply)
        except TurnRefused as exc:
            raise Refused(str(exc)) from None


@dataclass
class TurnView:
    """What the control plane sees of a turn."""

    turn_id: str
    status: TurnStatus
    step: int
    model_calls: int
    final_output: str | None
    error: str | None
    agent_id: str = ""
    created_at: float = 0.0  # epoch seconds
    updated_at: float = 0.0
    title: str = ""  # the start of the user's message (listings)

    @property
    def done(self) -> bool:
        """True once the turn reached a terminal status."""
        return self.status.terminal


def _approval_error(message: str) -> ControlPlaneError:
    """The control-plane error kind of an ``approvals.ApprovalError`` (its messages say which case)."""
    if message.startswith("unknown turn") or "is not waiting for approval" in message:
        return NotFound(message)
    if "nothing waits for a decision" in message:
        return Conflict(message)
    return Refused(message)


@contextmanager
def _redis_errors(url: str) -> Iterator[None]:
    try:
        yield
    except (redis.RedisError, kombu.exceptions.OperationalError) as exc:
        raise ControlPlaneUnavailable(f"Redis at {url} failed: {exc.__class__.__name__}: {exc}") from exc


class ControlPlane:
    """Client for turns on the Redis at ``redis_url`` (default: ``CONTROL_REDIS_URL``, the control
    plane's own ACL user, else ``REDIS_URL``), used both as the turn store and as the Celery
    broker the workers consume. The URL carries credentials: error messages show it redacted.

    Every method raises ``ControlPlaneError`` when Redis is unreachable or fails.
    """

    def __init__(self, redis_url: str | RedisEndpoint | None = None):
        settings = get_settings()
        if isinstance(redis_url, RedisEndpoint):
            self.endpoint = redis_url
        else:
            try:  # through the settings' Sentinels and TLS files (worker.redis_connection)
                self.endpoint = redis_endpoint(settings, control=True, url=redis_url)
            except ValueError as exc:  # a malformed URL (scheme, port): one line, naming its variable
                raise ControlPlaneError(str(exc)) from exc
        self.url = self.endpoint.display
        client = self.endpoint.client(socket_connect_timeout=5, socket_timeout=30)
        # The control plane's Redis connection: the turn store holds it privately (every turn key is
        # the store's); ``redis`` is for the other records (placement, jobs, workflows, schedules).
        self.redis: redis.Redis = client
        durability = ReplicaAck(settings.replica_acks, settings.redis_replica_ack_timeout)
        self.store = TurnStore(client, progress_timeout=settings.progress_timeout, durability=durability)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ControlPlaneUnavailable(f"cannot reach Redis at {self.url}: {exc}") from exc
        self._toolsets = toolset_names(settings)
        # Enqueueing and ending turns only: this engine never calls a model nor imports tool code.
        self.placement = Placement(client, settings.liveness_ttl)
        self._dispatcher = CeleryDispatcher(broker=self.endpoint, placement=self.placement)
        self._engine = TurnEngine(self.store, settings, self._dispatcher, redis=client, count_ends=False)

    @property
    def display_url(self) -> str:
        """Where the Redis is, without its password (for messages and logs)."""
        return self.url

    def enqueue(self, request: TurnRequest | dict[str, Any], turn_id: str | None = None) -> str:
        """Validate the request, store the turn and enqueue its first step. Returns the turn id
        (``create`` also says whether the turn is new).

        Idempotent: when the agent already used the request's idempotency key (keys are scoped
        per agent), or ``turn_id`` already names a turn *of the same agent*, returns that turn's
        id and enqueues nothing (the new request is ignored).

        Raises ``pydantic.ValidationError`` for a bad request (e.g. an ``agent_id`` not matching
        ``^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$``), and ``ControlPlaneError`` for a toolset not
        configured here, a ``turn_id`` not matching that pattern or belonging to another agent,
        a request over ``AGENT_MAX_INPUT_BYTES`` as JSON, an empty message, or
        ``egress_allow_hosts`` without egress (``request_problem``). Nothing is stored when it raises.
        """
        return self.create(request, turn_id)[0]

    def create(self, request: TurnRequest | dict[str, Any], turn_id: str | None = None) -> tuple[str, bool]:
        """``enqueue``, returning ``(turn_id, created)``: ``created`` is False when an idempotency
        key or turn id of the same agent named an existing turn (nothing was enqueued). Raises
        like ``enqueue``."""
        req = self._checked(request)
        try:
            with _redis_errors(self.url):
                return self._engine.create_turn(req, turn_id or uuid.uuid4().hex)
        except TurnRefused as exc:
            raise Refused(str(exc)) from None

    def _checked(self, request: TurnRequest | dict[str, Any]) -> TurnRequest:
        req = request if isinstance(request, TurnRequest) else TurnRequest.model_validate(request)
        problem = request_problem(req)
        if problem is not None:
            raise Refused(f"{problem[0]}: {problem[1]}")
        if req.toolset not in self._toolsets:
            raise Refused(
                f"unknown toolset {req.toolset!r}; configured: {', '.join(self._toolsets)} "
                "(extra toolsets come from AGENT_EXTRA_TOOLSETS, as on the workers)"
            )
        return req

    def create_call(self, request: TurnRequest, turn_id: str | None = None) -> CreateCall:
        """``create`` for a caller with a Redis client of its own (the HTTP API's asyncio one): the
        same checks, and the creation script's call with the first step's queue message inside
        (sent by the script only if it creates the turn, atomically with it). Nothing is sent here
        (but the broker channel's first opening, one round trip, on the first call). Run
        ``CreateCall.keys``/``args`` with ``worker.turn.guard.CREATE_LUA``, then
        ``CreateCall.result``. Raises like ``enqueue``."""
        req = self._checked(request)
        tid = turn_id or uuid.uuid4().hex
        try:
            new = self._engine.intake.prepare(req, tid)
            with telemetry.under_turn(new.traceparent), _redis_errors(self.url):
                label = step_label(req.agent_id, tid, 0)
                message = self._dispatcher.own_step_message(tid, 0, queue=req.queue, label=label)
        except TurnRefused as exc:
            raise Refused(str(exc)) from None
        keys, args = self.store.create_call(
            tid, new.request, new.items, req.idempotency_key, new.fields, message=message or ()
        )
        return CreateCall(tid, keys, args, message is not None, lambda: self._send_first_step(req, tid, new))

    def open_broker(self) -> None:
        """Open the broker channel ``create_call`` records messages with (one round trip; a
        server calls it at start, in a thread, so that no request waits for it). Raises
        ``ControlPlaneUnavailable`` when Redis does not answer."""
        with _redis_errors(self.url):
            self._dispatcher.own_step_message("0" * 32, 0, queue="turns")

    def _send_first_step(self, req: TurnRequest, turn_id: str, new: NewTurn) -> None:
        with telemetry.under_turn(new.traceparent), _redis_errors(self.url):
            self._dispatcher.enqueue_step(turn_id, 0, queue=req.queue, label=step_label(req.agent_id, turn_id, 0))

    def status(self, turn_id: str) -> TurnView:
        """The turn's current view. Raises ``ControlPlaneError`` for an unknown turn."""
        with _redis_errors(self.url):
            state = self.store.load(turn_id)
        if state is None:
            raise NotFound(f"unknown turn {turn_id}")
        return TurnView(
            turn_id,
            state.status,
            state.step,
            state.model_calls,
            state.final_output,
            state.error,
            state.agent_id,
            state.created_at,
            state.updated_at,
        )

    def list_turns(
        self,
        *,
        agents: Sequence[str] | None = None,
        statuses: Sequence[TurnStatus | str] | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        cursor: str | None = None,
        limit: int = 20,
    ) -> tuple[list[TurnView], str | None]:
        """Turns newest first, a page at a time: of ``agents`` (None: every agent's), in
        ``statuses`` (None: any), created after ``created_after`` / before ``created_before``
        (epoch seconds, exclusive), continuing after ``cursor`` (the previous page's). Returns
        ``(turns, next_cursor)``; ``next_cursor`` is None when nothing is left. A page may hold
        fewer than ``limit`` (1-200) turns and still have a cursor: a status filter examines a
        bounded part of the index per page (``worker.turn.listing``).

        Raises ``Refused`` for a bad cursor, status or limit; ``ControlPlaneError`` when Redis fails."""
        if not 1 <= limit <= 200:
            raise Refused(f"limit must be 1-200, not {limit}")
        known = {s.value for s in TurnStatus}
        unknown = [s for s in statuses or () if str(getattr(s, "value", s)) not in known]
        if unknown:
            raise Refused(f"unknown status {unknown[0]!r} (one of {', '.join(sorted(known))})")
        try:
            wanted = None if statuses is None else frozenset(TurnStatus(s) for s in statuses)
            with _redis_errors(self.url):
                page = self.store.listing.page(
                    agents=agents,
                    statuses=wanted,
                    created_after=created_after,
                    created_before=created_before,
                    cursor=cursor,
                    limit=limit,
                )
        except ValueError as exc:
            raise Refused(str(exc)) from None
        views = [
            TurnView(
                t.turn_id,
                t.status,
                t.step,
                t.model_calls,
                t.final_output,
                t.error,
                t.agent_id,
                t.created_at,
                t.updated_at,
                t.title,
            )
            for t in page.turns
        ]
        return views, page.next_cursor

    def stored_request(self, turn_id: str) -> dict[str, Any] | None:
        """The request a turn was enqueued with, as stored (its JSON), or None for an unknown turn."""
        with _redis_errors(self.url):
            state = self.store.load(turn_id)
        return None if state is None else state.request

    def wait(self, turn_id: str, timeout: float = 60.0) -> TurnView:
        """Block until the turn ends (tails its event stream). Raises ``ControlPlaneError`` on timeout."""
        deadline = time.monotonic() + timeout
        last = "0-0"
        while True:
            view = self.status(turn_id)
            if view.done:
                return view
            left = deadline - time.monotonic()
            if left <= 0:
                raise ControlPlaneError(f"turn {turn_id} still {view.status.value} after {timeout:.0f}s")
            with _redis_errors(self.url):
                for eid, _ in self.store.events(turn_id, after=last, block_ms=int(min(left, 1.0) * 1000)):
                    last = eid

    def items(self, turn_id: str) -> list[dict[str, Any]]:
        """The turn's Responses input items so far (user input, model output, function_call_output)."""
        with _redis_errors(self.url):
            return self.store.items(turn_id)

    def usage(self, turn_id: str) -> dict[str, Any]:
        """The turn's token usage, from the Responses ``usage`` of each model call
        (``worker.turn.usage``): ``{"total": {input_tokens, output_tokens, total_tokens,
        cached_tokens, reasoning_tokens, model_calls}, "steps": [{"step", "model", ...counts}],
        "budget": the request's token_budget or None}``.

        Raises ``ControlPlaneError`` for an unknown turn.
        """
        with _redis_errors(self.url):
            state = self.store.load(turn_id)
            if state is None:
                raise NotFound(f"unknown turn {turn_id}")
            ledger = self._engine.usage
            return {
                "total": ledger.totals(turn_id),
                "steps": ledger.steps(turn_id),
                "budget": state.request.get("token_budget"),
            }

    def events(self, turn_id: str, after: str = "0-0") -> list[dict[str, Any]]:
        """Activity events (``kind``, ``at`` and fields) in order."""
        with _redis_errors(self.url):
            return [e for _, e in self.store.events(turn_id, after=after)]

    def workflows(self) -> WorkflowClient:
        """Workflow tasks and Brain pages (``control.workflow.WorkflowClient``)."""
        from control.workflow import WorkflowClient

        return WorkflowClient(self)

    def cancel(self, turn_id: str) -> bool:
        """Ask the turn to stop: running tools see the abort signal, the next step boundary ends it
        (a still-queued turn ends at once). Returns False if the turn had already ended.

        Raises ``ControlPlaneError`` for an unknown turn.
        """
        self.status(turn_id)
        with _redis_errors(self.url):
            return self._engine.cancel(turn_id)

    # ----- placement (docs/placement.md) -------------------------------------
    def nodes(self) -> dict[str, dict[str, Any]]:
        """Every node that holds homes: ``{node: {"live", "draining", "agents", "age" (s since its
        heartbeat), "root", "store", "drained_at"?}}``."""
        with _redis_errors(self.url):
            return self.placement.nodes()

    def drain(self, node: str, on: bool = True) -> dict[str, Any]:
        """Mark ``node`` draining (``on``; it takes no new agent, and releases each of its agents,
        snapshotted first when it has a snapshot store) or no longer draining. Returns the node's
        entry of ``nodes()``. Raises ``ControlPlaneError`` for a node that never beat."""
        known = self.nodes()
        if node not in known:
            raise ControlPlaneError(f"no node named {node!r} (known: {', '.join(sorted(known)) or 'none'})")
        with _redis_errors(self.url):
            self.placement.drain(node, on)
        return self.nodes()[node]

    def placement_of(self, agent_id: str) -> dict[str, str]:
        """The placement record of ``agent_id`` (``node``, ``epoch``, ``reason``, ``prev``, ``at``;
        empty when the agent never ran a computer call)."""
        with _redis_errors(self.url):
            return self.placement.record(agent_id)

    # ----- approvals (worker.turn.approvals) ---------------------------------
    def pending_approvals(self, turn_id: str | None = None, agent_id: str | None = None) -> list[dict[str, Any]]:
        """Calls waiting for a decision: of one turn, of one agent's turns, or all, oldest first.

        Each is a dict: ``turn_id``, ``agent_id``, ``step``, ``call_id``, ``name``, ``activity``
        (e.g. "Running rm -rf build/"), ``arguments``, ``requested_at`` and ``deadline`` (epoch s),
        ``status`` (``pending``).
        """
        with _redis_errors(self.url):
            return [rec.public() for rec in self.store.approvals.pending(turn_id=turn_id, agent_id=agent_id)]

    def approve(self, turn_id: str, call_id: str, *, by: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """Approve a waiting call, optionally with edited ``params`` (checked against the tool's
        JSON Schema, keys the tool does not declare refused: ``approvals.check_params``; invalid ->
        ``ControlPlaneError`` naming the fields, nothing changes and the call stays pending).

        ``by`` names the person deciding (recorded with the time); empty -> ``ControlPlaneError``.

        Idempotent (the same approval again returns the record with ``changed: False``). The
        decision that completes the step's gate resumes the turn. Returns the record plus ``changed``.
        Raises ``ControlPlaneError`` (unknown turn or call, turn ended, decided otherwise before).
        """
        return self._decide(turn_id, call_id, "approved", by=by, params=params)

    def reject(self, turn_id: str, call_id: str, reason: str, *, by: str) -> dict[str, Any]:
        """Reject a waiting call: it does not run and its ``function_call_output`` gives ``reason``
        to the model. Idempotent like ``approve``; raises ``ControlPlaneError``."""
        if not reason or not reason.strip():
            raise Refused("a rejection needs a reason (the model reads it)")
        return self._decide(turn_id, call_id, "rejected", by=by, reason=reason)

    def _decide(
        self,
        turn_id: str,
        call_id: str,
        decision: approvals.Decision,
        *,
        by: str,
        reason: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(by, str) or not by.strip():
            raise ControlPlaneError("a decision needs `by`: who decides (recorded with the time)")
        try:
            with _redis_errors(self.url):
                rec, changed = self._engine.approvals.decide(
                    turn_id, call_id, decision, by=by, reason=reason, params=params
                )
        except approvals.ApprovalConflict as exc:
            raise Conflict(str(exc)) from exc
        except approvals.ApprovalError as exc:
            raise _approval_error(str(exc)) from exc
        return {**rec.public(), "changed": changed}
