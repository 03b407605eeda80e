"""A Ctrl-C in the first moments of ``make stack`` (``python -m devtools.devstack --serve``): while its
modules load, while it checks its settings, while the embedded Redis and the scripted gateway start.
It exits 0 as a later Ctrl-C does, prints no traceback (nor click's ``Aborted!``, nor Python's
"Exception ignored" for a stop taken in a fork's hooks), and leaves nothing running: not in its
process group, not among what it started in sessions of their own. Each place the signal can land
failed once in a stress run before its fix (``devtools.lifetime``): an import (a traceback), a fork's
hooks (the stop lost, the stack started in full), a pydantic-core callback (a ``SchemaError``), a
library's ``PyRun_String`` (exit by SIGINT after a clean stop), a half-loaded package at cleanup.

The signal is timed from a point of the stack's start-up, not of the test's clock (a loaded machine
would shift it): ``-X importtime`` reports each module loaded, and ``rich.console`` is loaded among
the devstack module's own imports, which a Ctrl-C interrupted with a traceback. Python's own start-up
before any of the project's code runs (its ``site`` module, a few hundredths of a second) cannot be
helped and is not tested.

The stack's own Redis is started here (``REDIS_URL`` unset, as ``make stack`` runs), in this test's
temporary directory, and stopped by the stack itself; anything left is killed after the test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.scripts import wait_for

# Settings of the test run the stack must not take: it starts its own Redis and model gateway.
NOT_PASSED = (
    "REDIS_URL",
    "CONTROL_REDIS_URL",
    "OPENAI_BASE_URL",
    "OPENAI_API_KEY",
    "OPENAI_MODEL",
    "AGENT_SNAPSHOT_STORE",
    "AGENT_METRICS_PORT",
    "AGENT_OTEL_FILE",
)
LOADING = "| rich.console"  # the end of -X importtime's line once devstack's imports loaded it


def _left(group: int, mark: str, tmp_path: Path) -> list[int]:
    """Live processes of process group ``group``, or started by the stack: with ``mark`` in their
    environment, or ``tmp_path`` on their command line (the object store gets an environment of
    its own; its data directory, like Redis's, is under ``TMPDIR``)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if b"Z" in (proc / "stat").read_bytes().rsplit(b")", 1)[1].split()[:1]:
                continue  # a zombie: exited, not yet reaped
            if (
                os.getpgid(int(proc.name)) == group
                or mark.encode() in (proc / "environ").read_bytes()
                or str(tmp_path).encode() in (proc / "cmdline").read_bytes()
            ):
                pids.append(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
    return pids


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.0, 0.05, 0.1, 0.15, 0.2, 0.3])
def test_an_early_ctrl_c_stops_the_stack_quietly_and_exits_0(tmp_path, after):
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED and not k.startswith("OTEL_")}
    env.update({"STACK_TEST_MARK": mark, "TMPDIR": str(tmp_path), "AGENT_HOMES_ROOT": str(tmp_path / "homes")})
    out = tmp_path / "stdout"
    stack = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "devtools.devstack", "--serve"],
        cwd=ROOT,
        env=env,
        stdout=open(out, "w"),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    errors: list[str] = []  # stderr but -X importtime's lines
    loading = threading.Event()

    def read_stderr() -> None:
        assert stack.stderr is not None
        for line in stack.stderr:
            if line.startswith("import time:"):
                if line.rstrip().endswith(LOADING):
                    loading.set()
            else:
                errors.append(line)
        loading.set()  # it exited: the wait below ends, and the test says how

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert loading.wait(30) and stack.poll() is None, f"devstack exited before loading rich: {errors}"
        time.sleep(after)
        os.killpg(stack.pid, signal.SIGINT)  # Ctrl-C
        code = stack.wait(60)
        reader.join(10)
        printed = f"stdout:\n{out.read_text()}\nstderr:\n{''.join(errors)}"
        assert code == 0, printed
        for sign in ("Traceback", "KeyboardInterrupt", "Aborted", "Exception ignored"):
            assert sign not in "".join(errors), printed
        wait_for(lambda: not _left(stack.pid, mark, tmp_path), timeout=15)
    finally:
        if stack.poll() is None:
            os.killpg(stack.pid, signal.SIGKILL)
            stack.wait()
        for pid in _left(stack.pid, mark, tmp_path):
            os.kill(pid, signal.SIGKILL)
