"""The ``/v1`` routes: turns (enqueue, status, items, usage, cancel, events) and approvals (list,
approve, reject, change feed). Each route is a thin front of ``control.client.ControlPlane``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from control.api.auth import Caller, caller, presented_token, refusal, turn_caller, verify
from control.api.errors import ApiError
from control.api.feed import approvals_feed
from control.api.hub import parse_event_id
from control.api.json_request import JsonRoute
from control.api.json_response import JsonResponse
from control.api.sse import send_turn_events
from control.api.streams import CappedStream
from control.api.tokens import Token
from control.client import INTERNAL_TOOLSETS, ControlPlane, CreateCall
from control.errors import ControlPlaneError
from worker.settings import get_settings
from worker.turn.approval_policy import below_floor
from worker.turn.events import EVENT_KINDS
from worker.turn.listing import decode_cursor
from worker.turn.request import (
    END_HOOK_METADATA,
    IDEMPOTENCY_KEY_MAX,
    TurnRequest,
    TurnStatus,
    is_valid_id,
    request_problem,
)

router = APIRouter(prefix="/v1", route_class=JsonRoute)  # its bodies read strictly (json_request)

ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "No token, or an unknown or revoked one"},
    404: {"description": "Unknown turn (or a turn of an agent the token does not cover)"},
    429: {"description": "Over the token's rate limit (Retry-After)"},
    503: {"description": "Redis is not answering; nothing was changed (Retry-After)"},
}
SSE: dict[int | str, dict[str, Any]] = {
    200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"}
}


class TurnCreated(BaseModel):
    turn_id: str
    agent_id: str
    status: str
    created: bool = Field(description="False when the idempotency key named an existing turn (nothing enqueued)")
    events_url: str


class TurnOut(BaseModel):
    turn_id: str
    agent_id: str
    status: str
    done: bool
    step: int
    model_calls: int
    final_output: str | None
    error: str | None
    created_at: float = Field(description="epoch seconds")
    updated_at: float


class TurnListed(TurnOut):
    title: str = Field(description="The start of the user's message (up to 200 characters)")


class TurnList(BaseModel):
    object: str = "list"
    data: list[TurnListed] = Field(description="Newest first")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: nothing is left")


class ItemList(BaseModel):
    object: str = "list"
    data: list[dict[str, Any]] = Field(description="Responses input items, in order")


class CancelOut(BaseModel):
    turn_id: str
    cancelling: bool = Field(description="False when the turn had already ended")


class Approval(BaseModel):
    turn_id: str
    agent_id: str
    step: int
    call_id: str
    name: str
    activity: str
    arguments: dict[str, Any]
    requested_at: float
    deadline: float
    status: str
    by: str | None = None
    decided_at: float | None = None
    reason: str | None = None
    params: dict[str, Any] | None = None
    changed: bool | None = Field(None, description="On a decision: False when it repeated an earlier one")


class ApprovalList(BaseModel):
    object: str = "list"
    data: list[Approval]


By = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=100)]
"""Who decides: omitted, the token's name alone is recorded; given, it must say someone (not empty)."""


class ApproveIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    params: dict[str, Any] | None = Field(None, description="Edited arguments, checked against the tool's schema")
    by: By | None = Field(None, description="Who decides (recorded beside the token's name); not empty")


class RejectIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field(min_length=1, max_length=4000, description="Why; the model reads it as the call's output")
    by: By | None = Field(None, description="Who decides (recorded beside the token's name); not empty")


def _control(request: Request) -> ControlPlane:
    control: ControlPlane = request.app.state.control
    return control


def _who(c: Caller, by: str | None) -> str:
    return f"{by} (token {c.token.name})" if by else f"token {c.token.name}"


