"""``agent-runtime turns``: find turns again (``ControlPlane.list_turns``, the same listing as the
HTTP API's ``GET /v1/turns``).

Reads ``CONTROL_REDIS_URL`` (else ``REDIS_URL``). Errors are one line with exit 2 (a bad status,
time or cursor, Redis unreachable).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import typer
from rich.console import Console
from rich.markup import escape

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
console = Console()
err = Console(stderr=True, soft_wrap=True)


def parse_time(value: str | None, option: str) -> float | None:
    """``value`` as epoch seconds: a number, or an ISO 8601 time (UTC when it names no zone).
    Exits 2 for anything else."""
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        err.print(f"[red]error:[/] {option}: {escape(value)!r} is neither epoch seconds nor an ISO 8601 time")
        raise typer.Exit(2) from None
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).timestamp()


@app.command("list")
def list_cmd(
    agent: list[str] = typer.Option(None, "--agent", help="only this agent's turns (repeatable)"),
    status: list[str] = typer.Option(None, "--status", help="only turns in this status (repeatable)"),
    since: str = typer.Option(None, help="only turns created after this time (epoch seconds or ISO 8601)"),
    until: str = typer.Option(None, help="only turns created before this time (epoch seconds or ISO 8601)"),
    limit: int = typer.Option(20, help="turns per page (1-200)"),
    cursor: str = typer.Option(None, help="continue after a previous page (its printed next cursor)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per turn"),
) -> None:
    """List turns, newest first; the cursor of the next page, if any, goes to stderr."""
    from control.client import ControlPlane
    from control.errors import ControlPlaneError

    after, before = parse_time(since, "--since"), parse_time(until, "--until")
    try:
        turns, next_cursor = ControlPlane().list_turns(
            agents=agent or None,
            statuses=status or None,
            created_after=after,
            created_before=before,
            cursor=cursor,
            limit=limit,
        )
    except ControlPlaneError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    for t in turns:
        if as_json:
            row = {k: getattr(t, k) for k in ("turn_id", "agent_id", "step", "model_calls", "title")}
            row.update(status=t.status.value, created_at=t.created_at, updated_at=t.updated_at, error=t.error)
            print(json.dumps(row))
        else:
            created = datetime.fromtimestamp(t.created_at, timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
            console.print(
                f"{t.turn_id}  {escape(t.agent_id)}  {t.status.value:<17} {created}  {escape(t.title[:60])}",
                highlight=False,
                soft_wrap=True,
            )
    if next_cursor:
        err.print(f"next page: --cursor {next_cursor}", highlight=False)
