"""``agent-runtime``: the control-plane CLI (enqueue, wait, status, usage, trace, items, transcript,
cancel, schema, approvals, approve, reject, token, turns, nodes, drain).

Reads ``CONTROL_REDIS_URL`` (the control plane's ACL user), else ``REDIS_URL``. Exit codes: 0
success, 1 turn ended without completing, 2 bad input or unreachable Redis.
"""

from __future__ import annotations

import getpass
import json
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator

import orjson
import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape

from control.token_cli import app as token_app
from control.turns_cli import app as turns_app

if TYPE_CHECKING:  # imported where used: a CLI start does not load the client before it needs it
    from control.client import ControlPlane

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long


@contextmanager
def _exit_on_errors() -> Iterator[None]:
    """Control-plane errors (Redis unreachable, unknown turn, timeout) and bad requests: message, exit 2."""
    from control.errors import ControlPlaneError

    try:
        yield
    except ControlPlaneError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    except ValidationError as exc:
        # One line: each failing field and why (pydantic's own dump runs over several lines and links).
        problems = "; ".join(
            e["msg"] if (e.get("ctx") or {}).get("path") else f"{'.'.join(map(str, e['loc'])) or 'request'}: {e['msg']}"
            for e in exc.errors()
        )
        err.print(f"[red]invalid turn request:[/] {escape(problems)}", soft_wrap=True)
        raise typer.Exit(2) from exc


def _control() -> ControlPlane:
    from control.client import ControlPlane

    with _exit_on_errors():
        return ControlPlane()


def _read_input_items(path: str) -> list[dict[str, Any]]:
    """The Responses input items in ``path`` (``-``: stdin): a JSON array of objects. Exit 2 otherwise."""
    try:
        raw = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
        items = json.loads(raw)
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/] cannot read input items from {path}: {exc}")
        raise typer.Exit(2) from exc
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        err.print(f"[red]error:[/] {path} must hold a non-empty JSON array of input items (objects)")
        raise typer.Exit(2)
    return items


@app.command()
def enqueue(
    text: str = typer.Argument(None, help="the user's message (or --input-file)"),
    input_file: str = typer.Option(
        None, "--input-file", help="a JSON array of Responses input items instead of a message ('-': stdin)"
    ),
    agent: str = typer.Option("agent", help="agent id (its home is <homes_root>/<agent>)"),
    toolset: str = typer.Option("text", help="toolset: text or one configured in AGENT_EXTRA_TOOLSETS"),
    model: str = typer.Option(None, help="model name (default: OPENAI_MODEL)"),
    instructions: str = typer.Option(None, help="system instructions"),
    idempotency_key: str = typer.Option(None, help="enqueue at most once per key"),
    spawn_jobs: bool = typer.Option(False, help="offer background job tools"),
    network: str = typer.Option("none", help="commands' network: none, or egress (through the guarded proxy)"),
    allow_host: list[str] = typer.Option(None, help="with --network egress: a host egress may reach (repeatable)"),
    approval: str = typer.Option(
        None, help="which calls wait for a person: declared, destructive or off (default: AGENT_APPROVAL_MODE)"
    ),
    wait: bool = typer.Option(False, help="follow the transcript until the turn ends"),
) -> None:
    """Enqueue a turn and print its id (or follow it with --wait)."""
    if (text is None) == (input_file is None):
        err.print("[red]error:[/] give a message or --input-file, not both and not neither")
        raise typer.Exit(2)
    if text is not None and not text.strip():
        err.print("[red]error:[/] the message is empty")
        raise typer.Exit(2)
    from control.client import INTERNAL_TOOLSETS

    if toolset in INTERNAL_TOOLSETS:
        err.print(f"[red]error:[/] toolset {toolset!r} cannot run from this command: {INTERNAL_TOOLSETS[toolset]}")
        raise typer.Exit(2)
    message = text if input_file is None else _read_input_items(input_file)
    from worker.turn.request import TurnRequest

    with _exit_on_errors():  # checked before Redis is reached: a bad item is reported as such
        request = TurnRequest.model_validate(
            {
                "agent_id": agent,
                "input": message,
                "toolset": toolset,
                "model": model,
                "instructions": instructions,
                "idempotency_key": idempotency_key,
                "supports": {"spawn_jobs": spawn_jobs},
                "network": network,
                "egress_allow_hosts": allow_host or None,
                "approval": {"mode": approval},
            }
        )
    control = _control()
    with _exit_on_errors():
        turn_id = control.enqueue(request)
    if not wait:
        print(turn_id)
        return
    console.print(f"turn {turn_id} queued on {control.display_url}")
    from control.transcript import print_transcript

    with _exit_on_errors():
        final = print_transcript(control, turn_id, console)
    raise typer.Exit(0 if final and final.get("status") == "completed" else 1)