@router.post("/turns", status_code=201, response_model=TurnCreated, responses={**ERRORS, 200: {"model": TurnCreated}})
async def enqueue_turn(
    body: TurnRequest,
    request: Request,
    token: str = Depends(presented_token),
    idempotency_key: str | None = Header(
        None, max_length=IDEMPOTENCY_KEY_MAX, description="Enqueue at most once per key and agent"
    ),
) -> Any:
    """Enqueue a turn (the body is a turn request; its JSON Schema is in this document). With an
    ``Idempotency-Key`` header (or the body's ``idempotency_key``), a repeat answers 200 with the
    same turn and enqueues nothing."""
    state = request.app.state
    if len(request.headers.getlist("idempotency-key")) > 1:  # the framework would take the first
        await verify(request, token)  # the token's refusals first, and its rate charged once
        raise ApiError(400, "Idempotency-Key is given more than once", param="Idempotency-Key")
    address = request.client.host if request.client else "unknown"
    answered = await enqueue_known(state, token, body, idempotency_key, address)
    if answered is not None:
        return answered
    return await _create(state, body, idempotency_key, (await verify(request, token)).token)


async def _create(state: Any, body: TurnRequest, idempotency_key: str | None, token: Token) -> JsonResponse:
    """The checked way's creation, for a request whose ``token`` passed its checks: the request
    checked against the token's record, the turn created (its own script), answered as
    ``_enqueued`` answers. Raises ``ApiError``, ``ControlPlaneError``, ``redis.RedisError``."""
    req, key_param = _prepared(body, idempotency_key, token)
    call = state.control.create_call(req)
    reply = await state.create_turn(keys=call.keys, args=call.args)
    return await _enqueued(state.control, call, reply, req, key_param)


async def enqueue_known(
    state: Any, token: str, body: TurnRequest, idempotency_key: str | None, address: str
) -> JsonResponse | None:
    """``enqueue_turn`` for a token this process authenticated before (``TokenStore.known``): the
    request checked against its remembered record, and the token's checks in Redis (revoked? its
    rate) run in the turn's creation script, one round trip (``tokens.AuthenticatedScript``).
    ``state``: the app's state; ``address``: the client's. Returns the answer, or None when the
    request must take the checked way (``verify`` first, then the creation; nothing was created):
    a token not seen here, a request its record refuses (the checked way answers the token's
    errors before the request's). A record that changed in Redis is answered here, checked
    against the record as the script found it (that script already counted the request against
    the token's rate). Raises the route's errors
    (``ApiError`` for the token's refusals, ``ControlPlaneError``, ``redis.RedisError``)."""
    known = state.tokens.known(token)
    if known is None:
        return None
    control: ControlPlane = state.control
    settings = state.settings
    try:
        req, key_param = _prepared(body, idempotency_key, known.token)
        call = control.create_call(req)
    except (ApiError, ControlPlaneError):
        return None
    found, reply = await state.enqueue.run(
        token,
        known,
        call.keys,
        call.args,
        rate=settings.rate,
        burst=settings.burst,
        address=address,
        failures=settings.auth_failures,
        window=settings.auth_failure_window,
    )
    if found is not None:
        refused = refusal(found)
        if refused is not None:
            if found.token is None:  # revoked (or the address throttled): not remembered
                state.tokens.forget(token)
            raise refused
        # The record changed in Redis: nothing ran. The script passed the token and counted this
        # request against its rate: the request is checked against the record as it is now, not
        # authenticated (and charged) a second time.
        state.tokens.forget(token)
        return await _create(state, body, idempotency_key, found.token)
    return await _enqueued(control, call, reply, req, key_param)


