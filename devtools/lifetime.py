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

``stop_on_signals``: the starter's own side, its one stop on Ctrl-C, SIGTERM or a closed terminal;
``exit_on_signals``: the same before it has started anything (a quiet exit, no traceback);
``stop_requested``: whether one came, for a command to check where the exception may be lost.
"""

from __future__ import annotations

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
    import ctypes  # here, not at the top: devstack imports this module first, before a Ctrl-C is handled

    libc = ctypes.CDLL(None, use_errno=True)  # loaded here: the child only calls it
    starter = os.getpid()

    def die_with_parent() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != starter:  # the starter died between fork and prctl: nobody will signal
            os.kill(os.getpid(), signal.SIGTERM)

    return die_with_parent


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """What ``stop_on_signals`` raises: a ``KeyboardInterrupt`` (``except KeyboardInterrupt`` takes
    it) of a type of its own. CPython makes a process exit by SIGINT (status 130, -2 to its parent)
    once a plain ``KeyboardInterrupt`` has come out of code it ran from a string (``PyRun_String``,
    as a C or Rust library's callback does), even when the command caught it afterwards; its check
    is of the exact type, so a ``Stopped`` caught and handled ends the process with the status the
    command chose."""


def stop_on_signals() -> None:
    """Make the first SIGINT, SIGTERM or SIGHUP raise ``Stopped`` (a ``KeyboardInterrupt``) in the main thread, and
    every later one do nothing: a foreground command's one stop (Ctrl-C, a closed terminal, a kill).

    A second signal used to raise again while the first's cleanup ran (a Ctrl-C reaches make too,
    and devstack's parent watch then sends SIGTERM): cut short, the stop exited 1 with a traceback
    and make printed ``Error 1`` although the user only asked it to stop. Call from the main thread
    (``signal.signal`` raises ``ValueError`` elsewhere); also when started in the background, where
    the shell set SIGINT to ignored.
    """
    _on_first_signal(Stopped)


def exit_on_signals(code: int = 0) -> None:
    """Until a command has started anything (while its modules load, a second when the disk is
    cold): make the first SIGINT, SIGTERM or SIGHUP exit with ``code``, quietly, and every later one
    do nothing. The signal raises ``SystemExit``, which Python and click let through without a
    traceback wherever it lands (inside an ``import`` too), where the default ``KeyboardInterrupt``
    printed one. ``stop_on_signals`` takes over once there is something to stop. Main thread only.
    """
    _on_first_signal(lambda: SystemExit(code))


def stop_requested() -> bool:
    """True once a signal of ``stop_on_signals`` or ``exit_on_signals`` arrived. The command's own
    checks: what the signal raised may have been lost, or turned into another exception (see
    ``_on_first_signal``)."""
    return _requested is not None


_requested: int | None = None  # the stop signal that arrived


def check_stop() -> None:
    """Raise ``Stopped`` if a stop signal came whose own exception was lost (``stop_requested``):
    for a command's long steps, such as waiting for what it started to come up."""
    if _requested is not None:
        raise Stopped


def _on_first_signal(raised: Callable[[], BaseException]) -> None:
    """The first of ``STOP_SIGNALS`` raises ``raised()`` in the main thread and is remembered
    (``stop_requested``); every later one is ignored.

    Where the signal lands decides what becomes of the exception: while ``subprocess`` forks a
    child with a ``preexec_fn`` (``preexec``) it is taken in the fork's Python hooks (``logging``'s
    lock release), where Python drops it (printed as "Exception ignored"); in a callback of a C or
    Rust library (pydantic-core building a schema) it comes out as that library's error. Such a
    stop is kept only in ``stop_requested``, which the command checks; the drop is not printed."""

    def _stop(signum: int, frame: object) -> None:
        global _requested
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        _requested = signum
        stop = raised()
        stop.stop_signal = signum  # type: ignore[attr-defined]  # what _quiet_drop looks for
        raise stop

    if sys.unraisablehook is not _quiet_drop:
        global _unraisable_before
        _unraisable_before = sys.unraisablehook
        sys.unraisablehook = _quiet_drop
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop)


_unraisable_before = sys.unraisablehook


def _quiet_drop(unraisable: sys.UnraisableHookArgs) -> None:
    """``sys.unraisablehook``: a stop of ``_on_first_signal`` that Python dropped is not printed
    (``stop_requested`` keeps it); any other exception goes to the hook before."""
    if getattr(unraisable.exc_value, "stop_signal", None) is None:
        _unraisable_before(unraisable)
