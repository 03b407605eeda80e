"""``make run``: start what is missing, run a real demo turn, print its transcript, stop everything.

- Redis: ``REDIS_URL`` (+ ``CONTROL_REDIS_URL``) if set, else an embedded ``redis-server``
  (``devtools.embedded_redis``) with fresh ACL passwords. URLs are printed redacted; with
  ``--serve`` they go to ``var/stack.env`` (mode 0600) for other shells to source.
- Model: ``OPENAI_BASE_URL`` (+ ``OPENAI_API_KEY``, ``OPENAI_MODEL``) if set, else the
  scripted gateway playing ``scripts/<demo>.json``.
- Workers: the node's two pools (``devtools.workers``: threads for the queues that wait on
  the model, prefork for ``tools``) and celery beat (redbeat) firing schedules and the
  watchdog sweep, all restarted if they exit.
Everything started here is stopped on exit, also on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import typer
from rich.console import Console

from devtools.workers import Supervisor, beat_command, worker_commands

ROOT = Path(__file__).resolve().parent.parent
STACK_ENV = ROOT / "var" / "stack.env"
# The scripted gateway needs none of these.
SECRETS = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_API_KEY", "AGENT_WEB_SEARCH_KEY")
console = Console()
cli = typer.Typer(add_completion=False, help=__doc__)


class Stack:
    """Processes started for the demo; ``close()`` stops them in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.redis = None
        self.logdir = ROOT / "var" / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        # Workers and beat: restarted if they exit (e.g. a Redis restart they did not survive).
        self.supervisor = Supervisor(self.logdir)

    def spawn(self, name: str, cmd: list[str], drop_env: tuple[str, ...] = ()) -> subprocess.Popen:
        """Start ``cmd`` in its own session with output to ``var/logs/<name>.log``; remembered for ``close``.

        ``drop_env``: variables (secrets) the process does not need and must not get.
        """
        log = open(self.logdir / f"{name}.log", "w")
        env = {k: v for k, v in os.environ.items() if k not in drop_env}
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def close(self) -> None:
        """Stop every started process (SIGTERM to its group, SIGKILL after 20 s), newest first, then the embedded Redis."""
        self.supervisor.stop()
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        if self.redis is not None:
            self.redis.stop()


def _wait_http(url: str, timeout: float = 15) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def _without(*names: str) -> dict[str, str]:
    """This environment minus ``names`` (a process gets only the secrets it uses)."""
    return {k: v for k, v in os.environ.items() if k not in names}


def _wait_worker(timeout: float = 40) -> None:
    """Wait until both pools (``io-*`` and ``tools-*`` nodes) answer a ping."""
    from tasks.app import app

    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        seen |= {name.split("-", 1)[0] for reply in app.control.ping(timeout=0.5) or [] for name in reply}
        if {"io", "tools"} <= seen:
            return
    missing = sorted({"io", "tools"} - seen)
    raise RuntimeError(f"worker pool(s) {missing} did not come up; see var/logs/worker-*.log")


def start_stack(stack: Stack, demo: str) -> None:
    """Start what is missing: embedded Redis (unless ``REDIS_URL``), the scripted gateway (unless
    ``OPENAI_BASE_URL``), the node's two worker pools and beat. Raises ``RuntimeError`` if one does not come up."""
    from devtools.embedded_redis import EmbeddedRedis, free_port
    from worker.settings import redact_url

    if not os.environ.get("REDIS_URL"):
        stack.redis = EmbeddedRedis(persist=True)  # a Redis restart keeps every turn
        os.environ["REDIS_URL"] = stack.redis.start()
        os.environ["CONTROL_REDIS_URL"] = stack.redis.control_url
        console.print(f"embedded Redis on {redact_url(os.environ['REDIS_URL'])} (ACL users worker and control)")
    else:
        console.print(f"using REDIS_URL={redact_url(os.environ['REDIS_URL'])}")
    if not os.environ.get("OPENAI_BASE_URL"):
        port = free_port()
        stack.spawn(
            "gateway",
            [
                sys.executable,
                "-m",
                "worker.model.scripted_gateway",
                "--port",
                str(port),
                "--scripts",
                str(ROOT / "scripts"),
            ],
            drop_env=SECRETS,
        )
        os.environ["OPENAI_BASE_URL"] = f"http://127.0.0.1:{port}/v1"
        os.environ.setdefault("OPENAI_MODEL", demo)
        _wait_http(f"http://127.0.0.1:{port}/health")
        console.print(f"scripted gateway on {os.environ['OPENAI_BASE_URL']} (script {os.environ['OPENAI_MODEL']!r})")
    else:
        console.print(f"model gateway {os.environ['OPENAI_BASE_URL']} (model {os.environ.get('OPENAI_MODEL')})")
    os.environ.setdefault("AGENT_HOMES_ROOT", str(ROOT / "var" / "homes"))
    from worker.settings import get_settings

    get_settings.cache_clear()
    stack.supervisor.on_restart = lambda name, code: console.print(
        f"[yellow]{name} exited (code {code}); restarting it[/] (see var/logs/{name}.log)"
    )
    worker_env = _without("CONTROL_REDIS_URL")
    for name, cmd in worker_commands().items():
        stack.supervisor.start(name, cmd, env=worker_env)
    stack.supervisor.start(
        "beat", beat_command(), env=_without("CONTROL_REDIS_URL", "OPENAI_API_KEY", "AGENT_WEB_SEARCH_KEY")
    )
    _wait_worker()
    console.print("workers up: turns, background, workflow on a threads pool; tools on prefork; beat (redbeat) up\n")


