"""The Redis of ``make run`` and ``make stack`` (``devtools.devstack``): the one ``REDIS_URL`` names,
checked before anything is started against it, or an embedded one started here: a single server
with its append-only file, or (``make stack SENTINEL=1``) a primary, a replica and three Sentinels,
whose servers are started again when they exit, as compose's restart policy would.
"""

from __future__ import annotations

import os
from typing import Callable

from devtools.embedded_redis import EmbeddedRedis
from devtools.embedded_sentinel import EmbeddedSentinelSet

# How the stack's clients reach Redis besides its URLs (written to var/stack.env when set).
REDIS_SETTINGS = (
    "AGENT_REDIS_SENTINELS",
    "AGENT_REDIS_SENTINEL_MASTER",
    "AGENT_REDIS_SENTINEL_PASSWORD",
    "AGENT_REDIS_TLS_CA_FILE",
    "AGENT_REDIS_TLS_CERT_FILE",
    "AGENT_REDIS_TLS_KEY_FILE",
)


def check_redis_url(name: str) -> None:
    """Raise ``RuntimeError`` with one line when the Redis URL in the variable ``name`` is malformed
    or its Redis does not answer (before anything is started against it)."""
    import redis

    from worker.redis_connection import redis_endpoint
    from worker.settings import Settings, redact_text

    try:  # the environment as it is now, with its Sentinels and TLS files
        endpoint = redis_endpoint(Settings(), control=name == "CONTROL_REDIS_URL")
    except ValueError as exc:
        raise RuntimeError(str(exc)) from None
    client = endpoint.client(socket_connect_timeout=3, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"{name}: cannot reach Redis at {endpoint.display}: {redact_text(str(exc))}") from None
    finally:
        client.close()


def start_redis(sentinel: bool, say: Callable[[str], None]) -> EmbeddedRedis | EmbeddedSentinelSet | None:
    """The stack's Redis: ``REDIS_URL``'s when set (checked: ``RuntimeError``), else an embedded one
    (``sentinel``: with a replica and three Sentinels), its settings put in ``os.environ``. Returns
    what was started (None for ``REDIS_URL``'s); ``say`` prints one line about it."""
    from worker.settings import redact_url

    if os.environ.get("REDIS_URL"):
        check_redis_url("REDIS_URL")
        say(f"using REDIS_URL={redact_url(os.environ['REDIS_URL'])}")
        return None
    if sentinel:
        redis_set = EmbeddedSentinelSet()  # every client finds the primary through the Sentinels
        redis_set.start()
        os.environ.update(redis_set.env)
        say(
            f"embedded Redis with Sentinel: primary 127.0.0.1:{redis_set.servers[0].port}, replica "
            f"127.0.0.1:{redis_set.servers[1].port}, Sentinels {redis_set.sentinel_addresses} (master agent; "
            "ACL users worker, control, replica, sentinel)"
        )
        return redis_set
    server = EmbeddedRedis(persist=True)  # a Redis restart keeps every turn
    os.environ["REDIS_URL"] = server.start()
    os.environ["CONTROL_REDIS_URL"] = server.control_url
    say(f"embedded Redis on {redact_url(os.environ['REDIS_URL'])} (ACL users worker and control)")
    return server


def restart_dead(started: EmbeddedRedis | EmbeddedSentinelSet | None, say: Callable[[str], None]) -> None:
    """With Sentinel, start again a Redis server that exited (killed, crashed), as compose restarts
    a container: it rejoins as a replica, and the writes that fence destructive calls and model
    replies are acknowledged again (docs/failover.md)."""
    if isinstance(started, EmbeddedSentinelSet):
        for server in started.restart_dead():
            say(f"[yellow]Redis 127.0.0.1:{server.port} exited; started again (it rejoins as a replica)[/]")
