"""Human-readable transcript of a turn, from its event stream (rich console output).

Shows each model call, each batch of tool calls (a parallel group or a
sequential call), the activity labels before and after every call, repaired
arguments, rejected calls, calls waiting for approval and their decisions, the
model's text as it is written (``model_delta`` events) and the final answer.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from rich.console import Console
from rich.markup import escape

from control.client import ControlPlane

NO_WORKER_HINT_AFTER = 5.0  # seconds a turn may stay queued before the tail says why it may be stuck
FINISHED_EVENT_GRACE = 3.0  # seconds to wait for turn_finished once the status is terminal


def _tail(control: ControlPlane, turn_id: str, timeout: float, console: Console) -> Iterator[dict[str, Any]]:
    last = "0-0"
    started = time.monotonic()
    deadline = started + timeout
    hinted = False
    ended_at = 0.0
    while time.monotonic() < deadline:
        if (
            not hinted
            and time.monotonic() - started > NO_WORKER_HINT_AFTER
            and control.status(turn_id).status.value == "queued"
        ):
            hinted = True
            console.print(
                f"[yellow]no worker has picked up the turn yet[/]: is a worker consuming the "
                f"'turns' queue on {control.display_url}? (REDIS_URL must name the stack's Redis)"
            )
        for eid, event in control.store.events(turn_id, after=last, block_ms=500):
            last = eid
            yield event
            if event["kind"] == "turn_finished":
                return
        if control.status(turn_id).done and not control.store.events(turn_id, after=last):
            # The terminal status is written just before the turn_finished event: give it a moment.
            ended_at = ended_at or time.monotonic()
            if time.monotonic() - ended_at > FINISHED_EVENT_GRACE:
                return


def print_transcript(
    control: ControlPlane,
    turn_id: str,
    console: Console | None = None,
    *,
    follow: bool = True,
    timeout: float = 300.0,
    show_output: bool = True,
) -> dict[str, Any] | None:
    """Print the turn's transcript; with ``follow`` keep tailing until it ends. Returns the final event.

    ``show_output`` prints the first lines of each tool output under its label.
    """
    console = console or Console()
    batches_shown: set[tuple[int, int]] = set()
    planned_by_step: dict[int, list[dict[str, Any]]] = {}
    final = None
    streamed: dict[int, str] = {}  # step -> attempt whose text was printed
    open_line = False
    events = _tail(control, turn_id, timeout, console) if follow else iter(control.events(turn_id))
    for e in events:
        kind = e["kind"]
        if kind == "model_delta":
            if e.get("type") != "text":
                continue
            if streamed.get(e["step"]) != e["attempt"]:
                if open_line:
                    console.print()
                console.print("  [italic]model:[/] ", end="")
                streamed[e["step"]] = e["attempt"]
            console.print(escape(e["delta"]), end="", soft_wrap=True, highlight=False)
            open_line = True
            continue
        if open_line:
            console.print()
            open_line = False
        if kind == "model_stream_broken":
            console.print(f"  [yellow]model stream broke[/]: {escape(str(e.get('error')))}")
        elif kind == "approval_requested":
            console.print(
                f"  [bold yellow]? approval needed[/] wants to run: {escape(e['activity'])}  "
                f"[dim](agent-runtime approve {turn_id} {e['call_id']} | reject {turn_id} {e['call_id']} REASON)[/]"
            )
        elif kind == "approval_decided":
            edited = " with edited arguments" if e.get("edited") else ""
            if e["decision"] == "approved":
                console.print(f"  [green]approved[/] by {escape(str(e['by']))}{edited}: {escape(e['activity'])}")
            else:
                console.print(
                    f"  [red]rejected[/] by {escape(str(e['by']))}: {escape(e['activity'])} "
                    f"({escape(str(e.get('reason')))})"
                )
        elif kind == "turn_started":
            console.print(f"[bold]turn {turn_id}[/] started for agent [cyan]{escape(e.get('agent_id', ''))}[/]")
        elif kind == "model_reply":
            used = e.get("usage") or {}
            tokens = f", {used.get('input_tokens', 0)} in / {used.get('output_tokens', 0)} out tokens" if used else ""
            console.print(
                f"\n[bold magenta]model call {e['step'] + 1}[/] -> {e['calls']} function call(s), "
                f"status {e['status']} ({e['ms']} ms{tokens})"
            )
            if e.get("text") and e["calls"] and e["step"] not in streamed:
                console.print(f"  [italic]model:[/] {escape(e['text'])}")
        elif kind == "call_planned":
            planned_by_step.setdefault(e["step"], []).append(e)
            batch = e.get("batch")
            if batch is None:
                why = "unknown tool" if e.get("error") == "unknown_tool" else "invalid arguments"
                console.print(f"  [red]x rejected[/] {escape(e['name'])}: {why} (error output sent to the model)")
                continue
            key = (e["step"], batch)
            if key not in batches_shown:
                batches_shown.add(key)
                label = "parallel group" if e["mode"] == "parallel" else "sequential (runs alone, in order)"
                console.print(f"  [bold]batch {batch + 1}[/]: {label}")
            repaired = f" [yellow](repaired: {', '.join(e['repairs'])})[/]" if e.get("repairs") else ""
            asks = " [yellow](needs approval)[/]" if e.get("needs_approval") else ""
            console.print(f"    - {escape(e['activity'])}{repaired}{asks}")
        elif kind == "call_completed":
            mark = "[red]failed[/]" if e.get("is_error") else "[green]done[/]"
            console.print(f"    {mark} {escape(e['activity'])} ({e.get('ms')} ms)")
            if show_output and e.get("preview"):
                for line in e["preview"].splitlines()[:6]:
                    console.print(f"        [dim]{escape(line)}[/]")
        elif kind == "repair_instruction":
            console.print(f"  [yellow]repair instruction[/]: the model must call {e.get('tool')}")
        elif kind == "model_retry":
            console.print(f"  [yellow]model call retry in {e.get('in_s')}s[/]: {escape(str(e.get('error')))}")
            streamed.pop(e.get("step", -1), None)
        elif kind == "turn_finished":
            final = e
            status = e.get("status")
            colour = "green" if status == "completed" else "yellow" if status == "terminated" else "red"
            console.print(f"\n[bold {colour}]turn {status}[/]")
            if e.get("error"):
                console.print(f"reason: {escape(str(e['error']))}")
            if e.get("final_output"):
                console.print(f"[bold]final answer:[/] {escape(e['final_output'])}")
            if e.get("usage"):
                u = e["usage"]
                console.print(
                    f"tokens: {u.get('input_tokens', 0)} in ({u.get('cached_tokens', 0)} cached), "
                    f"{u.get('output_tokens', 0)} out ({u.get('reasoning_tokens', 0)} reasoning), "
                    f"{u.get('total_tokens', 0)} total over {u.get('model_calls', 0)} model call(s)"
                )
    return final