def seed_home(agent_id: str) -> Path:
    """Recreate ``<AGENT_HOMES_ROOT>/<agent_id>`` with the two files the demo script reads; returns the home."""
    home = Path(os.environ["AGENT_HOMES_ROOT"]) / agent_id
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / "notes.md").write_text("# Release notes\n- faster argument repair\n- parallel reads run as a group\n")
    (home / "todo.txt").write_text("write the summary\ncount the lines\n")
    return home


def run_basic_demo() -> bool:
    """Enqueue the demo turn, print its transcript live; True when it completed."""
    from control.client import ControlPlane
    from control.transcript import print_transcript

    control = ControlPlane()
    agent_id = f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    home = seed_home(agent_id)
    console.print(f"agent home: {home}")
    started = time.perf_counter()
    turn_id = control.enqueue(
        {
            "agent_id": agent_id,
            "input": "Read my notes and todo list, write a short summary.md, then count the lines of the three files.",
            "instructions": "You are a careful assistant working in the user's home directory.",
        }
    )
    final = print_transcript(control, turn_id, console)
    wall = time.perf_counter() - started
    console.print(f"\nwall time {wall:.2f} s; items recorded: {len(control.items(turn_id))}")
    return bool(final and final.get("status") == "completed")


def serve(stack: Stack) -> None:
    """Keep the stack up for the CLI and the Python client until Ctrl-C."""
    home = seed_home("alice")  # the README's example agent, with the files the demo script reads
    from devtools.embedded_redis import write_env_file

    names = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_BASE_URL", "OPENAI_MODEL")
    write_env_file(STACK_ENV, {n: os.environ[n] for n in names if os.environ.get(n)})
    console.print(f"\n[bold]stack is up[/] (agent alice's home: {home}); in another shell:\n")
    # The URLs carry Redis passwords: they go to a 0600 file, never to the terminal or a log.
    print(f"  . {STACK_ENV.relative_to(ROOT)}    # REDIS_URL, CONTROL_REDIS_URL, OPENAI_* (mode 0600)", flush=True)
    console.print("  .venv/bin/agent-runtime enqueue 'list my files' --agent alice --wait\n")
    console.print("Ctrl-C stops everything.")
    try:
        while all(p.poll() is None for _, p in stack.procs):  # workers and beat are restarted if they exit
            time.sleep(0.5)
        console.print("[red]the model gateway exited[/]; see var/logs/gateway.log")
    except KeyboardInterrupt:
        pass
    finally:
        STACK_ENV.unlink(missing_ok=True)


@cli.command()
def run(
    demo: str = typer.Option("demo", help="demo to run: demo, workflow, jobs or approval"),
    keep: bool = typer.Option(False, "--serve", help="start the stack and keep it up (no demo)"),
) -> None:
    """Start the stack, run the demo turn, print its transcript, stop everything (or keep it up with --serve)."""

    # Ctrl-C and SIGTERM both stop everything cleanly, also when started in the background
    # (where the shell sets SIGINT to ignored).
    def _interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    stack = Stack()
    ok = False
    try:
        if keep:
            start_stack(stack, demo)
            serve(stack)
            ok = True
            return
        start_stack(stack, {"jobs": "jobs-main", "approval": "demo-approval"}.get(demo, demo))
        if demo == "demo":
            ok = run_basic_demo()
        elif demo == "workflow":
            from control.client import ControlPlane
            from devtools.workflow_demo import run_workflow_demo

            ok = run_workflow_demo(ControlPlane(), console=console)
        elif demo == "jobs":
            from control.client import ControlPlane
            from devtools.jobs_demo import run_schedule_and_job_demo

            ok = run_schedule_and_job_demo(ControlPlane(), console=console)
        elif demo == "approval":
            from control.client import ControlPlane
            from devtools.approval_demo import run_approval_demo

            ok = run_approval_demo(ControlPlane(), console=console, homes_root=Path(os.environ["AGENT_HOMES_ROOT"]))
        else:
            console.print(f"[red]unknown demo {demo!r}[/]: use demo, workflow, jobs or approval")
    except KeyboardInterrupt:
        console.print("interrupted")
    finally:
        stack.close()
        console.print("stopped everything this command started")
    raise typer.Exit(0 if ok else 1)


if __name__ == "__main__":
    cli()