async def _enqueued(
    control: ControlPlane, call: CreateCall, reply: object, req: TurnRequest, key_param: str
) -> JsonResponse:
    """The answer to an enqueue whose creation script answered ``reply``: 201 with the new turn, or
    200 with the existing one an idempotency key named. Raises ``ApiError`` 422 for a key used for
    another request, ``ControlPlaneError`` (``Refused``: the turn id is another agent's)."""
    turn_id, created = call.result(reply)
    if created and not call.sends_message:
        await run_in_threadpool(call.send_step)
    status = "queued"
    if not created:
        status = await run_in_threadpool(_repeated, control, turn_id, req, key_param)
    # Encoded here, not by FastAPI's response model (validated again, then encoded): the same JSON.
    return JsonResponse(
        {
            "turn_id": turn_id,
            "agent_id": req.agent_id,
            "status": status,
            "created": created,
            "events_url": f"/v1/turns/{turn_id}/events",
        },
        status_code=201 if created else 200,
    )


def _prepared(body: TurnRequest, idempotency_key: str | None, token: Token) -> tuple[TurnRequest, str]:
    """The request to store for ``token``'s enqueue: the header's idempotency key in it, and who
    enqueued it (``metadata.enqueued_by``: a client's own value is replaced), with the name of the
    parameter that gave the key. Raises ``ApiError``: 403 for an agent the token does not cover,
    then 400 for an empty header or a header and body that name different keys, then
    ``_check_request``'s."""
    if not token.covers(body.agent_id):
        raise ApiError(403, f"token {token.id} does not cover agent {body.agent_id}", param="agent_id")
    key_param = "idempotency_key"
    if idempotency_key == "":
        raise ApiError(
            400, "the Idempotency-Key header is empty: give one of 1-200 characters, or none", param="Idempotency-Key"
        )
    if idempotency_key is not None:
        if body.idempotency_key not in (None, idempotency_key):
            raise ApiError(400, "Idempotency-Key and the body's idempotency_key differ", param="idempotency_key")
        body, key_param = body.model_copy(update={"idempotency_key": idempotency_key}), "Idempotency-Key"
    _check_request(body, token)
    return body.model_copy(update={"metadata": {**body.metadata, "enqueued_by": f"token {token.name}"}}), key_param


def _repeated(control: ControlPlane, turn_id: str, body: TurnRequest, key_param: str) -> str:
    """The status of the existing turn an enqueue named again; raises ``ApiError`` 422 when its
    idempotency key was used for another request."""
    if body.idempotency_key is not None and control.stored_request(turn_id) != body.model_dump(mode="json"):
        raise ApiError(
            422,
            f"idempotency key {body.idempotency_key!r} was used for another request (turn {turn_id}); "
            "a new request needs a new key",
            param=key_param,
        )
    return control.status(turn_id).status.value


def _check_request(body: TurnRequest, token: Token) -> None:
    """What the API refuses in a request its schema accepts: runtime metadata, internal toolsets,
    an empty message, egress hosts without egress, and less approval than the server's
    ``AGENT_APPROVAL_MODE`` (a floor, unless the token was granted ``lower_approval``)."""
    reserved = sorted(set(body.metadata) & set(END_HOOK_METADATA))
    if reserved:
        raise ApiError(400, f"metadata.{reserved[0]} is set by the runtime only", param=f"metadata.{reserved[0]}")
    if body.toolset in INTERNAL_TOOLSETS:
        raise ApiError(400, f"toolset {body.toolset!r}: {INTERNAL_TOOLSETS[body.toolset]}", param="toolset")
    problem = request_problem(body)
    if problem is not None:
        raise ApiError(400, problem[1], param=problem[0])
    floor = get_settings().approval_mode
    if below_floor(body.approval.mode, floor) and not token.lower_approval:
        raise ApiError(
            403,
            f"approval mode {body.approval.mode!r} asks for less approval than this server's AGENT_APPROVAL_MODE "
            f"{floor!r}: a request may ask for more, never less (unless its token was created with "
            "--may-lower-approval)",
            param="approval.mode",
        )


