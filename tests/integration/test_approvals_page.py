"""The approvals page in a real browser: Playwright (PyPI) driving Debian's chromium (``make
browser``, a prerequisite of ``make test``), against the API server and the suite's real worker.

A parked turn appears on the page with its context and is approved there, and the turn
completes; a card that appears live is rejected with a reason that reaches the model; edited
arguments show a diff and run; a token for another agent sees nothing. The approval demo walked
on the page: the card shows its whole batch (the `ls build` that already ran and failed), a
confirmation guards `rm -rf`, the decision stays visible, and the turn's transcript page follows
the turn live to its end; the turns list links to it.
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


def test_the_approval_demo_walked_on_the_page(api, control, gateway, browser_context):
    """The approval demo's script on an agent without a ``build/`` folder: ``ls build`` runs at once
    and fails while both ``rm`` calls wait."""
    gateway.load_dir(Path(__file__).resolve().parents[2] / "scripts")
    agent = f"page-{uuid.uuid4().hex[:6]}"
    token = api.token([agent])
    with api.client(token) as http:
        body = {
            "agent_id": agent,
            "input": "clean up build",
            "model": "demo-approval",
            "approval": {"mode": "declared"},
        }
        tid = http.post("/v1/turns", json=body).json()["turn_id"]
    wait_for(lambda: len(control.pending_approvals(turn_id=tid)) == 2, timeout=30)
    wait_for(lambda: any(e["kind"] == "call_completed" for e in control.events(tid)), timeout=30)  # ls ran
    calls = {p["arguments"]["command"]: p["call_id"] for p in control.pending_approvals(turn_id=tid)}
    page = _sign_in(browser_context, api, token)
    rm_build = page.locator(f'.card[data-call="{calls["rm -rf build/"]}"]')
    rm_build.wait_for()
    # its whole batch: ls build ran and failed, the other rm waits; the model's text of that reply
    ls = rm_build.locator(".sibling", has_text="ls build")
    assert "No such file or directory" in ls.locator(".output").text_content()
    assert "waits for a decision" in rm_build.locator(".sibling", has_text="rm -f notes.md").text_content()
    assert "(this call)" in rm_build.locator(".sibling.self").text_content()
    assert rm_build.locator(".asking").text_content().startswith("Let me see what the build folder holds")
    assert orjson.loads(rm_build.locator(".params").input_value())["command"] == "rm -rf build/"  # as validated
    assert rm_build.locator(".raw pre").is_hidden()  # the raw arguments are a click away
    rm_build.locator(".raw summary").click()
    assert orjson.loads(rm_build.locator(".raw pre").text_content()) == {"command": "rm -rf build/"}
    assert "ago" in rm_build.locator("time.requested").text_content()
    assert rm_build.locator(".enqueued-by").text_content().startswith("token test-")
    # a destructive call: Approve asks for a confirmation first, and nothing is decided until then
    page.fill("#by", "paula")
    rm_build.locator(".approve").click()
    rm_build.locator(".confirm").wait_for()
    assert "rm -rf build/" in rm_build.locator(".confirm").text_content()
    assert (
        control.pending_approvals(turn_id=tid)[0]["status"] == "pending"
        and len(control.pending_approvals(turn_id=tid)) == 2
    )
    rm_build.locator(".confirm-no").click()
    assert rm_build.locator(".confirm").is_hidden() and len(control.pending_approvals(turn_id=tid)) == 2
    rm_build.locator(".approve").click()
    rm_build.locator(".confirm-yes").click()
    record = rm_build.locator(".decision")
    record.wait_for(timeout=15_000)
    assert record.text_content().startswith("approved by paula, ")
    assert record.text_content().endswith("runs when the other call is decided")
    wait_for(lambda: len(control.pending_approvals(turn_id=tid)) == 1, timeout=10)
    # the turn's transcript page, opened from the card while the turn waits, follows it to its end
    transcript = browser_context.new_page()
    transcript.goto(f"{api.base_url}{rm_build.locator('a.turn-link').get_attribute('href')}")
    transcript.wait_for_selector("#live.on", timeout=15_000)
    assert transcript.locator("#status").text_content() == "awaiting_approval"
    assert "No such file or directory" in transcript.locator(".entry.call.current", has_text="ls build").text_content()
    rm_notes = page.locator(f'.card[data-call="{calls["rm -f notes.md"]}"]')
    transcript.evaluate(
        """() => { const box = document.getElementById("streaming"); window.sawText = "";
             new MutationObserver(() => { if (!box.hidden) window.sawText = box.textContent; })
               .observe(box, {attributes: true, childList: true, subtree: true, characterData: true}); }"""
    )
    rm_notes.locator(".reason").fill("notes.md is the only copy")
    rm_notes.locator(".reject").click()
    rm_notes.locator(".decision").wait_for(timeout=15_000)
    transcript.wait_for_selector("#final", timeout=30_000)
    assert transcript.locator("#status").text_content() == "completed"
    wait_for(lambda: transcript.locator("#live").text_content() == "ended", timeout=10)
    assert transcript.locator("#final").text_content().startswith("Done: build/ is gone")
    assert "Done: build/" in transcript.evaluate("window.sawText")  # the reply was shown as it streamed
    approvals = transcript.locator(".approval")
    assert (
        approvals.count() == 2
        and "approved by paula" in approvals.nth(0).text_content() + approvals.nth(1).text_content()
    )
    assert "tokens:" in transcript.locator("#usage").text_content()
    outputs = transcript.locator(".entry.call .output").all_inner_texts()
    assert any("No such file or directory" in o for o in outputs) and any(
        "notes.md is the only copy" in o for o in outputs
    )
    # the card shows the turn's progress to its end; the turns list links to the transcript
    wait_for(lambda: "turn completed" in rm_build.locator(".progress").text_content(), timeout=15)
    page.goto(f"{api.base_url}/ui/turns")
    row = page.locator(f'tr.turn[data-turn="{tid}"]')
    assert "completed" in row.text_content() and "clean up build" in row.text_content()
    assert row.locator("a.turn-link").get_attribute("href") == f"/ui/turns/{tid}"
    transcript.close()
    page.close()
