"""Loopback ports picked now and bound later by another process (a Redis, a gateway, a metrics
server).

A port the kernel hands out for ``bind(0)`` lies in its ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``), the same range every outgoing connection takes its
local port from. Between the check and the server's own bind, a worker's Redis or gateway
connection could take it, and the server then fails with "Address already in use". So these
ports come from below that range, where only servers bind, chosen at random so that two suites
on one machine rarely try the same one, and checked by binding them.
"""

from __future__ import annotations

import random
import socket

LOWEST = 10000  # below: well-known and registered services (Redis 6379, RabbitMQ 5672, PostgreSQL 5432)
_FALLBACK_EPHEMERAL_LOW = 32768  # Linux's default when /proc does not say


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def free_port(count: int = 1, host: str = "127.0.0.1") -> int:
    """A port ``p`` on ``host`` such that ``p`` .. ``p + count - 1`` were all free just now, below
    the ephemeral range. Raises ``RuntimeError`` when 1000 random tries found none."""
    high = ephemeral_low() - count
    if high <= LOWEST:
        raise RuntimeError(f"the ephemeral range starts at {high + count}: no room below it for {count} port(s)")
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(LOWEST, high)
        socks = [socket.socket() for _ in range(count)]
        try:
            for i, sock in enumerate(socks):
                sock.bind((host, port + i))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return port
    raise RuntimeError(f"no {count} free consecutive port(s) on {host} in {LOWEST}..{high}")
