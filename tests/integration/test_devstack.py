"""``make stack`` / ``make run`` (``devtools.devstack``): it stops everything it started on SIGTERM,
on Ctrl-C (exiting 0: make prints no error) and when the process that started it dies, and exits 1
on a failure: a worker that exits at start (reported with its log line), a process that exits later."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.scripts import wait_for


def _marked(mark: str) -> list[int]:
    """Live processes whose environment carries ``mark`` (everything the stack started inherits it)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if mark.encode() in (proc / "environ").read_bytes() and b"Z" not in (proc / "stat").read_bytes().split()[2]:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _env(mark: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "AGENT_OTEL_FILE"}
    return {**env, "STACK_TEST_MARK": mark, **extra}


def _serve(env: dict[str, str], log: Path, parent: bool = False) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "devtools.devstack", "--serve"]
    if parent:  # an intermediate process (like make) that starts the stack and waits for it
        cmd = [sys.executable, "-c", f"import subprocess; subprocess.run({cmd!r})"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)


def _stack_up(proc: subprocess.Popen, log: Path) -> None:
    def up():
        assert proc.poll() is None, log.read_text()[-3000:]
        return "stack is up" in log.read_text()

    wait_for(up, timeout=90, poll=0.3)


def _both_pools_serve_metrics(printed: str) -> None:
    """`make stack` serves metrics: the turns pool on the printed port, the tools pool on the next."""
    import re
    import urllib.request

    found = re.search(
        r"metrics: (http://127\.0\.0\.1:\d+/metrics) \(turns pool\), (http://127\.0\.0\.1:\d+/metrics)", printed
    )
    assert found, printed[-2000:]

    def serving(url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return b"agent_turns_in_flight" in resp.read()
        except OSError:
            return False

    for url in found.groups():
        wait_for(lambda url=url: serving(url), timeout=30, poll=0.5)


def test_sigterm_stops_everything_the_stack_started(tmp_path):
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    proc = _serve(_env(mark), log)
    try:
        _stack_up(proc, log)
        assert len(_marked(mark)) >= 4  # devstack, gateway, worker (and its pool), beat
        wait_for(lambda: "(tools pool)" in log.read_text(), timeout=30, poll=0.3)
        _both_pools_serve_metrics(log.read_text())
        # The commands to copy are whole lines, though the output is a pipe (80 columns to rich).
        printed = log.read_text()
        assert (
            "curl -s -H \"Authorization: Bearer $AGENT_API_TOKEN\" -H 'Content-Type: application/json' \\\n" in printed
        )
        assert '-d \'{"agent_id": "alice", "input": "list my files"}\' $AGENT_API_URL/v1/turns\n' in printed
        # The provider profile in force, and why (no AGENT_MODEL_PROVIDER: the Responses API's own rules).
        assert "model provider profile openai (the default: the OpenAI Responses API's own rules" in printed
        # Snapshots are on: a real S3 server (SeaweedFS) the workers snapshot homes into.
        store = re.search(r"snapshots: s3://homes/snapshots on SeaweedFS at http://127\.0\.0\.1:(\d+)", printed)
        assert store, printed[-2000:]
        with socket.create_connection(("127.0.0.1", int(store.group(1))), timeout=5):
            pass
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        wait_for(lambda: not _marked(mark), timeout=30)
        assert "stopped everything this command started" in log.read_text()
        with pytest.raises(OSError):  # the object store stopped too
            socket.create_connection(("127.0.0.1", int(store.group(1))), timeout=5).close()
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_the_stack_stops_when_the_process_that_started_it_dies(tmp_path):
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    parent = _serve(_env(mark), log, parent=True)
    try:
        wait_for(lambda: "stack is up" in log.read_text(), timeout=90, poll=0.3)
        parent.kill()  # like a make that exits without forwarding the signal
        parent.wait(10)
        wait_for(lambda: not _marked(mark), timeout=60)
        assert "stopped everything this command started" in log.read_text()
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_sigint_sent_to_make_alone_stops_the_stack(tmp_path):
    """GNU make does not forward a SIGINT sent to its PID (it waits for its children, expecting the
    terminal to have signalled the whole group): the stack sees it and stops anyway."""
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"serve:\n\tcd {ROOT} && exec {sys.executable} -m devtools.devstack --serve\n")
    restore = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731  (as in a terminal)
    make = subprocess.Popen(
        ["make", "-s", "-f", str(makefile)],
        env=_env(mark),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        preexec_fn=restore,
    )
    try:
        wait_for(lambda: "stack is up" in log.read_text(), timeout=90, poll=0.3)
        make.send_signal(signal.SIGINT)
        wait_for(lambda: not _marked(mark), timeout=60)
        assert make.wait(30) != 0
        assert "stopped everything this command started" in log.read_text()
    finally:
        if make.poll() is None:
            make.kill()
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("when", ["starting", "up"])
def test_ctrl_c_on_make_stack_stops_it_and_make_reports_no_error(tmp_path, when):
    """The terminal's Ctrl-C reaches make and the stack together (the foreground process group).
    make waits for the recipe and, as GNU make does after a SIGINT, then dies of it itself (the
    shell shows 130, prints nothing); it prints ``*** [Makefile:N: stack] Error 1`` only when the
    recipe exited non-zero, which an asked-for stop used to do (while starting: "interrupted", 1)."""
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    # The Makefile's own recipe, with this venv and nothing to install (no stamp, mcporter "present").
    make = subprocess.Popen(
        ["make", "stack", "STAMP=", f"PY={sys.executable}", f"MCPORTER={sys.executable}"],
        cwd=ROOT,
        env=_env(mark),
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        ready = "model API style" if when == "starting" else "stack is up"  # starting: the workers next

        def printed_ready() -> bool:
            assert make.poll() is None, log.read_text()[-3000:]
            return ready in log.read_text()

        wait_for(printed_ready, timeout=90, poll=0.2)
        if when == "starting":
            assert "stack is up" not in log.read_text()
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C
        assert make.wait(90) == -signal.SIGINT
        wait_for(lambda: not _marked(mark), timeout=30)
        printed = log.read_text()
        assert "stopped everything this command started" in printed
        assert "make: ***" not in printed, printed[-2000:]
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_process_of_the_stack_that_exits_fails_make_stack(tmp_path):
    """A failure is not a stop: the HTTP control plane killed under ``make stack`` stops the rest, exits 1."""
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    proc = _serve(_env(mark), log)
    try:
        _stack_up(proc, log)
        (api,) = [pid for pid in _marked(mark) if b"control.api" in _cmdline(pid)]
        os.kill(api, signal.SIGKILL)
        assert proc.wait(60) == 1
        wait_for(lambda: not _marked(mark), timeout=30)
        printed = log.read_text()
        assert "error: api (code -9) of the stack exited" in printed, printed[-2000:]
        assert "stopped everything this command started" in printed
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_a_worker_that_exits_at_start_is_reported_at_once_with_its_log(tmp_path):
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    proc = _serve(_env(mark, AGENT_EXTRA_TOOLSETS="broken=no_such_module_xyz:tools"), log)
    try:
        assert proc.wait(60) == 1
        out = log.read_text()
        assert "the worker exited at start" in out
        assert "no_such_module_xyz" in out, out[-2000:]  # the worker's own log line
        assert "did not come up" not in out
    finally:
        if proc.poll() is None:
            proc.kill()
        time.sleep(0.5)
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)


