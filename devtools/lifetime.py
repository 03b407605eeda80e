"""A child process's lifetime tied to the process that started it.

The project's services (embedded Redis and Sentinels, Celery workers, the object store, a model
server) run in sessions of their own, so a Ctrl-C meant for the command that started them does not
stop them before their clients. A starter that is killed outright (SIGKILL, or a SIGTERM it does not
handle) would then leave them running with parent 1. ``die_with_parent`` is the ``preexec_fn`` that
prevents that: the kernel sends the child ``SIGTERM`` when its starter goes
(``prctl(PR_SET_PDEATHSIG)``, Linux).

The kernel sends that signal when the *thread* that forked the child exits, not the process
(prctl(2)). A child started from any thread but the main one is therefore not tied (``preexec``
answers None): a helper thread that ends would otherwise stop a service its process still uses.

``stop_on_signals``: the starter's own side, its one stop on Ctrl-C, SIGTERM or a closed terminal.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` for ``subprocess.Popen`` that ties the child to this process: a callable
    on Linux when called from the main thread, else None (nothing is tied; see the module's note)."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it
    starter = os.getpid()

    def die_with_parent() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != starter:  # the starter died between fork and prctl: nobody will signal
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def stop_on_signals() -> None:
    """Make the first SIGINT, SIGTERM or SIGHUP raise ``KeyboardInterrupt`` in the main thread, and
    every later one do nothing: a foreground command's one stop (Ctrl-C, a closed terminal, a kill).

    A second signal used to raise again while the first's cleanup ran (a Ctrl-C reaches make too,
    and devstack's parent watch then sends SIGTERM): cut short, the stop exited 1 with a traceback
    and make printed ``Error 1`` although the user only asked it to stop. Call from the main thread
    (``signal.signal`` raises ``ValueError`` elsewhere); also when started in the background, where
    the shell set SIGINT to ignored.
    """

    def _stop(signum: int, frame: object) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        raise KeyboardInterrupt

    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)