@app.command()
def status(turn_id: str) -> None:
    """Print the turn's status as JSON."""
    with _exit_on_errors():
        control = _control()
        v = control.status(turn_id)
        used = control.usage(turn_id)["total"]
    print(
        json.dumps(
            {
                "turn_id": v.turn_id,
                "status": v.status.value,
                "step": v.step,
                "model_calls": v.model_calls,
                "final_output": v.final_output,
                "error": v.error,
                "usage": used,
            }
        )
    )


@app.command()
def usage(turn_id: str) -> None:
    """Print the turn's token usage as JSON: totals, each model call's, and the budget."""
    with _exit_on_errors():
        print(json.dumps(_control().usage(turn_id)))


@app.command()
def trace(
    turn_id: str,
    spans: str = typer.Option(None, help="span file written by the workers (default: AGENT_OTEL_FILE)"),
    as_json: bool = typer.Option(False, "--json", help="print the spans as JSON lines instead of a tree"),
) -> None:
    """Print the turn's span tree, from the JSON-lines span file the workers write (AGENT_OTEL_FILE)."""
    import os
    from pathlib import Path

    from control.span_tree import span_tree, turn_spans

    path = spans or os.environ.get("AGENT_OTEL_FILE")
    if not path:
        err.print("[red]error:[/] no span file: pass --spans or set AGENT_OTEL_FILE (as on the workers)")
        raise typer.Exit(2)
    control = _control()
    with _exit_on_errors():
        control.status(turn_id)  # ControlPlaneError for an unknown turn
        state = control.store.load(turn_id)
        found = turn_spans(Path(path), state.traceparent if state else None)
    if not found:
        err.print(f"[red]error:[/] no span of turn {turn_id} in {path}")
        raise typer.Exit(1)
    if as_json:
        for span in found:
            sys.stdout.write(json.dumps(span) + "\n")
        return
    console.print(span_tree(found, f"trace of turn {turn_id}"))


@app.command("wait")
def wait_cmd(turn_id: str, timeout: float = typer.Option(120.0, help="seconds")) -> None:
    """Block until the turn ends; print its final status as JSON."""
    with _exit_on_errors():
        v = _control().wait(turn_id, timeout)
    print(
        json.dumps({"turn_id": v.turn_id, "status": v.status.value, "final_output": v.final_output, "error": v.error})
    )
    raise typer.Exit(0 if v.status.value == "completed" else 1)


@app.command()
def items(turn_id: str) -> None:
    """Print the turn's Responses input items (JSON lines)."""
    control = _control()
    with _exit_on_errors():
        control.status(turn_id)  # an unknown turn is an error, not an empty list
        for item in control.items(turn_id):
            sys.stdout.write(orjson.dumps(item).decode() + "\n")


@app.command()
def transcript(turn_id: str, follow: bool = typer.Option(False, help="keep tailing until the turn ends")) -> None:
    """Print the turn's transcript (activity labels, batches, repairs, final answer)."""
    from control.transcript import print_transcript

    control = _control()
    with _exit_on_errors():
        control.status(turn_id)
        print_transcript(control, turn_id, console, follow=follow)


@app.command()
def cancel(turn_id: str) -> None:
    """Cancel a turn (running tools see the abort signal; the next step boundary ends it)."""
    control = _control()
    with _exit_on_errors():
        print("cancelling" if control.cancel(turn_id) else "already ended")


@app.command()
def approvals(
    turn: str = typer.Option(None, help="only this turn's calls"),
    agent: str = typer.Option(None, help="only this agent's turns"),
    as_json: bool = typer.Option(False, "--json", help="JSON lines instead of a table"),
) -> None:
    """List the tool calls waiting for a decision (all turns, one agent's, or one turn's)."""
    import time

    control = _control()
    with _exit_on_errors():
        pending = control.pending_approvals(turn_id=turn, agent_id=agent)
    if as_json:
        for rec in pending:
            sys.stdout.write(orjson.dumps(rec).decode() + "\n")
        return
    if not pending:
        console.print("no calls wait for approval")
        return
    for rec in pending:
        left = max(0, int(rec["deadline"] - time.time()))
        console.print(
            f"[bold]{rec['turn_id']}[/] {rec['call_id']}  [cyan]{rec['name']}[/]  "
            f"wants to run: [yellow]{escape(rec['activity'])}[/]  (agent {rec['agent_id']}, {left} s left)"
        )
        console.print(f"    arguments: {escape(orjson.dumps(rec['arguments']).decode())}")


