"""Where Redis is and how to reach it: one typed endpoint from which every Redis client is built.

Every client of the product (the turn store, placement, liveness, the watchdog, metrics, the
control plane and its token CLI, the HTTP API's pool and event hub, Celery's broker and result
backend, redbeat, Flower) is made here, from the settings of ``worker.settings``:

- ``REDIS_URL`` / ``CONTROL_REDIS_URL``: ``redis://user:password@host:port/db``, or ``rediss://``
  for TLS. TLS always verifies the server (its certificate against ``AGENT_REDIS_TLS_CA_FILE``,
  else the system's CAs, and its host name); there is no way to turn that off.
- ``AGENT_REDIS_TLS_CERT_FILE`` / ``AGENT_REDIS_TLS_KEY_FILE``: a client certificate, when the
  server asks for one (``tls-auth-clients``).
- ``AGENT_REDIS_SENTINELS=host:port,...``: the primary is found through Sentinel, by its name
  ``AGENT_REDIS_SENTINEL_MASTER`` (default ``agent``); the URL's host and port are then not used,
  its user, password, db and scheme are. ``AGENT_REDIS_SENTINEL_PASSWORD``: the Sentinels' own
  ``requirepass``. TLS to the Sentinels follows the URL's scheme.

A Sentinel-managed client follows a failover by itself (redis-py): a connection to a demoted
primary that answers ``READONLY``, or one that breaks, is closed, and the next one asks the
Sentinels where the primary is now. What that means for a turn is in docs/failover.md.

No Celery here (``worker/`` never imports it): the Celery edge (``tasks.app``) reads the broker's,
the result backend's and redbeat's settings from ``RedisEndpoint``'s plain values.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel

from worker.settings import Settings, get_settings, parse_host_ports, redact_url


@dataclass(frozen=True)
class TLSFiles:
    """What a TLS client presents and trusts: ``ca_file`` (PEM bundle; None: the system's CAs),
    ``cert_file``/``key_file`` (a client certificate; both or neither)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True)
