"""Who is calling: every route but ``/healthz``, the page's login form and its static files needs a
token (``control.api.tokens``), sent as ``Authorization: Bearer <token>`` or, from the approvals
page, in the ``atr_session`` cookie (HttpOnly, SameSite=Strict).

A request authenticated by the cookie that changes something (not GET/HEAD) must also carry
``X-Requested-With``: a cross-site form cannot set that header, and a cross-site script cannot
send it without a CORS preflight this API never grants.

A turn's routes answer 404 "unknown turn" both for a turn that does not exist and for one of an
agent the token does not cover: a token never learns whether another agent's turn exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from control.api.errors import ApiError
from control.api.tokens import AuthResult, Token
from worker.turn.request import is_valid_id

COOKIE = "atr_session"
CSRF_HEADER = "X-Requested-With"

bearer = HTTPBearer(auto_error=False, description="An API token (agent-runtime token create)")


@dataclass(frozen=True)
class Caller:
    """An authenticated request: its token and, on a turn's routes, the turn's agent."""

    token: Token
    turn_id: str | None = None
    agent_id: str | None = None


def _presented(request: Request, creds: HTTPAuthorizationCredentials | None) -> tuple[str, bool]:
    if creds is not None and creds.credentials:
        return creds.credentials, False
    cookie = request.cookies.get(COOKIE)
    if cookie:
        return cookie, True
    raise ApiError(401, "a token is required: Authorization: Bearer <token>", headers={"WWW-Authenticate": "Bearer"})


async def authenticate(request: Request, creds: HTTPAuthorizationCredentials | None, turn_id: str | None) -> Caller:
    """Check the token, its rate limit and (with ``turn_id``) that it covers the turn's agent.

    Raises ``ApiError`` 401 (no or unknown token), 403 (cookie without ``X-Requested-With`` on a
    change), 404 (unknown or foreign turn), 429 (over the token's rate, or the client address over
    its failed authentications, ``AGENT_API_AUTH_FAILURES``; with ``Retry-After``);
    ``redis.RedisError`` when Redis fails (answered 503)."""
    return await verify(request, _checked_token(request, creds), turn_id)


def _checked_token(request: Request, creds: HTTPAuthorizationCredentials | None) -> str:
    token, by_cookie = _presented(request, creds)
    if by_cookie and request.method not in ("GET", "HEAD") and not request.headers.get(CSRF_HEADER):
        raise ApiError(403, f"a change made with the page's session cookie needs the {CSRF_HEADER} header")
    return token


async def verify(request: Request, token: str, turn_id: str | None = None) -> Caller:
    """``authenticate`` for a token already in hand (the page's sign-in); raises the same errors."""
    state = request.app.state
    settings = state.settings
    found = await state.tokens.authenticate(
        token,
        rate=settings.rate,
        burst=settings.burst,
        turn_id=turn_id,
        address=request.client.host if request.client else "unknown",
        failures=settings.auth_failures,
        window=settings.auth_failure_window,
    )
    refused = refusal(found)
    if refused is not None:
        raise refused
    assert found.token is not None  # refusal says so
    if turn_id is not None and not found.token.covers(found.turn_agent):
        raise ApiError(404, f"unknown turn {turn_id}")
    return Caller(found.token, turn_id, found.turn_agent)


def refusal(found: AuthResult) -> ApiError | None:
    """The error answering a token's failed checks (``TokenStore.authenticate``'s result): 429 for
    a throttled address or a token over its rate (``Retry-After``), 401 for an unknown or revoked
    token; None when it passed."""
    if found.throttled_ms:
        seconds = max(1, -(-found.throttled_ms // 1000))
        return ApiError(
            429,
            f"too many failed authentications from this address; retry in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )
    if found.token is None:
        return ApiError(401, "unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    if found.retry_after_ms:
        seconds = max(1, -(-found.retry_after_ms // 1000))
        return ApiError(
            429,
            f"token {found.token.id} is over its rate limit; retry in {seconds} s",
            headers={"Retry-After": str(seconds)},
        )
    return None


async def presented_token(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str:
    """Dependency of a route that checks its token itself, in its own script
    (``tokens.AuthenticatedScript``): the token presented, not yet checked. Raises ``ApiError`` 401
    (none) and 403 (cookie without ``X-Requested-With`` on a change). Its route's validation
    errors are answered only after the token's checks (``authenticate_first``)."""
    return _checked_token(request, creds)


async def authenticate_first(request: Request) -> None:
    """``authenticate`` for a request refused before its route ran (a body that does not validate)
    by a route that checks its token itself: an unknown token still gets 401, not the body's
    error. Raises like ``authenticate``."""
    await authenticate(request, await bearer(request), None)


async def caller(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Caller:
    """Dependency: any valid token."""
    return await authenticate(request, creds, None)


async def turn_caller(
    request: Request, turn_id: str, creds: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Caller:
    """Dependency of the routes under ``/v1/turns/{turn_id}``: a token covering the turn's agent."""
    if not is_valid_id(turn_id):
        await authenticate(request, creds, None)  # a bad token still gets 401, not 404
        raise ApiError(404, f"unknown turn {turn_id[:80]}")
    return await authenticate(request, creds, turn_id)
