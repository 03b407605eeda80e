"""Redis over TLS end to end (``rediss://``, docs/failover.md): a Redis that serves TLS only,
with a certificate from a CA this test makes (``devtools.certificates``), and a turn through all
of it: the control plane and the HTTP API enqueue it, Celery's broker carries its messages, a
real worker runs it with the turn store, beat's redbeat keeps its schedule, and the result
backend stores a task's result; every one of them speaks verified TLS to that Redis.

Before: the result backend raised on a ``rediss://`` URL without ``ssl_cert_reqs``, and the broker
(an explicit transport) spoke plaintext to the TLS port. The server is always verified: a client
that does not trust the CA, or that reaches it by a name the certificate does not carry, is
refused. The same over a Sentinel set serving TLS only. A ``redis-server`` built with TLS is a
prerequisite (Debian's is; ``make redis-tls`` installs it): without it the tests fail.
"""

from __future__ import annotations

import ssl
import uuid

import pytest
import redis

from devtools.certificates import CertificateAuthority
from devtools.embedded_redis import EmbeddedRedis, ServerTLS
from devtools.embedded_sentinel import EmbeddedSentinelSet
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg, wait_for
from worker.redis_connection import RedisEndpoint, Sentinels, TLSFiles
from worker.settings import parse_host_ports


@pytest.fixture
def tls(tmp_path) -> ServerTLS:
    ca = CertificateAuthority.create(tmp_path / "tls")
    server = ca.issue("redis", ("127.0.0.1", "localhost"))
    return ServerTLS(server.cert_file, server.key_file, ca.ca_file)


def test_a_turn_runs_over_tls_through_broker_store_backend_beat_and_api(tls, gateway, script_name, homes_root):
    from tests.support.api_server import ApiServer

    stack = PrivateStack(EmbeddedRedis(persist=True, tls=tls))
    api = None
    try:
        assert stack.url.startswith("rediss://") and stack.control.endpoint.tls is not None
        # Nothing but TLS on that port: a plaintext client is not answered.
        plain = RedisEndpoint.parse(stack.url.replace("rediss://", "redis://", 1)).client(socket_timeout=2)
        with pytest.raises(redis.ConnectionError):
            plain.ping()
        stack.start_worker(pool="threads", concurrency=4)
        stack.start_beat()  # redbeat over TLS (the stack waits for its lock in Redis)
        gateway.add_script(
            script_name, [{"output": [fc("append_marker", {"label": "tls", "ms": 0})]}, {"output": [msg("over tls")]}]
        )
        agent = f"tls-{uuid.uuid4().hex[:6]}"
        tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"})
        assert stack.control.wait(tid, timeout=90).final_output == "over tls"
        assert (homes_root / agent / "markers.txt").read_text().split() == ["tls"]
        # The HTTP API: its pool and its event hub over TLS.
        api = ApiServer(stack.control_url, endpoint=stack.endpoint, **stack.env).start()
        with api.client(api.token([agent])) as http:
            created = http.post("/v1/turns", json={"agent_id": agent, "input": "again", "model": script_name,
                                                  "toolset": "testing"})  # fmt: skip
            assert created.status_code in (200, 201), created.text
            turn = created.json()["turn_id"]
            wait_for(lambda: http.get(f"/v1/turns/{turn}").json().get("status") == "completed", timeout=90)
            events = http.get(f"/v1/turns/{turn}/events", headers={"Accept": "text/event-stream"}, timeout=30)
            assert "turn_finished" in events.text or "model_reply" in events.text
        # The result backend: a task's result stored and read over TLS.
        assert _result_over_tls(stack) == "pong"
    finally:
        if api is not None:
            api.stop()
        stack.close()


