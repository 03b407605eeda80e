"""The operator's pages, served by the API under ``/ui`` behind the same tokens: the approvals,
the turns list and a transcript per turn.

Server-rendered (Jinja2, autoescaped: model text and tool outputs are only ever rendered as text)
with small plain-JavaScript files, no build step, under a Content-Security-Policy that allows
scripts, styles and connections from the API's own origin only (``CSP``). A person signs in by
pasting a token (``/ui/login``): the server checks it and keeps it in an HttpOnly,
SameSite=Strict cookie (``control.api.auth.COOKIE``), which the page's requests then carry.

- ``/ui/approvals``: the pending approvals of the agents the token covers, each a card with its
  whole context (``control.api.turn_views.approval_card``); decisions go through the JSON API
  (``/v1/turns/{id}/approvals/{call}/approve|reject``), a destructive call's approval through a
  confirmation step in the card; a decided card stays, with its record and the turn's progress.
  The list follows the approvals change feed (``/v1/approvals/events``).
- ``/ui/turns``: the turns of those agents, newest first (``ControlPlane.list_turns``), a page at a time.
- ``/ui/turns/{id}``: the turn's transcript (``turn_views.transcript``), reloaded from
  ``/ui/turns/{id}/body`` while its event stream (``/v1/turns/{id}/events``) says it moves, with
  the model's text streamed in as it is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from control.api import turn_views
from control.api.auth import COOKIE, Caller, authenticate, bearer, caller, turn_caller, verify
from control.api.errors import ApiError

HERE = Path(__file__).resolve().parent
TEMPLATES = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
TURNS_PER_PAGE = 50
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class SessionIn(BaseModel):
    token: str


def _cards(request: Request, c: Caller) -> list[dict[str, Any]]:
    control = request.app.state.control
    cache: dict[str, Any] = {}
    return [
        turn_views.approval_card(control, rec, cache)
        for rec in control.pending_approvals()
        if c.token.covers(rec["agent_id"])
    ]


def _html(text: str) -> HTMLResponse:
    return HTMLResponse(text, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"})


async def _page_caller(request: Request) -> Caller | None:
    if not request.cookies.get(COOKIE) and not request.headers.get("authorization"):
        return None
    try:
        return await authenticate(request, await bearer(request), None)
    except ApiError as exc:
        if exc.status == 401:
            return None
        raise


def install(app: FastAPI) -> None:
    """Add ``/ui`` (the page, its list fragment, sign-in and sign-out) and ``/ui/static``."""
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")

    @app.get("/ui", include_in_schema=False)
    async def root() -> RedirectResponse:
        return RedirectResponse("/ui/approvals", status_code=303)

    @app.get("/ui/login", include_in_schema=False)
    async def login() -> HTMLResponse:
        return _html(TEMPLATES.get_template("login.html").render())

    @app.post("/ui/session", include_in_schema=False)
    async def session(body: SessionIn, request: Request) -> Response:
        """Check the pasted token and keep it in the page's cookie (204), or 401."""
        await verify(request, body.token.strip())
        resp = Response(status_code=204)
        resp.set_cookie(
            COOKIE,
            body.token,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
            max_age=12 * 3600,
        )
        return resp

    @app.post("/ui/logout", include_in_schema=False)
    async def logout() -> Response:
        resp = RedirectResponse("/ui/login", status_code=303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    @app.get("/ui/approvals", include_in_schema=False)
    async def approvals_page(request: Request) -> Response:
        c = await _page_caller(request)
        if c is None:
            return RedirectResponse("/ui/login", status_code=303)
        cards = await run_in_threadpool(_cards, request, c)
        return _html(TEMPLATES.get_template("approvals.html").render(token=c.token.public(), cards=cards))

    @app.get("/ui/approvals/list", include_in_schema=False)
    def approvals_list(request: Request, c: Caller = Depends(caller)) -> HTMLResponse:
        return _html(TEMPLATES.get_template("cards.html").render(cards=_cards(request, c)))

    @app.get("/ui/turns", include_in_schema=False)
    async def turns_page(request: Request, cursor: str | None = None, agent_id: str | None = None) -> Response:
        c = await _page_caller(request)
        if c is None:
            return RedirectResponse("/ui/login", status_code=303)
        scope = None if c.token.agents is None else sorted(c.token.agents)
        if agent_id:
            scope = [agent_id] if c.token.covers(agent_id) else []
        control = request.app.state.control
        turns, next_cursor = await run_in_threadpool(
            lambda: control.list_turns(agents=scope, cursor=cursor, limit=TURNS_PER_PAGE) if scope != [] else ([], None)
        )
        page = TEMPLATES.get_template("turns.html")
        return _html(page.render(token=c.token.public(), turns=turns, next_cursor=next_cursor, agent_id=agent_id or ""))

    @app.get("/ui/turns/{turn_id}", include_in_schema=False)
    async def transcript_page(request: Request, turn_id: str) -> Response:
        if await _page_caller(request) is None:
            return RedirectResponse("/ui/login", status_code=303)
        c = await turn_caller(request, turn_id, await bearer(request))
        view = await run_in_threadpool(turn_views.transcript, request.app.state.control, c.turn_id or turn_id)
        return _html(TEMPLATES.get_template("transcript.html").render(turn_id=c.turn_id, t=view))

    @app.get("/ui/turns/{turn_id}/body", include_in_schema=False)
    def transcript_body(request: Request, c: Caller = Depends(turn_caller)) -> HTMLResponse:
        view = turn_views.transcript(request.app.state.control, c.turn_id or "")
        return _html(TEMPLATES.get_template("transcript_body.html").render(turn_id=c.turn_id, t=view))
