"""Every Redis client of the product is built by ``worker.redis_connection`` (one place that knows
Sentinel and TLS), and the endpoint gives each client what the settings say: the Sentinels, the
primary's name, verified TLS, the Celery broker's, result backend's and redbeat's options.

Pure Python (no server): the clients are built, not connected. A client that really follows a
failover, and TLS end to end, are in ``tests/integration/test_failover.py`` and ``tests/integration/test_redis_tls.py``.
"""

from __future__ import annotations

import ast
import ssl
from pathlib import Path

import pytest
import redis
import redis.asyncio
from pydantic import ValidationError

from worker.redis_connection import (
    AsyncBlockingSentinelConnectionPool,
    BlockingSentinelConnectionPool,
    RedisEndpoint,
    Sentinels,
    TLSFiles,
    redis_endpoint,
)
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("worker", "tasks", "control", "devtools")
THE_MODULE = "worker/redis_connection.py"

# What builds a redis-py client or pool: a call of one of these names (the last part of a dotted
# name), or ``<one of them>.from_url``, when the name comes from redis (``redis.X``, or imported from it).
CLIENT_MAKERS = frozenset(
    {"Redis", "StrictRedis", "ConnectionPool", "BlockingConnectionPool", "Sentinel", "RedisCluster", "from_url"}
)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def redis_client_calls(source: str) -> list[int]:
    """Lines of ``source`` that build a redis-py client or connection pool themselves."""
    tree = ast.parse(source)
    from_redis = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis"
        for alias in node.names
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func)
        parts = name.split(".")
        if parts[-1] not in CLIENT_MAKERS and parts[-2:-1] != ["from_url"]:
            continue
        if parts[0] == "redis" or parts[0] in from_redis:
            found.append(node.lineno)
    return found


def test_every_redis_client_is_built_by_the_connection_module():
    """No module of the product but ``worker/redis_connection.py`` makes a redis-py client or pool:
    a client made elsewhere would miss the Sentinels (and follow no failover) or talk plaintext."""
    offenders = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel != THE_MODULE:
                offenders += [f"{rel}:{line}" for line in redis_client_calls(path.read_text())]
    assert not offenders, f"build these clients with worker.redis_connection: {offenders}"


@pytest.mark.parametrize(
    "line",
    [
        "redis.Redis.from_url(url)",
        "redis.Redis(host='h')",
        "redis.asyncio.Redis.from_url(url)",
        "redis.BlockingConnectionPool.from_url(url)",
        "redis.sentinel.Sentinel([('h', 1)])",
        "Redis(host='h')",
    ],
)
def test_the_rule_catches_a_client_made_elsewhere(line):
    source = f"import redis\nimport redis.asyncio\nimport redis.sentinel\nfrom redis import Redis\nx = {line}\n"
    assert redis_client_calls(source) == [5]


def test_the_rule_leaves_other_pools_alone():
    assert redis_client_calls("import httpcore\np = httpcore.ConnectionPool()\nr: 'redis.Redis'\n") == []


SENTINELS = Sentinels((("10.0.0.1", 26379), ("10.0.0.2", 26380)), "agent", "s3cret")


def test_a_plain_url():
    e = RedisEndpoint.parse("redis://worker:p%40ss@10.0.0.5:6380/2")
    assert (e.host, e.port, e.db, e.username, e.password, e.tls, e.sentinels) == (
        "10.0.0.5",
        6380,
        2,
        "worker",
        "p@ss",
        None,
        None,
    )
    assert e.display == "redis://worker:***@10.0.0.5:6380/2" and "p@ss" not in repr(e)
    assert e.celery_url() == "redis://worker:p%40ss@10.0.0.5:6380/2"
    assert e.celery_ssl() is None and e.celery_transport_options() == {}
    pool = e.client().connection_pool
    assert type(pool) is redis.ConnectionPool and pool.connection_class is redis.Connection
    kwargs = pool.connection_kwargs
    assert (kwargs["host"], kwargs["port"], kwargs["username"], kwargs["password"], kwargs["db"]) == (
        "10.0.0.5",
        6380,
        "worker",
        "p@ss",
        2,
    )
    blocking = e.client(max_connections=7, wait_for_connection=3).connection_pool
    assert isinstance(blocking, redis.BlockingConnectionPool) and blocking.max_connections == 7


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://h/0", "scheme"),
        ("redis://h:port/0", "port"),
        ("redis://h/zero", "database"),
        ("rediss://h/0?ssl_cert_reqs=none", "query string"),
        ("redis:///0", "no host"),
    ],
)
def test_a_bad_url_says_why_and_never_shows_its_password(url, reason):
    with pytest.raises(ValueError, match=reason):
        RedisEndpoint.parse(url)
    with pytest.raises(ValueError) as caught:
        redis_endpoint(Settings(), url=url.replace("//", "//u:topsecret@", 1))
    assert "the given URL" in str(caught.value) and "topsecret" not in str(caught.value)