def test_make_stack_with_sentinel_follows_a_failover(tmp_path):
    """``make stack SENTINEL=1``: Redis as a primary, a replica and three Sentinels; the stack's
    environment (``var/stack.env``) names the Sentinels; a turn runs, the primary is SIGKILLed, the
    Sentinels promote the replica, the stack starts the killed server again (a replica now), and
    the next turn runs; SIGTERM stops all five servers."""
    dry = subprocess.run(["make", "-n", "stack", "SENTINEL=1"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "devtools.devstack --serve --sentinel" in dry.stdout, dry.stdout + dry.stderr
    mark = uuid.uuid4().hex
    log = tmp_path / "stack.log"
    env = {k: v for k, v in _env(mark).items() if not k.startswith(("REDIS_", "CONTROL_REDIS_", "OPENAI_"))}
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.devstack", "--serve", "--sentinel"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )
    try:
        _stack_up(proc, log)
        printed = log.read_text()
        assert "embedded Redis with Sentinel" in printed, printed
        stack_env = _read_env(ROOT / "var" / "stack.env")
        assert len(stack_env["AGENT_REDIS_SENTINELS"].split(",")) == 3 and stack_env["AGENT_REDIS_SENTINEL_PASSWORD"]
        control = _control_plane(stack_env)
        assert control.wait(control.enqueue({"agent_id": "alice", "input": "list my files"}), 120).done
        servers = _redis_children(proc.pid)
        assert len(servers) == 5, servers  # two servers, three Sentinels
        primary = int(printed.split("primary 127.0.0.1:", 1)[1].split(",", 1)[0])
        killed = next(p for p in servers if f"127.0.0.1:{primary}".encode() in _cmdline(p))
        os.kill(killed, signal.SIGKILL)
        view = wait_for(lambda: _enqueued(control), timeout=60, poll=1)
        assert control.wait(view, 120).status.value == "completed"
        assert f"Redis 127.0.0.1:{primary} exited; started again" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        wait_for(lambda: not [p for p in servers if _cmdline(p)], timeout=30)
    finally:
        servers = _redis_children(proc.pid)  # before the stack goes: then they are no longer its children
        if proc.poll() is None:
            proc.kill()
        for pid in [*_marked(mark), *servers]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _read_env(path: Path) -> dict[str, str]:
    pairs = (line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {name: value.strip("'") for name, value in pairs}


def _control_plane(stack_env: dict[str, str]):
    from control.client import ControlPlane
    from worker.redis_connection import redis_endpoint
    from worker.settings import Settings

    settings = Settings(**{k: v for k, v in stack_env.items() if k.startswith("AGENT_REDIS_")})
    return ControlPlane(redis_endpoint(settings, url=stack_env["CONTROL_REDIS_URL"]))


def _enqueued(control) -> str | None:
    from control.errors import ControlPlaneError

    try:
        return control.enqueue({"agent_id": "alice", "input": "list my files"})
    except ControlPlaneError:  # no primary for a moment
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _redis_children(parent: int) -> list[int]:
    """The redis-server processes ``parent`` started (their environment is not readable: Redis
    writes its process title over it)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == parent:
                if b"redis-server" in _cmdline(int(proc.name)):
                    found.append(int(proc.name))
        except (OSError, ValueError, IndexError):
            continue
    return found
