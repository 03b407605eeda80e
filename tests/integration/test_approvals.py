"""Human approval of tool calls, through a real Celery worker and a real Redis (issue 13, items 1-4).

The testing toolset has ``guarded_write`` (sequential, every call needs approval) and
``maybe_write`` (parallel, needs approval when its label starts with "danger"). The suite runs
with ``AGENT_APPROVAL_MODE=off``; these turns ask for approvals in their request.
"""

from __future__ import annotations

import time
import uuid

import orjson
import pytest
import redis

from control.errors import ControlPlaneError
from tests.integration.conftest import start_worker_process, stop_process
from tests.support.scripts import fc, msg, output_texts, wait_for
from worker.turn.request import TurnStatus

DECLARED = {"mode": "declared"}


def start(control, gateway, script_name, steps, approval=None, **extra):
    gateway.add_script(script_name, steps)
    return control.enqueue(
        {"input": "go", "model": script_name, "toolset": "testing", "approval": approval or DECLARED, **extra}
    )


def parked(control, turn_id, n=1):
    """Wait until the turn awaits approval with ``n`` pending calls; returns them."""

    def ready():
        pending = control.pending_approvals(turn_id=turn_id)
        if len(pending) == n and control.status(turn_id).status == TurnStatus.awaiting_approval:
            return pending
        return None

    return wait_for(ready)


def tool_log(control, turn_id):
    return [orjson.loads(x) for x in control.redis.lrange(f"test:log:{turn_id}", 0, -1)]


def events(control, turn_id, kind):
    return [e for e in control.events(turn_id) if e["kind"] == kind]


def active_tasks():
    from tasks.app import app

    replies = app.control.inspect(timeout=2).active() or {}
    return [t for tasks in replies.values() for t in tasks]


