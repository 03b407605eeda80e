"""The approval and streaming demo (``make run DEMO=approval``): ``run_approval_demo``.

The scripted model (``scripts/demo-approval.json``) lists ``build/`` (an allowlisted read-only
command: it runs at once), then wants ``rm -rf build/`` and ``rm -f notes.md`` (both need a
person). The demo prints the pending approvals, approves the first, rejects the second with a
reason, and the transcript shows the model's reaction written as it streams.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from control.client import ControlPlane

DEMO_MODEL = "demo-approval"
REJECT_REASON = "notes.md is the only copy of the release notes; keep it"


def seed_home(home: Path) -> None:
    """A home with ``notes.md`` and a ``build/`` folder to clean."""
    (home / "build").mkdir(parents=True, exist_ok=True)
    (home / "build" / "app.bin").write_bytes(b"\0" * 64)
    (home / "build" / "app.map").write_text("symbols\n")
    (home / "notes.md").write_text("# Release notes\n- approvals\n- streaming\n")


def _decide(control: ControlPlane, turn_id: str, console: Console, done: threading.Event, errors: list[str]) -> None:
    try:
        deadline = time.monotonic() + 60
        pending: list[dict[str, Any]] = []
        while time.monotonic() < deadline and len(pending) < 2:
            pending = control.pending_approvals(turn_id=turn_id)
            time.sleep(0.2)
        if len(pending) < 2:
            errors.append(f"expected two calls waiting for approval, found {len(pending)}")
            return
        time.sleep(1.0)  # the turn sits parked: no task runs, no worker slot is held
        console.print("\n[bold]pending approvals[/] (agent-runtime approvals):")
        for rec in pending:
            console.print(f"  {rec['call_id']}  {rec['name']}  wants to run: {rec['activity']}", markup=False)
        rm_build = next(p for p in pending if "build" in p["arguments"].get("command", ""))
        rm_notes = next(p for p in pending if "notes.md" in p["arguments"].get("command", ""))
        control.approve(turn_id, rm_build["call_id"], by="demo-operator")
        console.print(f"  approve {rm_build['call_id']} (by demo-operator)", markup=False)
        control.reject(turn_id, rm_notes["call_id"], REJECT_REASON, by="demo-operator")
        console.print(f"  reject  {rm_notes['call_id']}: {REJECT_REASON}\n", markup=False)
    except Exception as exc:  # reported by the demo, never a hung thread
        errors.append(f"{exc.__class__.__name__}: {exc}")
    finally:
        done.set()


def run_approval_demo(
    control: ControlPlane, *, console: Console, homes_root: Path, agent_id: str | None = None, model: str | None = None
) -> bool:
    """Run the demo against a running stack; True when the turn completed, ``build/`` is gone and
    ``notes.md`` is still there. ``model`` defaults to the workers' ``OPENAI_MODEL`` (``make run``
    sets it to ``demo-approval``, the script's name)."""
    from control.transcript import print_transcript

    agent_id = agent_id or f"approval-{time.strftime('%Y%m%d-%H%M%S')}"
    home = homes_root / agent_id
    seed_home(home)
    console.print(f"agent home: {home} (build/ and notes.md)")
    turn_id = control.enqueue(
        {
            "agent_id": agent_id,
            "input": "Clean up my build output and anything I no longer need.",
            "approval": {"mode": "declared"},
            **({"model": model} if model else {}),
        }
    )
    done, errors = threading.Event(), list[str]()
    decider = threading.Thread(target=_decide, args=(control, turn_id, console, done, errors), daemon=True)
    decider.start()
    final = print_transcript(control, turn_id, console, timeout=120)
    done.wait(5)
    for e in errors:
        console.print(f"[red]demo error:[/] {e}")
    ok = bool(final and final.get("status") == "completed") and not errors
    ok = ok and not (home / "build").exists() and (home / "notes.md").exists()
    console.print(f"\nbuild/ removed: {not (home / 'build').exists()}; notes.md kept: {(home / 'notes.md').exists()}")
    return ok