@router.get("/turns", response_model=TurnList, responses=ERRORS)
def list_turns(
    request: Request,
    c: Caller = Depends(caller),
    agent_id: str | None = Query(None, max_length=64, description="Only this agent's turns"),
    status: list[str] | None = Query(None, description="Only turns in these statuses (repeat, or comma-separated)"),
    created_after: float | None = Query(None, description="Only turns created after this time (epoch seconds)"),
    created_before: float | None = Query(None, description="Only turns created before this time (epoch seconds)"),
    cursor: str | None = Query(None, max_length=200, description="The previous page's `next_cursor`"),
    limit: int = Query(20, ge=1, le=200, description="Turns per page"),
) -> TurnList:
    """The turns of the agents the token covers, newest first, a page at a time. A status filter
    examines a bounded part of the index per page: a page may be short, or empty, and still have a
    ``next_cursor``; the listing ends when ``next_cursor`` is null."""
    statuses = [s for v in status or () for s in v.split(",") if s] or None
    for name, value in (("created_after", created_after), ("created_before", created_before)):
        if value is not None and not math.isfinite(value):
            raise ApiError(400, f"{name} must be a finite number of epoch seconds", param=name)
    if agent_id is not None and not is_valid_id(agent_id):
        raise ApiError(400, f"agent_id {agent_id[:64]!r} is not an agent id", param="agent_id")
    if agent_id is not None:
        agents: list[str] | None = [agent_id] if c.token.covers(agent_id) else []
    else:
        agents = None if c.token.agents is None else sorted(c.token.agents)
    if cursor:
        try:
            decode_cursor(cursor)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="cursor") from None
    known = {s.value for s in TurnStatus}
    for s in statuses or ():
        if s not in known:
            raise ApiError(400, f"unknown status {s[:40]!r} (one of {', '.join(sorted(known))})", param="status")
    turns, next_cursor = _control(request).list_turns(
        agents=agents,
        statuses=statuses,
        created_after=created_after,
        created_before=created_before,
        cursor=cursor,
        limit=limit,
    )
    data = [
        TurnListed(
            turn_id=v.turn_id,
            agent_id=v.agent_id,
            status=v.status.value,
            done=v.done,
            step=v.step,
            model_calls=v.model_calls,
            final_output=v.final_output,
            error=v.error,
            created_at=v.created_at,
            updated_at=v.updated_at,
            title=v.title,
        )
        for v in turns
    ]
    return TurnList(data=data, next_cursor=next_cursor)


@router.get("/turns/{turn_id}", response_model=TurnOut, responses=ERRORS)
def get_turn(turn_id: str, request: Request, c: Caller = Depends(turn_caller)) -> TurnOut:
    """The turn's status and, once it ended, its final output or error."""
    v = _control(request).status(turn_id)
    return TurnOut(
        turn_id=v.turn_id,
        agent_id=v.agent_id,
        status=v.status.value,
        done=v.done,
        step=v.step,
        model_calls=v.model_calls,
        final_output=v.final_output,
        error=v.error,
        created_at=v.created_at,
        updated_at=v.updated_at,
    )


@router.get("/turns/{turn_id}/items", response_model=ItemList, responses=ERRORS)
def get_items(turn_id: str, request: Request, c: Caller = Depends(turn_caller)) -> ItemList:
    """The turn's Responses input items so far (input, model output, function_call_output)."""
    return ItemList(data=_control(request).items(turn_id))


@router.get("/turns/{turn_id}/usage", responses=ERRORS)
def get_usage(turn_id: str, request: Request, c: Caller = Depends(turn_caller)) -> dict[str, Any]:
    """Token usage: ``total``, each model call's (``steps``) and the turn's ``budget``."""
    return _control(request).usage(turn_id)


@router.post("/turns/{turn_id}/cancel", response_model=CancelOut, responses=ERRORS)
def cancel_turn(turn_id: str, request: Request, c: Caller = Depends(turn_caller)) -> CancelOut:
    """Ask the turn to stop (running tools see the abort signal; the next step boundary ends it)."""
    return CancelOut(turn_id=turn_id, cancelling=_control(request).cancel(turn_id))


