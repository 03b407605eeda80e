"""A broker connection that moves to the next Sentinel after a connection error keeps the hardened
transport (tasks.broker), not kombu's stock one taken from the URL's scheme."""

from __future__ import annotations

from kombu import Connection
from kombu.transport import get_transport_cls

from tasks.app import broker_transport
from tasks.broker import SentinelTransport
from worker.redis_connection import RedisEndpoint, Sentinels


def test_a_switch_to_the_next_sentinel_keeps_the_hardened_transport():
    sentinels = Sentinels(addresses=(("sentinel-1", 26379), ("sentinel-2", 26379)))
    endpoint = RedisEndpoint.parse("redis://worker:pw@ignored:6379/0", sentinels=sentinels)
    conn = Connection(endpoint.celery_url(), transport=broker_transport(endpoint))
    assert get_transport_cls(conn.transport_cls) is SentinelTransport
    conn.maybe_switch_next()  # what kombu's ensure_connection does after a failed connect
    assert conn.hostname == "sentinel-2"
    assert get_transport_cls(conn.transport_cls) is SentinelTransport