def _decider(by: str | None) -> str:
    """Who decides: ``--by``, else the OS user (``getpass.getuser``); exits 2 when neither names anyone."""
    if by is not None and by.strip():
        return by.strip()
    if by is None:
        try:
            user = getpass.getuser()
        except Exception:  # no login name, no USER/LOGNAME (a bare container): getuser raises OSError/KeyError
            user = ""
        if user.strip():
            return user.strip()
    err.print("[red]error:[/] say who decides: --by NAME (no OS user name to record)")
    raise typer.Exit(2)


def _print_decision(rec: dict[str, Any]) -> None:
    what = rec["status"] if rec["changed"] else f"already {rec['status']} (by {rec['by']})"
    print(f"{rec['call_id']}: {what}")


@app.command()
def approve(
    turn_id: str,
    call_id: str,
    by: str | None = typer.Option(None, help="who decides (recorded with the time; default: your OS user name)"),
    params: str = typer.Option(None, help="edited arguments, a JSON object (checked against the tool's schema)"),
) -> None:
    """Approve a waiting call (optionally with edited params); the turn resumes once its calls are decided."""
    edited = None
    if params is not None:
        try:
            edited = orjson.loads(params)
        except orjson.JSONDecodeError as exc:
            err.print(f"[red]error:[/] --params is not JSON: {exc}")
            raise typer.Exit(2) from exc
    who = _decider(by)
    control = _control()
    with _exit_on_errors():
        _print_decision(control.approve(turn_id, call_id, by=who, params=edited))


@app.command()
def reject(
    turn_id: str,
    call_id: str,
    reason: str = typer.Argument(..., help="why (the model reads it as the call's output)"),
    by: str | None = typer.Option(None, help="who decides (recorded with the time; default: your OS user name)"),
) -> None:
    """Reject a waiting call: it does not run, and the model is told the reason."""
    who = _decider(by)
    control = _control()
    with _exit_on_errors():
        _print_decision(control.reject(turn_id, call_id, reason, by=who))


@app.command()
def nodes(as_json: bool = typer.Option(False, "--json", help="one JSON object instead of a table")) -> None:
    """List the nodes that hold agents' homes: live or not, draining, how many agents each holds."""
    control = _control()
    with _exit_on_errors():
        found = control.nodes()
    if as_json:
        print(orjson.dumps(found).decode())
        return
    if not found:
        console.print("no node holds homes yet (a worker consuming the tools queue is one)")
    for name, n in sorted(found.items()):
        state = ("draining" if n["draining"] else "live") if n["live"] else f"down ({n['age']:.0f} s)"
        drained = " (drained)" if n.get("drained_at") and n["agents"] == 0 else ""
        console.print(f"[bold]{name}[/]  {state}{drained}  agents={n['agents']}  store={n.get('store') or 'none'}")


@app.command()
def drain(
    node: str,
    undo: bool = typer.Option(False, "--undo", help="take placements again"),
    wait: float = typer.Option(0.0, help="seconds to wait until every agent has left the node"),
) -> None:
    """Drain a node: it takes no new agent and releases each of its agents after their running calls
    (snapshotted first when it has a snapshot store; otherwise their next node starts them empty and
    tells the model). Their next calls go to another node. Exit 1 if --wait ran out."""
    import time

    control = _control()
    with _exit_on_errors():
        entry = control.drain(node, on=not undo)
        if undo:
            print(f"{node}: takes placements again")
            return
        if not entry.get("store"):
            err.print(f"[yellow]warning:[/] {node} has no snapshot store: its agents' homes start empty elsewhere")
        deadline = time.monotonic() + wait
        while entry["agents"] and time.monotonic() < deadline:
            time.sleep(0.5)
            entry = control.nodes()[node]
    print(f"{node}: draining, {entry['agents']} agent(s) still on it")
    if wait and entry["agents"]:
        raise typer.Exit(1)


@app.command()
def schema() -> None:
    """Print the JSON Schema of a turn request."""
    from worker.turn.request import TurnRequest

    print(json.dumps(TurnRequest.model_json_schema(), indent=2))


app.add_typer(token_app, name="token", help="Create, list and revoke the HTTP API's tokens.")
app.add_typer(turns_app, name="turns", help="Find turns: by agent, status and time, newest first.")

if __name__ == "__main__":
    app()
