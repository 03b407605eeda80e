"""The approvals page in a real browser: Playwright (PyPI) driving Debian's chromium (``make
browser``, a prerequisite of ``make test``), against the API server and the suite's real worker.

A parked turn appears on the page with its context and is approved there, and the turn
completes; a card that appears live is rejected with a reason that reaches the model; edited
arguments show a diff and run (a destructive call confirmed in the card first); every decision
stays visible on its card; a token for another agent sees nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import orjson
import pytest

from tests.support.api_server import ApiServer
from tests.support.scripts import fc, msg, output_texts, wait_for
from worker.turn.request import TurnStatus

CHROMIUM = os.environ.get("AGENT_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="module")
def api(control):
    srv = ApiServer(os.environ["CONTROL_REDIS_URL"]).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser_context():
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} is missing: run `make browser` (apt-get install chromium)"
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=FLAGS, timeout=60_000
        )
        yield ctx
        ctx.close()
    shutil.rmtree(profile, ignore_errors=True)


def _sign_in(ctx, api, token):
    ctx.clear_cookies()
    page = ctx.new_page()
    page.goto(f"{api.base_url}/ui/approvals")
    assert page.url.endswith("/ui/login")  # no cookie yet: the page asks for a token
    page.fill("#token", token)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/approvals")
    page.wait_for_selector("#live.on", timeout=15_000)  # following the change feed
    return page


def _parked_turn(control, gateway, script_name, agent, label, then="done"):
    gateway.add_script(
        script_name,
        [{"output": [msg(f"I will write {label}."), fc("guarded_write", {"label": label})]}, {"output": [msg(then)]}],
    )
    tid = control.enqueue(
        {
            "agent_id": agent,
            "input": f"please write {label}",
            "model": script_name,
            "toolset": "testing",
            "approval": {"mode": "declared"},
        }
    )
    wait_for(lambda: control.status(tid).status == TurnStatus.awaiting_approval, timeout=30)
    return tid


def test_parked_turn_is_approved_on_the_page_and_completes(api, control, gateway, script_name, browser_context):
    agent = f"page-{uuid.uuid4().hex[:6]}"
    tid = _parked_turn(control, gateway, script_name, agent, "build")
    page = _sign_in(browser_context, api, api.token([agent]))
    card = page.locator(f'.card[data-turn="{tid}"]')
    card.wait_for()
    assert "Overwriting build" in card.locator(".activity").inner_text()
    assert card.locator(".input").inner_text() == "please write build"  # the turn's input
    assert card.locator(".asking").inner_text() == "I will write build."  # the model's text of that reply
    assert orjson.loads(card.locator(".params").input_value()) == {"label": "build", "ms": 0}
    assert '\n  "label": "build"' in card.locator(".params").input_value()  # pretty-printed
    page.fill("#by", "paula")
    card.locator(".approve").click()
    card.locator(".confirm-yes").click()  # guarded_write is destructive: confirmed in the card
    card.locator(".decision").wait_for(timeout=15_000)  # the decision stays visible on the card
    assert card.locator(".decision").inner_text().startswith("approved by paula, ")
    view = control.wait(tid, timeout=30)
    assert view.status == TurnStatus.completed and view.final_output == "done"
    assert control.events(tid)[-1]["kind"] == "turn_finished"
    decided = [e for e in control.events(tid) if e["kind"] == "approval_decided"]
    assert decided[0]["decision"] == "approved" and decided[0]["by"].startswith("paula (token ")
    page.close()


def test_live_card_rejected_with_a_reason_that_reaches_the_model(api, control, gateway, script_name, browser_context):
    agent = f"page-{uuid.uuid4().hex[:6]}"
    page = _sign_in(browser_context, api, api.token([agent]))
    page.locator("#empty").wait_for()
    tid = _parked_turn(control, gateway, script_name, agent, "prod", then="ok, not writing")
    card = page.locator(f'.card[data-turn="{tid}"]')
    card.wait_for(timeout=15_000)  # appeared without a reload, from the change feed
    card.locator(".reject").click()
    assert "needs a reason" in card.locator(".error").inner_text()
    card.locator(".reason").fill("prod is frozen this week")
    card.locator(".reject").click()
    card.locator(".decision").wait_for(timeout=15_000)
    assert card.locator(".decision").inner_text().startswith("rejected by ")
    assert control.wait(tid, timeout=30).status == TurnStatus.completed
    [out] = output_texts(control, tid)
    assert "prod is frozen this week" in out and out.startswith("Rejected by ") and "token test-" in out
    last = [b for b in gateway.requests if b["model"] == script_name][-1]
    assert [i["output"] for i in last["input"] if i.get("type") == "function_call_output"] == [out]
    page.close()


def test_edited_arguments_show_a_diff_and_run(api, control, gateway, script_name, browser_context):
    agent = f"page-{uuid.uuid4().hex[:6]}"
    tid = _parked_turn(control, gateway, script_name, agent, "draft")
    page = _sign_in(browser_context, api, api.token([agent]))
    card = page.locator(f'.card[data-turn="{tid}"]')
    card.wait_for()
    assert card.locator(".approve-edited").is_disabled()
    card.locator(".params").fill('{\n  "label": "final",\n  "ms": 0\n}')
    assert card.locator(".diff .del").inner_text() == '-   "label": "draft",'
    assert card.locator(".diff .add").inner_text() == '+   "label": "final",'
    card.locator(".params").fill('{"label": "final", "ms": 99999}')  # against the tool's schema: refused
    card.locator(".approve-edited").click()
    card.locator(".confirm-yes").click()
    wait_for(lambda: "ms" in card.locator(".error").inner_text(), timeout=10)
    assert control.status(tid).status == TurnStatus.awaiting_approval
    card.locator(".params").fill('{"label": "final", "ms": 1}')
    card.locator(".approve-edited").click()
    card.locator(".confirm-yes").click()
    card.locator(".decision").wait_for(timeout=15_000)
    assert control.wait(tid, timeout=30).status == TurnStatus.completed
    assert orjson.loads(output_texts(control, tid)[0].split("\n", 1)[1])["label"] == "final"
    page.close()


def test_a_token_for_another_agent_sees_nothing(api, control, gateway, script_name, browser_context):
    owner, other = f"page-{uuid.uuid4().hex[:6]}", f"page-{uuid.uuid4().hex[:6]}"
    tid = _parked_turn(control, gateway, script_name, owner, "secret")
    page = _sign_in(browser_context, api, api.token([other]))
    page.locator("#empty").wait_for()
    assert page.locator(".card").count() == 0
    assert tid not in page.content() and "secret" not in page.content()
    # the page's own requests with this session: the list and a decision on the owner's call
    listed = page.evaluate("fetch('/v1/approvals').then(r => r.json())")
    assert listed == {"object": "list", "data": []}
    [pending] = control.pending_approvals(turn_id=tid)
    status = page.evaluate(
        f"""fetch('/v1/turns/{tid}/approvals/{pending["call_id"]}/approve',
              {{method: 'POST', headers: {{'Content-Type': 'application/json', 'X-Requested-With': 'x'}}, body: '{{}}'}})
            .then(r => r.status)"""
    )
    assert status == 404
    # a cookie session's change without X-Requested-With (what a cross-site form would send) is refused
    status = page.evaluate(f"""fetch('/v1/turns/{tid}/cancel', {{method: 'POST'}}).then(r => r.status)""")
    assert status == 403
    assert control.pending_approvals(turn_id=tid)[0]["status"] == "pending"
    control.cancel(tid)
    page.close()
