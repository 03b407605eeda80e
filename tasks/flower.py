"""Flower with authentication on every route: ``python -m tasks.flower [flower options]``.

Flower 2.x leaves ``/metrics`` and ``/healthcheck`` open even when basic auth is on (their
handlers lack ``@web.authenticated``; flower#1342), and metrics name tasks, queues and
workers. This entry point wraps those handlers with ``tornado.web.authenticated`` before
starting ``celery -A tasks.app flower``. Credentials come from the environment
(``FLOWER_BASIC_AUTH=user:password``, read by Flower itself), never from the command line,
where ``ps`` and ``docker inspect`` would show them; without them Flower does not start.
Only static assets (JavaScript, CSS) stay public.
"""

from __future__ import annotations

import os
import sys

# The task list's columns: Flower's default hides ``args``, which carries each task's label
# (``tool agent= turn= step= call=``, tasks.dispatcher).
TASKS_COLUMNS = "name,uuid,state,args,received,started,runtime,worker"


def protect_open_routes() -> list[str]:
    """Require authentication on Flower's handlers that lack it. Returns their names. Idempotent."""
    import tornado.web
    from flower.views import monitor

    wrapped = []
    for handler in (monitor.Metrics, monitor.Healthcheck):
        if not getattr(handler.get, "_requires_auth", False):
            handler.get = tornado.web.authenticated(handler.get)
            handler.get._requires_auth = True
            wrapped.append(handler.__name__)
    return wrapped


def broker_page_through_the_endpoint() -> None:
    """Have Flower's broker page (queue lengths) reach Redis as the broker does. Flower picks its
    client by the broker URI's scheme, and the app's explicit transport (``tasks.broker:Transport``)
    made that ``tasks.broker``, which it does not know ("'redis' broker is not supported"). The URI
    is now the endpoint's (``redis``, ``rediss``, or ``sentinel``: Flower's Sentinel client takes
    one Sentinel's URL and asks it for the primary); Flower adds the transport options (the
    primary's name, how to talk to the Sentinels) and ``broker_use_ssl`` itself."""
    from flower.app import Flower

    from worker.redis_connection import redis_endpoint

    Flower.broker_uri_with_password = property(lambda self: redis_endpoint().celery_url().split(";")[0])


def main(argv: list[str] | None = None) -> None:
    """Start Flower for ``tasks.app`` with every route authenticated. Exits with an error
    when ``FLOWER_BASIC_AUTH`` is not set."""
    if not os.environ.get("FLOWER_BASIC_AUTH"):
        sys.exit("FLOWER_BASIC_AUTH=user:password must be set in the environment (never on the command line)")
    protect_open_routes()
    broker_page_through_the_endpoint()
    from celery.bin.celery import main as celery_main

    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a.startswith("--tasks_columns") for a in args):
        args.append(f"--tasks_columns={TASKS_COLUMNS}")
    sys.argv = ["celery", "-A", "tasks.app", "flower", *args]
    celery_main()


if __name__ == "__main__":
    main()
