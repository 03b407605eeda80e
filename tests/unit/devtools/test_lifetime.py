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
