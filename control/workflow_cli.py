"""``python -m control.workflow_cli``: workflow tasks and Brain pages from the shell.

Talks to the Redis of ``CONTROL_REDIS_URL`` (else ``REDIS_URL``), like ``agent-runtime``.
Exit codes: 0 success; 1 ``start --wait`` / ``wait`` saw the task end without succeeding; 2 bad
input, an unknown task, an operation the task's state refuses (cancelling a finished task,
retrying a running one), or Redis unreachable: one line on stderr, no traceback.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

import orjson
import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:  # imported where used: the CLI starts without them
    from control.workflow import WorkflowClient

app = typer.Typer(add_completion=False, help=__doc__, no_args_is_help=True)
err = Console(stderr=True, soft_wrap=True)  # an error is one line, however long


def _fail(message: str) -> NoReturn:
    err.print(f"[red]error:[/] {escape(message)}")
    raise typer.Exit(2)


@contextmanager
def _exit_on_errors() -> Iterator[None]:
    """Every expected failure as one line and exit 2: the control plane's, the records' rules, Redis."""
    import redis

    from control.errors import ControlPlaneError
    from worker.records.brain import BrainError
    from worker.records.result_schema import WorkflowError
    from worker.settings import redact_text

    try:
        yield
    except (ControlPlaneError, WorkflowError, BrainError) as exc:
        _fail(str(exc))
    except redis.RedisError as exc:  # Redis went away after the first ping
        _fail(f"Redis error: {redact_text(str(exc))}")


def _client() -> WorkflowClient:
    from control.client import ControlPlane
    from control.workflow import WorkflowClient

    with _exit_on_errors():
        return WorkflowClient(ControlPlane())


def _print(value: object) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read {what} from {path}: {exc}")


def _schema(value: str) -> dict[str, Any]:
    """The result schema: a JSON object given inline, or ``@path`` to a file holding one."""
    raw = _read_text(Path(value[1:]), "the result schema") if value.startswith("@") else value
    try:
        schema = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        _fail(f"--schema is not JSON: {exc}")
    if not isinstance(schema, dict):
        _fail("--schema must be a JSON object (a JSON Schema)")
    return schema


def _wait_and_print(client: WorkflowClient, task_id: str, timeout: float) -> NoReturn:
    with _exit_on_errors():
        task = client.wait(task_id, timeout=timeout)
    _print(task.view())
    raise typer.Exit(0 if task.status == "succeeded" else 1)


@app.command()
def start(
    title: str = typer.Option(..., help="what the task is, in a few words"),
    instructions: str = typer.Option(None, help="what to do and how to submit it (or --instructions-file)"),
    instructions_file: Path = typer.Option(None, "--instructions-file", help="read the instructions from a file"),
    schema: str = typer.Option(..., help="the result's JSON Schema: a JSON object, or @file"),
    agent: str = typer.Option("agent", help="agent id"),
    use_brain: bool = typer.Option(False, "--use-brain", help="offer Brain recall and get_page"),
    model: str = typer.Option(None, help="model name (default: OPENAI_MODEL)"),
    task_id: str = typer.Option(None, "--task-id", help="choose the task id (default: generated)"),
    max_model_calls: int = typer.Option(None, "--max-model-calls", min=1, help="cap per attempt"),
    wait: bool = typer.Option(False, help="wait for the task to end and print it (exit 1 unless it succeeded)"),
    timeout: float = typer.Option(120.0, help="with --wait: seconds"),
) -> None:
    """Start a workflow task (attempt 1 runs as a turn on the workflow queue); print it as JSON."""
    if (instructions is None) == (instructions_file is None):
        _fail("give --instructions or --instructions-file, not both and not neither")
    text = instructions if instructions is not None else _read_text(instructions_file, "the instructions")
    result_schema = _schema(schema)
    client = _client()
    with _exit_on_errors():
        task = client.start_workflow_task(
            agent_id=agent,
            title=title,
            instructions=text,
            result_schema=result_schema,
            use_brain=use_brain,
            model=model,
            task_id=task_id,
            max_model_calls=max_model_calls,
        )
    if wait:
        _wait_and_print(client, task.task_id, timeout)
    _print(task.view())


@app.command()
def show(task_id: str) -> None:
    """Print a task with its attempts and result schema as JSON."""
    client = _client()
    with _exit_on_errors():
        _print(client.show(task_id).view(with_schema=True))


@app.command("list")
def list_cmd(agent: str = typer.Option("agent", help="agent id")) -> None:
    """Print an agent's tasks, newest first, as JSON."""
    client = _client()
    with _exit_on_errors():
        _print([t.view() for t in client.list(agent)])


@app.command("wait")
def wait_cmd(task_id: str, timeout: float = typer.Option(120.0, help="seconds")) -> None:
    """Wait until a task succeeds, fails or is cancelled; print it (exit 1 unless it succeeded)."""
    client = _client()
    with _exit_on_errors():
        client.show(task_id)  # an unknown task is exit 2, not a wait
    _wait_and_print(client, task_id, timeout)


@app.command()
def retry(task_id: str) -> None:
    """Start a new attempt (a fresh conversation) of a failed or cancelled task; print it."""
    client = _client()
    with _exit_on_errors():
        _print(client.retry(task_id).view(with_schema=True))


@app.command()
def cancel(task_id: str) -> None:
    """Cancel a queued or running task and stop its attempt's turn; print it."""
    client = _client()
    with _exit_on_errors():
        _print(client.cancel(task_id).view(with_schema=True))


@app.command("brain-add")
def brain_add(
    title: str = typer.Option(..., help="the page's title"),
    file: Path = typer.Option(None, help="the page's text, from a file"),
    text: str = typer.Option(None, help="the page's text"),
    agent: str = typer.Option("agent", help="agent id"),
    page_id: str = typer.Option(None, "--id", help="replace this page (default: a new id)"),
) -> None:
    """Create or replace a Brain page of an agent; print its id, title and size."""
    if (file is None) == (text is None):
        _fail("give --file or --text, not both and not neither")
    body = text if text is not None else _read_text(file, "the page")
    client = _client()
    with _exit_on_errors():
        page = client.add_brain_page(agent, title, body, page_id)
    sys.stdout.write(orjson.dumps({"id": page.id, "title": page.title, "chars": len(page.text)}).decode() + "\n")


def main() -> None:
    """CLI entry point: exits 0, 1 or 2 (see the module docstring; click's usage errors are 2 too)."""
    app(prog_name="python -m control.workflow_cli")


if __name__ == "__main__":
    main()
