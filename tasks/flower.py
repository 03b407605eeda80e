"""Flower for this app, with its password from the environment and ``/metrics`` behind it.

``python -m tasks.flower [flower options]`` runs ``celery -A tasks.app flower``:

- the credentials come from ``FLOWER_BASIC_AUTH=user:password`` (Flower reads ``FLOWER_*``
  variables as options), never from the command line, where ``ps`` shows them to every user;
  without it Flower does not start (exit 2), since Flower without auth can revoke tasks;
- Flower 2 serves ``/metrics`` without authentication (``flower.views.monitor.Metrics`` has no
  ``@authenticated``): here it asks for the same basic auth as every other page. ``/healthcheck``
  stays open for container health checks (it answers ``OK`` and nothing else).

What Flower shows of a turn: task names ``tasks.turns.turn_step`` / ``tool_call``, their args
column (``argsrepr``: ``read_file agent=alice turn=<id> step=1 call=<call_id>``), and a turn that
ended with a failure status as a FAILURE of the task that ended it (``tasks.turns.TurnFailed``).
"""

from __future__ import annotations

import os
import sys


def protect_metrics() -> None:
    """Require authentication on Flower's ``/metrics`` (Tornado's ``authenticated`` decorator runs
    Flower's own ``get_current_user``, which answers 401 to a missing or wrong basic auth)."""
    import tornado.web
    from flower.views import monitor

    get = monitor.Metrics.get
    if not getattr(get, "_agent_protected", False):
        protected = tornado.web.authenticated(get)
        protected._agent_protected = True  # type: ignore[attr-defined]
        monitor.Metrics.get = protected  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    """Check ``FLOWER_BASIC_AUTH``, protect ``/metrics`` and run Flower with ``argv`` as its options."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a.startswith("--basic-auth") or a.startswith("--basic_auth") for a in argv):
        sys.exit("error: pass the credentials in FLOWER_BASIC_AUTH, not on the command line (ps shows it)")
    auth = os.environ.get("FLOWER_BASIC_AUTH", "")
    if ":" not in auth:
        print("error: set FLOWER_BASIC_AUTH=user:password (Flower never runs without a password)", file=sys.stderr)
        sys.exit(2)
    protect_metrics()
    from celery.bin.celery import main as celery_main

    sys.argv = ["celery", "-A", "tasks.app", "flower", *argv]
    celery_main()


if __name__ == "__main__":
    main()
