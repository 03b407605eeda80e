"""Human-readable transcript of a turn, from its event stream (rich console output).

Shows each model call, each batch of tool calls (a parallel group or a
sequential call), the activity labels before and after every call, repaired
arguments, rejected calls, calls waiting for approval and their decisions, the
model's text as it is written (``model_delta`` events) and the final answer.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

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
    printer = _Printer(console, turn_id, show_output)
    events = _tail(control, turn_id, timeout, console) if follow else iter(control.events(turn_id))
    for e in events:
        printer.show(e)
    return printer.final


class _Printer:
    """Prints one turn's events in order; remembers what the following events depend on."""

    def __init__(self, console: Console, turn_id: str, show_output: bool) -> None:
        self.console = console
        self.turn_id = turn_id
        self.show_output = show_output
        self.batches_shown: set[tuple[int, int]] = set()
        self.streamed: dict[int, str] = {}  # step -> attempt whose text was printed
        self.open_line = False  # streamed model text is on the current line
        self.final: dict[str, Any] | None = None
        self._by_kind: dict[str, Callable[[dict[str, Any]], None]] = {
            "model_stream_broken": self._stream_broken,
            "approval_requested": self._approval_requested,
            "approval_decided": self._approval_decided,
            "turn_started": self._turn_started,
            "model_reply": self._model_reply,
            "call_planned": self._call_planned,
            "call_completed": self._call_completed,
            "repair_instruction": self._repair_instruction,
            "model_retry": self._model_retry,
            "turn_finished": self._turn_finished,
        }

    def show(self, e: dict[str, Any]) -> None:
        if e["kind"] == "model_delta":
            self._model_delta(e)
            return
        if self.open_line:
            self.console.print()
            self.open_line = False
        handler = self._by_kind.get(e["kind"])
        if handler is not None:
            handler(e)

    def _model_delta(self, e: dict[str, Any]) -> None:
        if e.get("type") != "text":
            return
        if self.streamed.get(e["step"]) != e["attempt"]:
            if self.open_line:
                self.console.print()
            self.console.print("  [italic]model:[/] ", end="")
            self.streamed[e["step"]] = e["attempt"]
        self.console.print(escape(e["delta"]), end="", soft_wrap=True, highlight=False)
        self.open_line = True

    def _stream_broken(self, e: dict[str, Any]) -> None:
        self.console.print(f"  [yellow]model stream broke[/]: {escape(str(e.get('error')))}")

    def _approval_requested(self, e: dict[str, Any]) -> None:
        turn_id = self.turn_id
        self.console.print(
            f"  [bold yellow]? approval needed[/] wants to run: {escape(e['activity'])}  "
            f"[dim](agent-runtime approve {turn_id} {e['call_id']} | reject {turn_id} {e['call_id']} REASON)[/]"
        )

    def _approval_decided(self, e: dict[str, Any]) -> None:
        edited = " with edited arguments" if e.get("edited") else ""
        if e["decision"] == "approved":
            self.console.print(f"  [green]approved[/] by {escape(str(e['by']))}{edited}: {escape(e['activity'])}")
        else:
            self.console.print(
                f"  [red]rejected[/] by {escape(str(e['by']))}: {escape(e['activity'])} "
                f"({escape(str(e.get('reason')))})"
            )

    def _turn_started(self, e: dict[str, Any]) -> None:
        self.console.print(f"[bold]turn {self.turn_id}[/] started for agent [cyan]{escape(e.get('agent_id', ''))}[/]")

    def _model_reply(self, e: dict[str, Any]) -> None:
        used = e.get("usage") or {}
        tokens = f", {used.get('input_tokens', 0)} in / {used.get('output_tokens', 0)} out tokens" if used else ""
        self.console.print(
            f"\n[bold magenta]model call {e['step'] + 1}[/] -> {e['calls']} function call(s), "
            f"status {e['status']} ({e['ms']} ms{tokens})"
        )
        if e.get("text") and e["calls"] and e["step"] not in self.streamed:
            self.console.print(f"  [italic]model:[/] {escape(e['text'])}")

    def _call_planned(self, e: dict[str, Any]) -> None:
        batch = e.get("batch")
        if batch is None:
            why = "unknown tool" if e.get("error") == "unknown_tool" else "invalid arguments"
            self.console.print(f"  [red]x rejected[/] {escape(e['name'])}: {why} (error output sent to the model)")
            return
        key = (e["step"], batch)
        if key not in self.batches_shown:
            self.batches_shown.add(key)
            label = "parallel group" if e["mode"] == "parallel" else "sequential (runs alone, in order)"
            self.console.print(f"  [bold]batch {batch + 1}[/]: {label}")
        repaired = f" [yellow](repaired: {', '.join(e['repairs'])})[/]" if e.get("repairs") else ""
        asks = " [yellow](needs approval)[/]" if e.get("needs_approval") else ""
        self.console.print(f"    - {escape(e['activity'])}{repaired}{asks}")

    def _call_completed(self, e: dict[str, Any]) -> None:
        mark = "[red]failed[/]" if e.get("is_error") else "[green]done[/]"
        self.console.print(f"    {mark} {escape(e['activity'])} ({e.get('ms')} ms)")
        if self.show_output and e.get("preview"):
            for line in e["preview"].splitlines()[:6]:
                self.console.print(f"        [dim]{escape(line)}[/]")

    def _repair_instruction(self, e: dict[str, Any]) -> None:
        self.console.print(f"  [yellow]repair instruction[/]: the model must call {e.get('tool')}")

    def _model_retry(self, e: dict[str, Any]) -> None:
        self.console.print(f"  [yellow]model call retry in {e.get('in_s')}s[/]: {escape(str(e.get('error')))}")
        self.streamed.pop(e.get("step", -1), None)

    def _turn_finished(self, e: dict[str, Any]) -> None:
        self.final = e
        status = e.get("status")
        colour = "green" if status == "completed" else "yellow" if status == "terminated" else "red"
        self.console.print(f"\n[bold {colour}]turn {status}[/]")
        if e.get("error"):
            self.console.print(f"reason: {escape(str(e['error']))}")
        if e.get("final_output"):
            self.console.print(f"[bold]final answer:[/] {escape(e['final_output'])}")
        if e.get("usage"):
            u = e["usage"]
            self.console.print(
                f"tokens: {u.get('input_tokens', 0)} in ({u.get('cached_tokens', 0)} cached), "
                f"{u.get('output_tokens', 0)} out ({u.get('reasoning_tokens', 0)} reasoning), "
                f"{u.get('total_tokens', 0)} total over {u.get('model_calls', 0)} model call(s)"
            )