def test_tls_always_verifies_the_server(tmp_path):
    ca = tmp_path / "ca.pem"
    e = RedisEndpoint.parse("rediss://worker:pw@redis.example:6379/0", tls=TLSFiles(str(ca)))
    assert e.tls_kwargs() == {
        "ssl": True,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": str(ca),
    }
    pool = e.client().connection_pool
    assert pool.connection_class is redis.SSLConnection
    conn = pool.make_connection()
    assert conn.cert_reqs == ssl.CERT_REQUIRED and conn.check_hostname and conn.ca_certs == str(ca)
    assert e.async_client().connection_pool.connection_class is redis.asyncio.SSLConnection
    assert e.celery_ssl() == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": str(ca)}
    assert e.celery_url().startswith("rediss://")
    # The system's CAs when no bundle is named; a client certificate when given.
    assert "ssl_ca_certs" not in RedisEndpoint.parse("rediss://h/0").tls_kwargs()
    with_cert = RedisEndpoint.parse("rediss://h/0", tls=TLSFiles(None, "c.pem", "k.pem")).celery_ssl()
    assert with_cert == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_certfile": "c.pem", "ssl_keyfile": "k.pem"}
    # TLS files do not make a redis:// URL speak TLS.
    assert RedisEndpoint.parse("redis://h/0", tls=TLSFiles(str(ca))).tls is None


def test_sentinels_find_the_primary():
    e = RedisEndpoint.parse("redis://worker:pw@ignored:1/3", sentinels=SENTINELS)
    assert e.display == "redis://worker:***@sentinel(agent: 10.0.0.1:26379,10.0.0.2:26380)/3"
    client = e.client(max_connections=5, wait_for_connection=2)
    pool = client.connection_pool
    assert isinstance(pool, BlockingSentinelConnectionPool) and pool.service_name == "agent"
    assert pool.connection_kwargs["username"] == "worker" and pool.connection_kwargs["db"] == 3
    sentinel_conn = pool.sentinel_manager.sentinels[0].connection_pool.connection_kwargs
    assert (sentinel_conn["host"], sentinel_conn["port"], sentinel_conn["password"]) == ("10.0.0.1", 26379, "s3cret")
    assert isinstance(e.async_client(wait_for_connection=2).connection_pool, AsyncBlockingSentinelConnectionPool)
    assert e.celery_url() == "sentinel://worker:pw@10.0.0.1:26379/3;sentinel://worker:pw@10.0.0.2:26380/3"
    assert e.celery_transport_options()["master_name"] == "agent"
    assert e.celery_transport_options()["sentinel_kwargs"]["password"] == "s3cret"
    url, options = e.redbeat()
    assert url.startswith("redis-sentinel") and options["sentinels"] == [("10.0.0.1", 26379), ("10.0.0.2", 26380)]
    assert (options["service_name"], options["username"], options["password"], options["db"]) == (
        "agent",
        "worker",
        "pw",
        3,
    )


def test_tls_to_sentinels_follows_the_scheme(tmp_path):
    e = RedisEndpoint.parse("rediss://w:pw@x/0", tls=TLSFiles(str(tmp_path / "ca.pem")), sentinels=SENTINELS)
    kwargs = e.celery_transport_options()["sentinel_kwargs"]
    assert kwargs["ssl"] is True and kwargs["ssl_cert_reqs"] == "required" and kwargs["ssl_ca_certs"]
    pool = e.client().connection_pool
    assert pool.connection_class is redis.sentinel.SentinelManagedSSLConnection
    assert pool.sentinel_manager.sentinels[0].connection_pool.connection_class is redis.SSLConnection


