"""The approvals page, served by the API under ``/ui`` behind the same tokens.

Server-rendered (Jinja2, autoescaped) with one small plain-JavaScript file, no build step. A
person signs in by pasting a token (``/ui/login``): the server checks it and keeps it in an
HttpOnly, SameSite=Strict cookie (``control.api.auth.COOKIE``), which the page's requests then
carry. The page lists the pending approvals of the agents the token covers, each with its
context: the turn's input, the model's last text, the calls the turn already ran, and the
call's arguments pretty-printed (editable, with a line diff of the edits). Decisions go through
the JSON API (``/v1/turns/{id}/approvals/{call}/approve|reject``); the list follows the approvals
change feed (``/v1/approvals/events``) and reloads its cards when something changes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader, select_autoescape
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from control.api.auth import COOKIE, Caller, authenticate, bearer, caller, verify
from control.api.errors import ApiError

HERE = Path(__file__).resolve().parent
TEMPLATES = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(["html"]))
OUTPUT_PREVIEW = 400  # characters of an earlier call's output shown
RUN_CALLS_SHOWN = 20  # the last calls of the turn shown


class SessionIn(BaseModel):
    token: str


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or p.get("refusal") or "") for p in content if isinstance(p, dict))
    return ""


def approval_context(items: list[dict[str, Any]], request: dict[str, Any]) -> dict[str, Any]:
    """What a person sees beside a waiting call: ``input`` (the turn's user input as text),
    ``last_text`` (the model's last message), ``ran`` (earlier calls: name, arguments, output
    preview, newest last)."""
    given = request.get("input")
    if isinstance(given, str):
        turn_input = given
    else:
        turn_input = "\n\n".join(_text_of(i.get("content")) for i in given or [] if i.get("role") in ("user", None))
    last_text = ""
    for item in items:
        if item.get("type", "message") == "message" and item.get("role") == "assistant":
            last_text = _text_of(item.get("content")) or last_text
    outputs = {i.get("call_id"): i.get("output") for i in items if i.get("type") == "function_call_output"}
    ran = [
        {
            "name": i.get("name"),
            "arguments": i.get("arguments", ""),
            "output": _text_of(outputs[i.get("call_id")])[:OUTPUT_PREVIEW],
        }
        for i in items
        if i.get("type") == "function_call" and i.get("call_id") in outputs
    ]
    return {"input": turn_input, "last_text": last_text, "ran": ran[-RUN_CALLS_SHOWN:]}


def _cards(request: Request, c: Caller) -> list[dict[str, Any]]:
    control = request.app.state.control
    cards = []
    contexts: dict[str, dict[str, Any]] = {}
    for rec in control.pending_approvals():
        if not c.token.covers(rec["agent_id"]):
            continue
        tid = rec["turn_id"]
        if tid not in contexts:
            state = control.store.load(tid)
            contexts[tid] = approval_context(control.items(tid), state.request if state else {})
        cards.append(
            {
                **rec,
                "key": f"{tid}/{rec['call_id']}",
                "pretty": json.dumps(rec["arguments"], indent=2, ensure_ascii=False, sort_keys=True),
                "context": contexts[tid],
            }
        )
    return cards


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
        return HTMLResponse(TEMPLATES.get_template("login.html").render())

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
        return HTMLResponse(TEMPLATES.get_template("approvals.html").render(token=c.token.public(), cards=cards))

    @app.get("/ui/approvals/list", include_in_schema=False)
    def approvals_list(request: Request, c: Caller = Depends(caller)) -> HTMLResponse:
        return HTMLResponse(TEMPLATES.get_template("cards.html").render(cards=_cards(request, c)))