def _result_over_tls(stack: PrivateStack) -> object:
    """``tasks.health.ping`` sent through a Celery app configured as a worker's (``tasks.app.redis_conf``)
    for this stack's TLS Redis, its result read from the result backend."""
    from celery import Celery

    from tasks.app import redis_conf
    from tasks.serialization import SERIALIZER, register_orjson

    register_orjson()
    app = Celery("tls-check")
    app.conf.update(
        **redis_conf(stack._endpoint(stack.url), 8, 60),
        task_serializer=SERIALIZER,
        result_serializer=SERIALIZER,
        accept_content=[SERIALIZER, "json"],
        result_accept_content=[SERIALIZER, "json"],
    )
    assert app.backend.connparams["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    return app.send_task("tasks.health.ping", ("pong",), queue="turns").get(timeout=60)


def test_tls_refuses_a_server_it_cannot_verify(tls, tmp_path):
    server = EmbeddedRedis(tls=tls)
    server.start()
    try:
        trusted = RedisEndpoint.parse(server.url, tls=TLSFiles(str(tls.ca_file)))
        assert trusted.client().ping()
        other_ca = CertificateAuthority.create(tmp_path / "other").ca_file
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            RedisEndpoint.parse(server.url, tls=TLSFiles(str(other_ca))).client().ping()
    finally:
        server.stop()
    # A certificate from the trusted CA for "localhost" only: reached as 127.0.0.1, it is refused.
    ca = CertificateAuthority.create(tmp_path / "named")
    named = ca.issue("named", ("localhost",))
    server = EmbeddedRedis(tls=ServerTLS(named.cert_file, named.key_file, ca.ca_file), url_host="localhost")
    server.start()
    try:
        assert RedisEndpoint.parse(server.url, tls=TLSFiles(str(ca.ca_file))).client().ping()
        by_address = server.url.replace("@localhost:", "@127.0.0.1:")
        with pytest.raises(redis.ConnectionError, match="certificate verify failed"):
            RedisEndpoint.parse(by_address, tls=TLSFiles(str(ca.ca_file))).client().ping()
    finally:
        server.stop()


def test_a_sentinel_set_over_tls_fails_over(tls):
    redis_set = EmbeddedSentinelSet(tls=tls)
    redis_set.start()
    try:
        sentinels = Sentinels(parse_host_ports(redis_set.sentinel_addresses), "agent", redis_set.sentinel_password)
        client = RedisEndpoint.parse(redis_set.url, tls=TLSFiles(str(tls.ca_file)), sentinels=sentinels).client()
        client.set("before", "1")
        old = redis_set.kill_primary()
        redis_set.wait_for_failover(old.port)
        wait_for(lambda: _try(lambda: client.set("after", "1")), timeout=30)
        assert client.get("after") == b"1"
    finally:
        redis_set.stop()


def _try(run):
    try:
        return run()
    except redis.RedisError:
        return None


def test_a_turn_runs_over_tls_through_sentinels(tls, gateway, script_name, homes_root):
    """TLS and Sentinel together, as across hosts: the workers, beat and the control plane ask the
    Sentinels over TLS for the primary and talk TLS to it (kombu's and Celery's Sentinel transports
    with ``broker_use_ssl``/``redis_backend_use_ssl``, redbeat's Sentinel client with its TLS)."""
    stack = PrivateStack(EmbeddedSentinelSet(tls=tls))
    try:
        assert stack.endpoint.tls is not None and stack.endpoint.sentinels is not None
        stack.start_worker(pool="threads", concurrency=4)
        stack.start_beat()
        gateway.add_script(
            script_name,
            [{"output": [fc("append_marker", {"label": "both", "ms": 0})]}, {"output": [msg("tls and sentinels")]}],
        )
        agent = f"tls-s-{uuid.uuid4().hex[:6]}"
        tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": script_name, "toolset": "testing"})
        assert stack.control.wait(tid, timeout=90).final_output == "tls and sentinels"
        assert (homes_root / agent / "markers.txt").read_text().split() == ["both"]
    finally:
        stack.close()