class Sentinels:
    """The Sentinels that know where the primary ``master`` is: ``(host, port)`` pairs, and their
    own password (``requirepass``), if any."""

    addresses: tuple[tuple[str, int], ...]
    master: str = "agent"
    password: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class RedisEndpoint:
    """One Redis deployment as a client sees it (see the module docstring). ``tls`` is None for a
    plain ``redis://`` URL; ``sentinels`` is None when the URL's ``host:port`` is the server."""

    host: str
    port: int
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TLSFiles | None = None
    sentinels: Sentinels | None = None

    @classmethod
    def parse(cls, url: str, *, tls: TLSFiles = TLSFiles(), sentinels: Sentinels | None = None) -> RedisEndpoint:
        """The endpoint of ``url`` (``redis://`` or ``rediss://``; port 6379 and db 0 when absent);
        ``tls`` applies to a ``rediss://`` URL only. Raises ``ValueError`` saying what is wrong
        (never the URL: it carries a password): another scheme, a query string (TLS options are the
        ``AGENT_REDIS_TLS_*`` settings, and the server is always verified), a port or db that is
        not a number."""
        parts = urlsplit(url)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError("the scheme is redis:// or rediss:// (TLS)")
        if parts.query:
            raise ValueError(
                "no query string (TLS files are AGENT_REDIS_TLS_CA_FILE, AGENT_REDIS_TLS_CERT_FILE and "
                "AGENT_REDIS_TLS_KEY_FILE; the server is always verified)"
            )
        try:
            port = parts.port or 6379
        except ValueError:
            raise ValueError("the port is not a number") from None
        db = parts.path.strip("/") or "0"
        if not db.isdigit():
            raise ValueError("the database is a number (/0)")
        if not parts.hostname and sentinels is None:
            raise ValueError("no host")
        return cls(
            host=parts.hostname or "",
            port=port,
            db=int(db),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            tls=tls if parts.scheme == "rediss" else None,
            sentinels=sentinels,
        )

    # ----- what the endpoint is -------------------------------------------------
    @property
    def display(self) -> str:
        """Where it is, without secrets: ``rediss://worker:***@10.0.0.5:6379/0`` or
        ``redis://worker:***@sentinel(agent: h1:26379,h2:26379)/0``."""
        scheme = "rediss" if self.tls else "redis"
        user = f"{self.username or ''}{':***' if self.password else ''}@" if self.username or self.password else ""
        if self.sentinels:
            where = f"sentinel({self.sentinels.master}: {','.join(f'{h}:{p}' for h, p in self.sentinels.addresses)})"
        else:
            where = f"{self.host}:{self.port}"
        return f"{scheme}://{user}{where}/{self.db}"

    def same_server(self, other: RedisEndpoint) -> bool:
        """True when both reach the same database of the same primary (the same Sentinels' master,
        or the same host and port): the broker and the turn store share their writes' order."""
        if self.db != other.db:
            return False
        if self.sentinels or other.sentinels:
            return (
                self.sentinels is not None
                and other.sentinels is not None
                and self.sentinels.master == other.sentinels.master
                and set(self.sentinels.addresses) == set(other.sentinels.addresses)
            )
        return (self.host, self.port) == (other.host, other.port)

    # ----- redis-py clients -----------------------------------------------------
    def tls_kwargs(self) -> dict[str, Any]:
        """redis-py's keyword arguments for TLS (none for a plain endpoint): the server always verified."""
        if self.tls is None:
            return {}
        kwargs: dict[str, Any] = {"ssl": True, "ssl_cert_reqs": "required", "ssl_check_hostname": True}
        if self.tls.ca_file:
            kwargs["ssl_ca_certs"] = self.tls.ca_file
        if self.tls.cert_file:
            kwargs["ssl_certfile"] = self.tls.cert_file
            kwargs["ssl_keyfile"] = self.tls.key_file
        return kwargs

    def _auth_kwargs(self) -> dict[str, Any]:
        return {"username": self.username, "password": self.password, "db": self.db}

    def sentinel_kwargs(self, socket_timeout: float = 5.0) -> dict[str, Any]:
        """How a client talks to the Sentinels themselves: their password, TLS as the URL says."""
        assert self.sentinels is not None
        kwargs: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
        if self.sentinels.password:
            kwargs["password"] = self.sentinels.password
        return {**kwargs, **self.tls_kwargs()}

    def client(
        self,
        *,
        max_connections: int | None = None,
        wait_for_connection: float | None = None,
        socket_timeout: float | None = 30.0,
        socket_connect_timeout: float = 5.0,
        health_check_interval: int = 30,
        decode_responses: bool = False,
    ) -> redis.Redis:
        """A synchronous client (thread-safe; a pool of ``max_connections``). ``wait_for_connection``:
        seconds a command waits for a free connection when all are busy (a blocking pool, for a
        threads pool of hundreds) instead of failing with "Too many connections". Timeouts in
        seconds. With Sentinels, the pool follows the primary across a failover."""
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
            "health_check_interval": health_check_interval,
            "decode_responses": decode_responses,
            **self._auth_kwargs(),
        }
        if max_connections is not None:
            options["max_connections"] = max_connections
        if self.sentinels is None:
            pool_class: type[redis.ConnectionPool] = redis.ConnectionPool
            if wait_for_connection is not None:
                pool_class, options["timeout"] = redis.BlockingConnectionPool, wait_for_connection
            tls = self.tls_kwargs()
            if tls.pop("ssl", False):
                options["connection_class"] = redis.SSLConnection
            pool = pool_class(host=self.host, port=self.port, **options, **tls)
            return redis.Redis(connection_pool=pool)
        sentinel = redis.sentinel.Sentinel(
            self.sentinels.addresses, sentinel_kwargs=self.sentinel_kwargs(socket_connect_timeout), **self.tls_kwargs()
        )
        sentinel_pool: type[redis.sentinel.SentinelConnectionPool] = redis.sentinel.SentinelConnectionPool
        if wait_for_connection is not None:
            sentinel_pool, options["timeout"] = BlockingSentinelConnectionPool, wait_for_connection
        client: redis.Redis = sentinel.master_for(
            self.sentinels.master, redis_class=redis.Redis, connection_pool_class=sentinel_pool, **options
        )
        return client

    def async_client(
        self,
        *,
        max_connections: int | None = None,
        wait_for_connection: float | None = None,
        socket_timeout: float | None = 30.0,
        socket_connect_timeout: float = 5.0,
        health_check_interval: int = 30,
    ) -> redis.asyncio.Redis:
        """An asyncio client, as ``client`` (bytes replies). Used in one event loop."""
        options: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
            "health_check_interval": health_check_interval,
            **self._auth_kwargs(),
        }
        if max_connections is not None:
            options["max_connections"] = max_connections
        if self.sentinels is None:
            pool_class: type[redis.asyncio.ConnectionPool] = redis.asyncio.ConnectionPool
            if wait_for_connection is not None:
                pool_class, options["timeout"] = redis.asyncio.BlockingConnectionPool, wait_for_connection
            tls = self.tls_kwargs()
            if tls.pop("ssl", False):
                options["connection_class"] = redis.asyncio.SSLConnection
            pool = pool_class(host=self.host, port=self.port, **options, **tls)
            return redis.asyncio.Redis(connection_pool=pool)
        sentinel = redis.asyncio.sentinel.Sentinel(
            self.sentinels.addresses, sentinel_kwargs=self.sentinel_kwargs(socket_connect_timeout), **self.tls_kwargs()
        )
        sentinel_pool: type[redis.asyncio.sentinel.SentinelConnectionPool] = (
            redis.asyncio.sentinel.SentinelConnectionPool
        )
        if wait_for_connection is not None:
            sentinel_pool, options["timeout"] = AsyncBlockingSentinelConnectionPool, wait_for_connection
        client: redis.asyncio.Redis = sentinel.master_for(
            self.sentinels.master, redis_class=redis.asyncio.Redis, connection_pool_class=sentinel_pool, **options
        )
        return client

    # ----- what the Celery edge configures (plain values) -------------------------
    def celery_url(self) -> str:
        """The broker's and the result backend's URL: this endpoint's ``redis(s)://`` URL, or with
        Sentinels one ``sentinel://`` URL per Sentinel (``;``-separated), each carrying the
        primary's user, password and db (kombu's and Celery's Sentinel transports read them)."""
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
        if self.sentinels is None:
            scheme = "rediss" if self.tls else "redis"
            return f"{scheme}://{auth}{self.host}:{self.port}/{self.db}"
        return ";".join(f"sentinel://{auth}{host}:{port}/{self.db}" for host, port in self.sentinels.addresses)

    def celery_transport_options(self) -> dict[str, Any]:
        """kombu's (``broker_transport_options``) and Celery's (``result_backend_transport_options``)
        Sentinel options: the primary's name and how to talk to the Sentinels; none without them."""
        if self.sentinels is None:
            return {}
        return {"master_name": self.sentinels.master, "sentinel_kwargs": self.sentinel_kwargs()}

    def celery_ssl(self) -> dict[str, Any] | None:
        """``broker_use_ssl`` / ``redis_backend_use_ssl`` / ``redbeat_redis_use_ssl``: the server
        verified (``CERT_REQUIRED``), the CA and client certificate files; None for plain TCP."""
        if self.tls is None:
            return None
        options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if self.tls.ca_file:
            options["ssl_ca_certs"] = self.tls.ca_file
        if self.tls.cert_file:
            options["ssl_certfile"] = self.tls.cert_file
            options["ssl_keyfile"] = self.tls.key_file
        return options

    def redbeat(self) -> tuple[str, dict[str, Any]]:
        """``(redbeat_redis_url, redbeat_redis_options)``; TLS through ``celery_ssl``."""
        timeouts = {"socket_connect_timeout": 5, "socket_timeout": 30}
        if self.sentinels is None:
            scheme = "rediss" if self.tls else "redis"
            auth = ""
            if self.username or self.password:
                auth = f"{quote(self.username or '', safe='')}:{quote(self.password or '', safe='')}@"
            return f"{scheme}://{auth}{self.host}:{self.port}/{self.db}", timeouts
        return "redis-sentinel://", {
            "sentinels": list(self.sentinels.addresses),
            "service_name": self.sentinels.master,
            "username": self.username,
            "password": self.password,
            "db": self.db,
            "socket_timeout": 30,
            "sentinel_kwargs": self.sentinel_kwargs(),
        }


