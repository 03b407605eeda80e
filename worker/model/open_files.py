"""How many model connections a process may open: one file descriptor each, within its open-files limit.

A node holding ten thousand model calls in flight holds ten thousand sockets. The soft limit on
open files (``RLIMIT_NOFILE``) is often 1,024 (systemd's default for services, many shells'),
while the hard limit is far higher; a process past its soft limit fails every new socket with
``EMFILE`` ("Too many open files"): the model call fails (and is retried, each retry failing the
same way while the others hold their sockets), and so does anything else that opens a file or a
Redis connection meanwhile. So the asynchronous client's pool is sized by ``connection_cap``:
the soft limit is raised toward what the pool wants (up to the hard limit, which an unprivileged
process may do), and the pool gets what is left after ``RESERVE`` descriptors for everything
else. A call beyond the cap waits for a connection of the pool (bounded by the call's deadline),
never for a descriptor.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("agent.model")

RESERVE = 1024
"""Descriptors kept for the rest of the process: its Redis connections (ours and the broker's),
the metrics server, logs, a tool's pipes."""


def raise_open_files(wanted: int) -> int:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``wanted`` descriptors, at most its hard limit
    (never lowered); the soft limit in force after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:  # a sandbox that refuses: keep the limit as it is
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
    return soft


def connection_cap(wanted: int, reserve: int = RESERVE) -> int:
    """The model connections this process may open, at most ``wanted``: the soft open-files limit
    (raised first, ``raise_open_files(wanted + reserve)``) less ``reserve``, at least 16. Logs a
    warning naming ``AGENT_MODEL_MAX_CONNECTIONS`` when the limit cuts the pool below ``wanted``."""
    soft = raise_open_files(wanted + reserve)
    if soft == resource.RLIM_INFINITY or soft - reserve >= wanted:
        return wanted
    cap = max(16, soft - reserve)
    log.warning(
        "the open-files limit (%d, hard limit included) leaves room for %d model connections, not the %d of "
        "AGENT_MODEL_MAX_CONNECTIONS: calls beyond wait for a free connection (raise `ulimit -n`)",
        soft,
        cap,
        wanted,
    )
    return cap