def test_approve_runs_the_call_once_and_resumes_the_turn(control, gateway, script_name):
    steps = [{"output": [fc("guarded_write", {"label": "build"})]}, {"output": [msg("written")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    assert pending["name"] == "guarded_write" and pending["activity"] == "Overwriting build"
    assert pending["arguments"] == {"label": "build", "ms": 0}
    # parked: nothing ran, and no task holds a worker slot while the turn waits
    assert tool_log(control, turn_id) == []
    assert active_tasks() == []
    [requested] = events(control, turn_id, "approval_requested")
    assert requested["activity"] == "Overwriting build" and requested["call_id"] == pending["call_id"]

    rec = control.approve(turn_id, pending["call_id"], by="alice")
    assert rec["changed"] and rec["status"] == "approved" and rec["by"] == "alice" and rec["decided_at"]
    view = control.wait(turn_id, timeout=30)
    assert view.status == TurnStatus.completed and view.final_output == "written"
    # idempotent: the same decision again changes nothing and runs nothing
    again = control.approve(turn_id, pending["call_id"], by="alice")
    assert again["changed"] is False
    assert [e[0] for e in tool_log(control, turn_id)] == ["guarded_write"]
    [decided] = events(control, turn_id, "approval_decided")
    assert decided["decision"] == "approved" and decided["by"] == "alice"
    assert decided["activity"] == "Overwriting build"
    assert orjson.loads(output_texts(control, turn_id)[0])["label"] == "build"


def test_reject_with_reason_becomes_the_output_the_model_reads(control, gateway, script_name):
    steps = [{"output": [fc("guarded_write", {"label": "prod"})]}, {"output": [msg("ok, I will not")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    with pytest.raises(ControlPlaneError, match="reason"):
        control.reject(turn_id, pending["call_id"], "  ", by="tester")
    control.reject(turn_id, pending["call_id"], "production is frozen today", by="bob")
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    assert tool_log(control, turn_id) == [], "a rejected call never runs"
    [out] = output_texts(control, turn_id)
    assert out == "Rejected by bob: production is frozen today. The call did not run."
    # the model's next request carries the reason
    last = [b for b in gateway.requests if b["model"] == script_name][-1]
    outputs = [i["output"] for i in last["input"] if i.get("type") == "function_call_output"]
    assert outputs == [out]
    # a decision the other way is refused, naming who decided first
    with pytest.raises(ControlPlaneError, match="already rejected by bob"):
        control.approve(turn_id, pending["call_id"], by="tester")


def test_approve_with_edited_params_valid_and_invalid(control, gateway, script_name):
    steps = [{"output": [fc("guarded_write", {"label": "original"})]}, {"output": [msg("done")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    # invalid against the tool's schema (ms <= 5000, label required): error to the approver, nothing changes
    with pytest.raises(ControlPlaneError, match="ms"):
        control.approve(turn_id, pending["call_id"], params={"label": "x", "ms": 99999}, by="tester")
    with pytest.raises(ControlPlaneError, match="label"):
        control.approve(turn_id, pending["call_id"], params={"ms": 1}, by="tester")
    assert control.pending_approvals(turn_id=turn_id)[0]["status"] == "pending"
    assert control.status(turn_id).status == TurnStatus.awaiting_approval

    rec = control.approve(turn_id, pending["call_id"], by="carol", params={"label": "edited", "ms": 1})
    assert rec["params"] == {"label": "edited", "ms": 1}
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    [entry] = tool_log(control, turn_id)
    assert entry[4] == "edited", "the call ran with the approver's params"
    [out] = output_texts(control, turn_id)
    assert out.startswith("Note: the approver edited the arguments")
    assert events(control, turn_id, "approval_decided")[0]["edited"] is True


def test_mixed_batch_free_calls_run_and_the_sequential_barrier_holds(control, gateway, script_name):
    steps = [
        {
            "output": [
                fc("read_thing", {"label": "before"}),
                fc("write_thing", {"label": "pre"}),
                fc("guarded_write", {"label": "gate", "ms": 20}),
                fc("read_thing", {"label": "after"}),
            ]
        },
        {"output": [msg("done")]},
    ]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    # free calls before the approval call run at once (the chain is cut just before it);
    # the call after the sequential barrier waits for the decision
    wait_for(lambda: [e[4] for e in tool_log(control, turn_id)] == ["before", "pre"])
    assert control.status(turn_id).status == TurnStatus.awaiting_approval
    control.approve(turn_id, pending["call_id"], by="tester")
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    log = tool_log(control, turn_id)
    assert [e[4] for e in log] == ["before", "pre", "gate", "after"]
    assert log[1][2] >= log[0][3] and log[3][2] >= log[2][3], "each sequential barrier holds"
    labels = [orjson.loads(o)["label"] for o in output_texts(control, turn_id)]
    assert labels == ["before", "pre", "gate", "after"], "outputs in emitted order"


def test_per_call_decision_function(control, gateway, script_name):
    steps = [
        {"output": [fc("maybe_write", {"label": "safe"}), fc("maybe_write", {"label": "danger-zone"})]},
        {"output": [fc("maybe_write", {"label": "safe-again"})]},
        {"output": [msg("done")]},
    ]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    assert pending["arguments"]["label"] == "danger-zone", "only the call the function flags waits"
    planned = {e["arguments"]["label"]: e["needs_approval"] for e in events(control, turn_id, "call_planned")}
    assert planned == {"safe": False, "danger-zone": True}
    # the free call of the same parallel group runs now; the flagged one waits
    wait_for(lambda: [e[4] for e in tool_log(control, turn_id)] == ["safe"])
    control.approve(turn_id, pending["call_id"], by="tester")
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    assert [e[4] for e in tool_log(control, turn_id)] == ["safe", "danger-zone", "safe-again"]
    assert len(events(control, turn_id, "approval_requested")) == 1


def test_approval_modes_require_for_destructive_or_waive(control, gateway, script_name):
    # "destructive": write_thing declares nothing but is destructive, so it waits
    steps = [{"output": [fc("write_thing", {"label": "w"}), fc("read_thing", {"label": "r"})]}, {"output": [msg("")]}]
    turn_id = start(control, gateway, script_name, steps, approval={"mode": "destructive"})
    [pending] = parked(control, turn_id)
    assert pending["name"] == "write_thing"
    control.reject(turn_id, pending["call_id"], "not now", by="tester")
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    # "off": even guarded_write runs without a person
    name3 = f"{script_name}-waived"
    steps3 = [{"output": [fc("guarded_write", {"label": "x"})]}, {"output": [msg("ok")]}]
    turn3 = start(control, gateway, name3, steps3, approval={"mode": "off"})
    assert control.wait(turn3, timeout=30).status == TurnStatus.completed
    assert [e[0] for e in tool_log(control, turn3)] == ["guarded_write"]
    assert events(control, turn3, "approval_requested") == []


def test_pending_approvals_per_turn_per_agent_and_all(control, gateway, script_name):
    agent = f"ag-{uuid.uuid4().hex[:6]}"
    steps = [{"output": [fc("guarded_write", {"label": "a"}), fc("guarded_write", {"label": "b"})]}]
    turn_id = start(control, gateway, script_name, steps, agent_id=agent)
    pending = parked(control, turn_id, n=2)
    assert [p["arguments"]["label"] for p in pending] == ["a", "b"]
    assert {p["call_id"] for p in control.pending_approvals(agent_id=agent)} == {p["call_id"] for p in pending}
    assert {p["call_id"] for p in pending} <= {p["call_id"] for p in control.pending_approvals()}
    assert control.pending_approvals(agent_id=f"{agent}-other") == []
    # one decision of two: still parked, nothing ran
    control.approve(turn_id, pending[0]["call_id"], by="tester")
    assert control.status(turn_id).status == TurnStatus.awaiting_approval
    assert tool_log(control, turn_id) == []
    control.cancel(turn_id)


def test_deadline_rejects_undecided_calls_and_resumes(control, gateway, script_name):
    from tasks.app import app

    steps = [{"output": [fc("guarded_write", {"label": "late"})]}, {"output": [msg("understood")]}]
    turn_id = start(control, gateway, script_name, steps, approval={"mode": "declared", "timeout": 1})
    [pending] = parked(control, turn_id)
    wait_for(lambda: time.time() > pending["deadline"])
    app.send_task("tasks.watchdog.sweep")  # what beat sends every 15 s, run by the real worker
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    assert output_texts(control, turn_id) == [
        "Rejected by the approval deadline: nobody decided within 1 s. The call did not run."
    ]
    assert tool_log(control, turn_id) == []
    assert events(control, turn_id, "approval_decided")[0]["by"] == "deadline"


def test_cancel_while_awaiting_answers_every_pending_call(control, gateway, script_name):
    steps = [{"output": [fc("guarded_write", {"label": "a"}), fc("read_thing", {"label": "b"})]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    assert control.cancel(turn_id) is True
    assert control.status(turn_id).status == TurnStatus.cancelled, "ends at once: no task would see the flag"
    items = control.items(turn_id)
    calls = [i["call_id"] for i in items if i["type"] == "function_call"]
    outs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert sorted(calls) == sorted(outs), "every function_call has its output: the history stays valid"
    assert outs[pending["call_id"]].startswith("Interrupted")
    assert control.pending_approvals(turn_id=turn_id) == []
    with pytest.raises(ControlPlaneError, match="cancelled"):
        control.approve(turn_id, pending["call_id"], by="tester")
    assert tool_log(control, turn_id) == []


def test_forged_tool_call_message_never_runs_an_undecided_call(control, gateway, script_name, redis_url):
    """Attack: a tool_call message for a call that awaits approval (forged, or a stale
    redelivery) must not run it. Staged in-process with the real engine and Redis."""
    from tests.integration.test_idempotency import RecordingDispatcher
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine
    from worker.turn.store import TurnStore

    steps = [{"output": [fc("guarded_write", {"label": "forged"})]}, {"output": [msg("")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    settings = Settings()
    r = redis.Redis.from_url(redis_url)
    engine = TurnEngine(
        TurnStore(r),
        settings,
        RecordingDispatcher(),
        toolset_resolver(settings),
        SyncModelClient(RESPONSES, gateway.base_url),
        redis=r,
    )
    outcome = engine.run_call(turn_id, 0, pending["call_id"])
    assert (outcome.action, outcome.detail) == ("dropped", "call awaits approval")
    assert tool_log(control, turn_id) == []
    # the watchdog leaves a parked turn alone: no re-drive counted, nothing dispatched
    assert engine.redrive(turn_id, 3).action == "parked"
    assert engine.dispatcher.sent == [] and engine.store.load(turn_id).redrives == 0
    control.cancel(turn_id)


@pytest.fixture
def own_worker(solo_worker):
    """Move every queue from the session's worker to one this test may kill; restore after."""
    from tasks.app import app

    queues = ("turns", "tools", "background", "workflow")
    for q in queues:
        app.control.cancel_consumer(q, destination=[solo_worker.node_name], reply=True, timeout=5)
    procs = [start_worker_process("--pool", "solo", "-c", "1")]
    yield procs
    for p in procs:
        stop_process(p)
    for q in queues:
        app.control.add_consumer(q, destination=[solo_worker.node_name], reply=True, timeout=5)


def test_worker_restart_while_awaiting_loses_nothing_and_runs_nothing_twice(own_worker, control, gateway, script_name):
    steps = [
        {"output": [fc("read_thing", {"label": "free"}), fc("guarded_write", {"label": "approved-once"})]},
        {"output": [msg("done")]},
    ]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    wait_for(lambda: len(tool_log(control, turn_id)) == 1)
    own_worker[0].kill()  # SIGKILL: the worker dies while the turn waits
    own_worker[0].wait()
    own_worker.append(start_worker_process("--pool", "solo", "-c", "1"))
    assert control.pending_approvals(turn_id=turn_id) == [pending], "the pending approval survived"
    control.approve(turn_id, pending["call_id"], by="dave")
    control.approve(turn_id, pending["call_id"], by="dave")  # a repeated click
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    assert sorted(e[4] for e in tool_log(control, turn_id)) == ["approved-once", "free"], "each call ran once"


def test_cli_lists_approves_and_rejects(control, gateway, script_name):
    from typer.testing import CliRunner

    from control.cli import app as cli

    steps = [{"output": [fc("guarded_write", {"label": "cli-a"}), fc("guarded_write", {"label": "cli-b"})]}]
    steps.append({"output": [msg("done")]})
    turn_id = start(control, gateway, script_name, steps)
    a, b = parked(control, turn_id, n=2)
    runner = CliRunner()
    listed = runner.invoke(cli, ["approvals", "--turn", turn_id, "--json"])
    assert listed.exit_code == 0, listed.output
    assert [orjson.loads(line)["call_id"] for line in listed.output.splitlines()] == [a["call_id"], b["call_id"]]
    bad = runner.invoke(cli, ["approve", turn_id, a["call_id"], "--params", '{"label": 5}'])
    assert bad.exit_code == 2 and "invalid" in bad.output
    ok = runner.invoke(cli, ["approve", turn_id, a["call_id"], "--by", "erin"])
    assert ok.exit_code == 0 and "approved" in ok.output
    no = runner.invoke(cli, ["reject", turn_id, b["call_id"], "too broad", "--by", "erin"])
    assert no.exit_code == 0 and "rejected" in no.output
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    assert [e[4] for e in tool_log(control, turn_id)] == ["cli-a"]


def test_run_command_needs_approval_unless_allowlisted():
    from types import SimpleNamespace

    from worker.tools.computer.approval import command_needs_approval

    def needs(cmd):
        return command_needs_approval(SimpleNamespace(command=cmd))

    assert not needs("ls -la") and not needs("wc -l notes.md todo.txt") and not needs("grep -n TODO src/app.py")
    for cmd in (
        "rm -rf build/",
        "cat a; rm b",
        "ls && rm x",
        "echo $(rm x)",
        "echo `rm x`",
        "cat a > b",
        "find . -delete",
        "find . -exec rm {} +",
        "sort -o out.txt in.txt",
        # found by an attacker: writing forms that a per-option check missed
        "sort -oimportant.txt /dev/null",
        "sort -uo new.txt /dev/null",
        "uniq /dev/null important.txt",
        "tree -o important.txt /usr/share/doc",
        "file -C -m magic",
        "date -s 2030-01-01",
        "env rm -rf build",
        "xargs rm",
        "find . -fprint found.txt",
        "python3 app.py",
        "ls 'unclosed",
        "",
    ):
        assert needs(cmd), cmd


def test_approval_demo(styled_control, gateway, homes_root):
    """``make run DEMO=approval``, against the test stack, in both wire styles: one approval, one
    rejection, streamed text."""
    control = styled_control
    import io
    from pathlib import Path

    from rich.console import Console

    from devtools.approval_demo import DEMO_MODEL, REJECT_REASON, run_approval_demo

    gateway.load_dir(Path(__file__).resolve().parents[2] / "scripts")
    out = io.StringIO()
    agent = f"demo-{uuid.uuid4().hex[:6]}"
    ok = run_approval_demo(
        control, console=Console(file=out, width=200), homes_root=homes_root, agent_id=agent, model=DEMO_MODEL
    )
    text = out.getvalue()
    assert ok, text
    assert "pending approvals" in text and "rm -rf build/" in text and REJECT_REASON in text
    assert "build/ removed: True; notes.md kept: True" in text
    turn_id = control.store.agent_turns(agent)[0]
    deltas = [e for e in control.events(turn_id) if e["kind"] == "model_delta" and e["type"] == "text"]
    assert len(deltas) > 2, "the model's text arrived in pieces"


def test_needs_approval_in_the_tool_contract():
    from pydantic import BaseModel

    from worker.tooling.contract import ToolResult, define_worker_tool
    from worker.tooling.errors import ToolDefinitionError

    class P(BaseModel):
        x: int

    def run(p, ctx):
        return ToolResult(content="ok")

    with pytest.raises(ToolDefinitionError, match="needs_approval"):
        define_worker_tool(name="t", description="d", input_model=P, execute=run, needs_approval="yes")
    assert (
        define_worker_tool(name="t", description="d", input_model=P, execute=run).approval_required(P(x=1), None)
        is False
    )

    def broken(p, ctx):
        raise RuntimeError("bug in the decision function")

    tool = define_worker_tool(name="t", description="d", input_model=P, execute=run, needs_approval=broken)
    assert tool.approval_required(P(x=1), None) is True, "when the decision function fails, ask a person"


# ----- issue 19, item 3: edits refuse unknown keys, who decides, approved-but-not-run -----------


@pytest.mark.parametrize("tool", ["guarded_write", "guarded_raw"])  # a pydantic tool, a raw-schema tool
def test_edit_with_an_unknown_key_is_refused_and_the_call_stays_pending(control, gateway, script_name, tool):
    """Attack: the approver's edit adds ``"sudo": true``; it must be refused, never passed on,
    silently dropped, or echoed to the model as what ran."""
    steps = [{"output": [fc(tool, {"label": "orig"})]}, {"output": [msg("done")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    with pytest.raises(ControlPlaneError, match=r"invalid \(nothing was recorded\).*sudo"):
        control.approve(turn_id, pending["call_id"], by="mallory", params={"label": "edited", "sudo": True})
    [still] = control.pending_approvals(turn_id=turn_id)
    assert still["status"] == "pending" and still["by"] is None
    assert control.status(turn_id).status == TurnStatus.awaiting_approval
    assert events(control, turn_id, "approval_decided") == []
    # the same validation as the call's own arguments (the raw schema's maxLength, the model's type)
    with pytest.raises(ControlPlaneError, match="label"):
        control.approve(
            turn_id, pending["call_id"], by="mallory", params={"label": "x" * 21 if tool == "guarded_raw" else 5}
        )
    control.approve(turn_id, pending["call_id"], by="carol", params={"label": "edited"})
    assert control.wait(turn_id, timeout=30).status == TurnStatus.completed
    [out] = output_texts(control, turn_id)
    assert out.startswith('Note: the approver edited the arguments; the call ran with {"label":"edited"}')
    assert "sudo" not in out
    if tool == "guarded_raw":
        assert [orjson.loads(x) for x in control.redis.lrange(f"test:raw:{turn_id}", 0, -1)] == [{"label": "edited"}]


def test_a_decision_records_who_made_it(control, gateway, script_name, monkeypatch):
    from typer.testing import CliRunner

    from control.cli import app as cli

    steps = [{"output": [fc("guarded_write", {"label": "a"}), fc("guarded_write", {"label": "b"})]}]
    turn_id = start(control, gateway, script_name, steps)
    a, b = parked(control, turn_id, n=2)
    for nobody in ("", "   "):  # the Python client requires a name
        with pytest.raises(ControlPlaneError, match="needs `by`"):
            control.approve(turn_id, a["call_id"], by=nobody)
    runner = CliRunner()
    monkeypatch.setenv("LOGNAME", "os-user-dana")  # what getpass.getuser() reads first
    ok = runner.invoke(cli, ["approve", turn_id, a["call_id"]])
    assert ok.exit_code == 0, ok.output
    empty = runner.invoke(cli, ["reject", turn_id, b["call_id"], "no", "--by", " "])
    assert empty.exit_code == 2 and "--by" in empty.output
    recs = {r["call_id"]: r for r in control.pending_approvals(turn_id=turn_id)}
    assert list(recs) == [b["call_id"]], "the refused decision left b pending"
    [decided] = events(control, turn_id, "approval_decided")
    assert decided["by"] == "os-user-dana"
    control.cancel(turn_id)


def test_cancel_reports_an_approved_call_that_never_started_as_not_run(control, gateway, script_name):
    # Two approval calls in one group: approving one leaves the gate shut until the other is decided.
    steps = [{"output": [fc("guarded_write", {"label": "a"}), fc("guarded_write", {"label": "b"})]}]
    turn_id = start(control, gateway, script_name, steps)
    a, b = parked(control, turn_id, n=2)
    control.approve(turn_id, a["call_id"], by="tester")
    assert control.cancel(turn_id) is True
    outs = {i["call_id"]: i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"}
    for call in (a, b):
        assert (
            outs[call["call_id"]] == "Interrupted: the turn ended (cancelled) before this call started; it did not run."
        )
    assert tool_log(control, turn_id) == []


def test_an_approved_record_with_an_unknown_key_written_past_decide_runs_nothing(
    control, gateway, script_name, redis_url
):
    """Defense in depth: edited params reach the tool only through ``check_params``, also when a
    record was written without ``decide`` (staged in-process with the real engine and Redis)."""
    from tests.integration.test_idempotency import RecordingDispatcher
    from worker.model.responses import RESPONSES
    from worker.model.sync_client import SyncModelClient
    from worker.settings import Settings
    from worker.tools.toolsets import toolset_resolver
    from worker.turn.engine import TurnEngine
    from worker.turn.keys import key
    from worker.turn.store import TurnStore

    steps = [{"output": [fc("guarded_write", {"label": "orig"})]}, {"output": [msg("")]}]
    turn_id = start(control, gateway, script_name, steps)
    [pending] = parked(control, turn_id)
    r = redis.Redis.from_url(redis_url)
    rec = TurnStore(r).approvals.record(turn_id, 0, pending["call_id"])
    rec.status, rec.by, rec.params = "approved", "mallory", {"label": "x", "sudo": True}
    r.hset(key(turn_id, "approvals", 0), pending["call_id"], rec.to_json())  # written some other way
    settings = Settings()
    engine = TurnEngine(
        TurnStore(r),
        settings,
        RecordingDispatcher(),
        toolset_resolver(settings),
        SyncModelClient(RESPONSES, gateway.base_url),
        redis=r,
    )
    assert engine.run_call(turn_id, 0, pending["call_id"]).action == "advanced"
    [out] = output_texts(control, turn_id)
    assert out.startswith("Error: the approver's edited arguments were refused") and "sudo" in out
    assert out.endswith("The call did not run.")
    assert [e for e in control.events(turn_id) if e["kind"] == "call_completed"][0]["error"] == "invalid_edit"
    assert tool_log(control, turn_id) == []
    control.cancel(turn_id)


def test_cancel_reports_a_call_that_started_and_never_reported_as_outcome_unknown(control, gateway, script_name):
    steps = [{"output": [fc("guarded_write", {"label": "a"}), fc("guarded_write", {"label": "b"})]}]
    turn_id = start(control, gateway, script_name, steps)
    a, b = parked(control, turn_id, n=2)
    # a worker claimed call a (it started) and died before reporting: staged through the real claim
    won, _ = control.store.claims.claim(turn_id, 0, a["call_id"], "node-gone:1", 60)
    assert won
    assert control.cancel(turn_id) is True
    outs = {i["call_id"]: i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"}
    assert outs[a["call_id"]].endswith("before this call finished; its outcome is unknown.")
    assert outs[b["call_id"]].endswith("before this call started; it did not run.")
