"""The turns of ``make deploy-check``: enqueued and waited for through the CLIs inside the ``api``
container (the control plane, which reaches Redis through the Sentinels), and the agents' homes read
inside the tools containers."""

from __future__ import annotations

import json
from typing import Any

from devtools.deploy_stack import TURN_TIMEOUT, CheckFailed, Deployment, cli, containers, podman


def enqueue(dep: Deployment, text: str, agent: str, model: str, *extra: str) -> str:
    out: str = cli(dep, "enqueue", text, "--agent", agent, "--model", model, *extra).stdout
    return out.strip()


def wait_turn(dep: Deployment, turn_id: str, timeout: float = TURN_TIMEOUT) -> dict[str, Any]:
    run = cli(dep, "wait", turn_id, "--timeout", str(timeout), check=False, timeout=timeout + 30)
    if run.returncode != 0:
        raise CheckFailed(f"turn {turn_id} did not complete: {(run.stdout or run.stderr).strip()[:400]}")
    status: dict[str, Any] = json.loads(run.stdout)
    return status


def tool_outputs(dep: Deployment, turn_id: str) -> list[str]:
    items = [json.loads(line) for line in cli(dep, "items", turn_id).stdout.splitlines() if line.strip()]
    return [str(i.get("output", "")) for i in items if i.get("type") == "function_call_output"]


def run_turn(dep: Deployment, agent: str, model: str, text: str = "go") -> tuple[str, list[str]]:
    """One turn of ``model`` (a script of ``scripts/``) for ``agent``, waited for; its tool outputs."""
    turn = enqueue(dep, text, agent, model, "--approval", "off")
    wait_turn(dep, turn)
    return turn, tool_outputs(dep, turn)


def tools_containers() -> list[str]:
    return sorted(n for n, c in containers().items() if c["service"] == "worker-tools" and c["state"] == "running")


def home_file(agent: str, path: str) -> str | None:
    """The content of ``path`` in ``agent``'s home, read inside the tools containers (each home is an
    image mounted in its node's container), or None where no node has it."""
    for name in tools_containers():
        run = podman("exec", name, "sh", "-c", 'cat /homes/node-*/"$0"/"$1" 2>/dev/null', agent, path, check=False)
        if run.returncode == 0:
            return run.stdout
    return None
