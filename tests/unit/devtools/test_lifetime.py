"""``devtools.lifetime.stop_on_signals``: a foreground command's one stop. The first SIGINT, SIGTERM
or SIGHUP raises ``KeyboardInterrupt``; a later one (make's, devstack's parent watch's, a second
Ctrl-C) does nothing, so the cleanup it would have cut short runs to its end and the command exits 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

STOPPED_TWICE = textwrap.dedent(
    """
    import os, signal, sys, time
    from devtools.lifetime import stop_on_signals

    stop_on_signals()
    first, later = (getattr(signal, name) for name in sys.argv[1:])
    try:
        os.kill(os.getpid(), first)
        time.sleep(5)
        sys.exit("the first signal did not interrupt")
    except KeyboardInterrupt:
        print("stopping", flush=True)
        for sig in (later, signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # while the cleanup runs
            os.kill(os.getpid(), sig)
        time.sleep(0.2)
        print("stopped", flush=True)
    """
)


@pytest.mark.parametrize(
    ("first", "later"), [("SIGINT", "SIGTERM"), ("SIGTERM", "SIGINT"), ("SIGHUP", "SIGINT"), ("SIGINT", "SIGINT")]
)
def test_the_first_signal_interrupts_and_a_later_one_does_not_cut_the_cleanup_short(first, later):
    run = subprocess.run(
        [sys.executable, "-c", STOPPED_TWICE, first, later],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )
    assert (run.returncode, run.stdout) == (0, "stopping\nstopped\n"), run.stderr


EXITED_EARLY = textwrap.dedent(
    """
    import os, signal, sys, time
    from devtools.lifetime import exit_on_signals

    exit_on_signals()
    sys.modules.pop("json", None)
    sys.meta_path.insert(0, type("Slow", (), {"find_spec": staticmethod(lambda *a: os.kill(os.getpid(), signal.SIGINT))}))
    import json  # the signal lands inside an import, as a Ctrl-C while a command's modules load
    sys.exit("the signal did not stop the command")
    """
)


def _run_script(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a new Python with SIGINT at its default, as in a terminal."""
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_a_signal_before_anything_started_exits_0_quietly_even_inside_an_import():
    run = _run_script(EXITED_EARLY)
    assert (run.returncode, run.stdout, run.stderr) == (0, "", "")


STOPPED_IN_A_FORK_HOOK = textwrap.dedent(
    """
    import os, signal
    from devtools.lifetime import stop_on_signals, stop_requested

    def lands_here():  # as logging's lock release after a fork: Python drops what it raises
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):
            pass

    stop_on_signals()
    os.register_at_fork(after_in_parent=lands_here)
    child = os.fork()
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    print("stop requested" if stop_requested() else "lost", flush=True)
    """
)


def test_a_signal_taken_in_a_fork_hook_is_kept_for_the_command_and_not_printed():
    """A signal that arrives while subprocess forks a child (``preexec_fn``) is taken in the fork's
    Python hooks, where Python drops the exception and prints "Exception ignored": the command
    finds the stop in ``stop_requested`` (devstack checks it while it starts), and nothing is printed."""
    run = _run_script(STOPPED_IN_A_FORK_HOOK)
    assert (run.returncode, run.stdout, run.stderr) == (0, "stop requested\n", "")