def test_same_server():
    a = RedisEndpoint.parse("redis://worker:a@h:1/0", sentinels=SENTINELS)
    assert a.same_server(RedisEndpoint.parse("redis://control:b@other:2/0", sentinels=SENTINELS))
    assert not a.same_server(RedisEndpoint.parse("redis://worker:a@h:1/1", sentinels=SENTINELS))
    assert not a.same_server(RedisEndpoint.parse("redis://worker:a@h:1/0"))
    assert RedisEndpoint.parse("redis://h:1/0").same_server(RedisEndpoint.parse("rediss://u@h:1/0"))


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"AGENT_REDIS_SENTINELS": "h1:26379,h2"}, "AGENT_REDIS_SENTINELS"),
        ({"AGENT_REDIS_SENTINELS": "h1:99999"}, "AGENT_REDIS_SENTINELS"),
        ({"AGENT_REDIS_SENTINEL_MASTER": "no spaces"}, "AGENT_REDIS_SENTINEL_MASTER"),
        ({"AGENT_REDIS_TLS_CA_FILE": "/nonexistent/ca.pem"}, "AGENT_REDIS_TLS_CA_FILE"),
        ({"AGENT_REDIS_TLS_CERT_FILE": __file__}, "AGENT_REDIS_TLS_KEY_FILE"),
        ({"AGENT_REDIS_REPLICA_ACK_TIMEOUT": "0"}, "AGENT_REDIS_REPLICA_ACK_TIMEOUT"),
    ],
)
def test_a_bad_setting_names_its_variable(monkeypatch, env, variable):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert variable in str(caught.value)


def test_settings_build_the_endpoint(monkeypatch, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("not read here")
    monkeypatch.setenv("REDIS_URL", "rediss://worker:pw@ignored:6379/0")
    monkeypatch.setenv("CONTROL_REDIS_URL", "rediss://control:pw2@ignored:6379/0")
    monkeypatch.setenv("AGENT_REDIS_SENTINELS", " 10.0.0.1:26379, [::1]:26380 ")
    monkeypatch.setenv("AGENT_REDIS_SENTINEL_PASSWORD", "s3cret")
    monkeypatch.setenv("AGENT_REDIS_TLS_CA_FILE", str(ca))
    settings = Settings()
    e = redis_endpoint(settings)
    assert e.sentinels == Sentinels((("10.0.0.1", 26379), ("::1", 26380)), "agent", "s3cret")
    assert e.tls == TLSFiles(str(ca)) and e.username == "worker"
    assert redis_endpoint(settings, control=True).username == "control"
    assert settings.replica_acks == 1  # a WAIT for each fencing write once there are replicas
    monkeypatch.delenv("AGENT_REDIS_SENTINELS")
    assert Settings().replica_acks == 0


def test_the_celery_edge_configures_broker_backend_and_redbeat(monkeypatch):
    """``tasks.app.redis_conf``: the hardened transport (its Sentinel variant with Sentinels), the
    Sentinel options and verified TLS for the broker, the result backend and redbeat alike."""
    from tasks.app import redis_conf

    plain = redis_conf(RedisEndpoint.parse("redis://w:p@h:1/0"), 100, 360)
    assert plain["broker_transport"] == "tasks.broker:Transport" and plain["broker_use_ssl"] is None
    e = RedisEndpoint.parse("rediss://w:p@h:1/0", tls=TLSFiles("ca.pem"), sentinels=SENTINELS)
    conf = redis_conf(e, 100, 360)
    assert conf["broker_transport"] == "tasks.broker:SentinelTransport"
    assert conf["broker_url"] == conf["result_backend"] == e.celery_url()
    for options in (conf["broker_transport_options"], conf["result_backend_transport_options"]):
        assert options["master_name"] == "agent" and options["sentinel_kwargs"]["ssl_ca_certs"] == "ca.pem"
    for key in ("broker_use_ssl", "redis_backend_use_ssl", "redbeat_redis_use_ssl"):
        assert conf[key] == {"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "ca.pem"}
    assert conf["broker_transport_options"]["visibility_timeout"] >= 3600
    assert conf["redbeat_redis_url"].startswith("redis-sentinel")
