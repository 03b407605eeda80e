"""``agent-runtime token``: create, list and revoke the HTTP API's tokens (``control.api.tokens``).

Reads ``CONTROL_REDIS_URL`` (else ``REDIS_URL``) like the API. A new token is printed once, on
stdout alone (for ``TOKEN=$(agent-runtime token create ...)``); only its hash is stored.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import redis
import typer
from rich.console import Console

if TYPE_CHECKING:
    from control.api.tokens import TokenStore

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)


def _store() -> TokenStore:
    from control.api.app import redis_url
    from control.api.tokens import TokenStore, sync_client

    try:
        endpoint = redis_url()
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    try:
        client = sync_client(endpoint)
        client.ping()
    except redis.RedisError as exc:
        err.print(f"[red]error:[/] cannot reach Redis at {endpoint.display}: {exc}")
        raise typer.Exit(2) from exc
    return TokenStore(client)


@app.command()
def create(
    name: str = typer.Argument(..., help="who or what uses the token (shown in listings and decisions)"),
    agent: list[str] = typer.Option(None, "--agent", help="an agent the token covers (repeatable)"),
    all_agents: bool = typer.Option(False, "--all-agents", help="cover every agent (operators)"),
    rate: float = typer.Option(None, help="requests per second (default: AGENT_API_RATE)"),
    burst: int = typer.Option(None, help="burst of requests (default: AGENT_API_BURST)"),
    may_lower_approval: bool = typer.Option(
        False,
        "--may-lower-approval",
        help="its turn requests may ask for less approval than AGENT_APPROVAL_MODE (e.g. mode off)",
    ),
) -> None:
    """Create a token for some agents (--agent, repeatable) or for all (--all-agents); print it once."""
    if bool(agent) == all_agents:
        err.print("[red]error:[/] give --agent (one or more) or --all-agents, not both and not neither")
        raise typer.Exit(2)
    store = _store()
    try:
        clear, tok = store.create(
            name, None if all_agents else list(agent), rate=rate, burst=burst, lower_approval=may_lower_approval
        )
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    scope = "all agents" if tok.agents is None else ", ".join(sorted(tok.agents))
    grant = "; may lower approvals below AGENT_APPROVAL_MODE" if tok.lower_approval else ""
    err.print(f"token {tok.id} ({tok.name}) for {scope}{grant}; shown once, store it now:")
    print(clear)


@app.command("list")
def list_cmd() -> None:
    """List tokens (id, name, agents, limits) as JSON lines; never the tokens themselves."""
    for tok in _store().list():
        print(json.dumps(tok.public()))


@app.command()
def revoke(token_id: str = typer.Argument(..., help="the token's id (from `token list`)")) -> None:
    """Revoke a token: its next request is refused."""
    if not _store().revoke(token_id):
        err.print(f"[red]error:[/] no token with id {token_id}")
        raise typer.Exit(2)
    print(f"revoked {token_id}")