class BlockingSentinelConnectionPool(redis.sentinel.SentinelConnectionPool, redis.BlockingConnectionPool):
    """redis-py's Sentinel pool that waits for a free connection (``timeout`` seconds) like
    ``BlockingConnectionPool`` instead of raising "Too many connections"."""


class AsyncBlockingSentinelConnectionPool(
    redis.asyncio.sentinel.SentinelConnectionPool, redis.asyncio.BlockingConnectionPool
):
    """The asyncio ``BlockingSentinelConnectionPool``."""


def redis_endpoint(settings: Settings | None = None, *, control: bool = False, url: str | None = None) -> RedisEndpoint:
    """The endpoint of the settings' ``REDIS_URL`` (``control``: ``CONTROL_REDIS_URL`` when set;
    ``url``: that URL instead), with their Sentinels and TLS files. Raises ``ValueError``."""
    settings = settings or get_settings()
    name, chosen = "the given URL", url
    if chosen is None:
        name, chosen = "REDIS_URL", settings.redis_url
        if control and settings.control_redis_url:
            name, chosen = "CONTROL_REDIS_URL", settings.control_redis_url
    sentinels = None
    if settings.redis_sentinels:
        sentinels = Sentinels(
            parse_host_ports(settings.redis_sentinels),
            settings.redis_sentinel_master,
            settings.redis_sentinel_password.get_secret_value() if settings.redis_sentinel_password else None,
        )
    tls = TLSFiles(settings.redis_tls_ca_file, settings.redis_tls_cert_file, settings.redis_tls_key_file)
    try:
        return RedisEndpoint.parse(chosen, tls=tls, sentinels=sentinels)
    except ValueError as exc:
        raise ValueError(f"{name} {redact_url(chosen)!r} is not a Redis URL: {exc}") from None