@router.get("/turns/{turn_id}/events", response_class=StreamingResponse, responses={**ERRORS, **SSE})
async def stream_events(
    turn_id: str,
    request: Request,
    c: Caller = Depends(turn_caller),
    last_event_id: str | None = Header(None, description="Resume after this event id"),
    after: str | None = Query(None, description="Resume after this event id (for clients that cannot set headers)"),
    kinds: str | None = Query(None, description="Comma-separated event kinds to send (default: all)"),
) -> StreamingResponse:
    """The turn's events as server-sent events, from the start or after ``Last-Event-ID``; the
    stream ends after ``turn_finished``."""
    given, param = (last_event_id, "Last-Event-ID") if last_event_id is not None else (after, "after")
    position = parse_event_id(given) if given is not None else "0-0"
    if position is None:
        shown = (given or "")[:50]
        raise ApiError(400, f"bad event id {shown!r}: expected <ms>-<seq>, two numbers below 2**64", param=param)
    want = frozenset(k for k in (kinds or "").split(",") if k) or None
    unknown = sorted((want or set()) - EVENT_KINDS)
    if unknown:
        raise ApiError(
            400, f"unknown event kind {unknown[0][:40]!r} (one of {', '.join(sorted(EVENT_KINDS))})", param="kinds"
        )
    state = request.app.state
    writer = partial(send_turn_events, hub=state.hub, r=state.aredis, turn_id=turn_id, after=position, kinds=want)
    state.stream_caps.admit(c.token.id)  # last: nothing may raise between admitting and the response
    return CappedStream(None, state.stream_caps, c.token.id, writer=writer)


@router.get("/approvals", response_model=ApprovalList, responses=ERRORS)
def list_approvals(
    request: Request,
    c: Caller = Depends(caller),
    agent_id: str | None = Query(None, description="Only this agent's turns"),
    turn_id: str | None = Query(None, description="Only this turn's calls"),
) -> ApprovalList:
    """Calls waiting for a decision, oldest first, of the agents the token covers."""
    if agent_id is not None and not c.token.covers(agent_id):
        return ApprovalList(data=[])
    pending = _control(request).pending_approvals(turn_id=turn_id, agent_id=agent_id)
    return ApprovalList(data=[Approval(**p) for p in pending if c.token.covers(p["agent_id"])])


@router.get("/approvals/events", response_class=StreamingResponse, responses={**ERRORS, **SSE})
async def approvals_events(request: Request, c: Caller = Depends(caller)) -> StreamingResponse:
    """A change feed (server-sent events) of the approvals the token covers: ``changed`` with the
    ``turn_id`` whenever a call starts waiting, is decided, or its turn ends; then list again."""
    state = request.app.state
    body = approvals_feed(state.hub, state.aredis, c.token, heartbeat=state.settings.heartbeat)
    state.stream_caps.admit(c.token.id)
    return CappedStream(body, state.stream_caps, c.token.id)


@router.post("/turns/{turn_id}/approvals/{call_id}/approve", response_model=Approval, responses={**ERRORS, 409: {}})
def approve(
    turn_id: str, call_id: str, body: ApproveIn, request: Request, c: Caller = Depends(turn_caller)
) -> Approval:
    """Approve a waiting call, optionally with edited ``params``; idempotent (``changed: false``)."""
    return Approval(**_control(request).approve(turn_id, call_id, by=_who(c, body.by), params=body.params))


@router.post("/turns/{turn_id}/approvals/{call_id}/reject", response_model=Approval, responses={**ERRORS, 409: {}})
def reject(turn_id: str, call_id: str, body: RejectIn, request: Request, c: Caller = Depends(turn_caller)) -> Approval:
    """Reject a waiting call with a reason: it does not run; the model reads the reason."""
    return Approval(**_control(request).reject(turn_id, call_id, body.reason, by=_who(c, body.by)))
