"""A Redis that fails over, for development and tests: a primary, a replica and three Sentinels.

All five are the ``redis-server`` binary the embedded Redis uses (``devtools.embedded_redis``;
a Sentinel is ``redis-server <config> --sentinel``), on 127.0.0.1 and random ports, each in a
private directory. The users are those of the embedded Redis (``worker``, ``control``, fresh
passwords), plus two with narrow rights: ``replica`` (the replica authenticates to its primary
with it: ``masteruser``/``masterauth``; both servers carry it, as either may be the primary after
a failover) and ``sentinel`` (the Sentinels authenticate to both servers with it: ``sentinel
auth-user``/``auth-pass``). The Sentinels have a password of their own (``requirepass``, also
given to each other as ``sentinel sentinel-pass``), which clients pass as
``AGENT_REDIS_SENTINEL_PASSWORD``. With ``tls`` everything speaks TLS only: clients, replication,
Sentinels to servers and to each other.

A failover: ``kill_primary()`` SIGKILLs the primary; the Sentinels agree it is down after
``down_after_ms`` and promote the replica (``wait_for_failover``); ``restart(server)`` brings
the old primary back, and the Sentinels make it a replica of the new one.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import redis

from devtools import lifetime
from devtools.embedded_redis import (
    REPLICA_RULES,
    SENTINEL_RULES,
    USERS,
    EmbeddedRedis,
    EmbeddedRedisError,
    ServerTLS,
    find_redis_server,
    tls_args,
)
from devtools.ports import free_port

MASTER = "agent"


def sentinel_config(
    *, port: int, primary_port: int, passwords: dict[str, str], down_after_ms: int, failover_timeout_ms: int
) -> str:
    """A Sentinel's configuration file (Sentinel rewrites it as the deployment changes): it watches
    ``MASTER`` at 127.0.0.1:``primary_port`` with a quorum of 2, authenticates to the servers as
    ``sentinel`` and to the other Sentinels with their password, and asks one of its own."""
    return "\n".join(
        [
            f"port {port}",
            "bind 127.0.0.1",
            f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2",
            f"sentinel auth-user {MASTER} sentinel",
            f"sentinel auth-pass {MASTER} {passwords['sentinel']}",
            f"sentinel down-after-milliseconds {MASTER} {down_after_ms}",
            f"sentinel failover-timeout {MASTER} {failover_timeout_ms}",
            f"sentinel parallel-syncs {MASTER} 1",
            f"requirepass {passwords['sentinels']}",
            f"sentinel sentinel-pass {passwords['sentinels']}",
            "",
        ]
    )


class EmbeddedSentinelSet:
    """Two servers (``servers[0]`` starts as the primary) and three Sentinels (see the module
    docstring). ``start()``; ``env`` (the settings every client needs); ``primary_port()`` (as the
    Sentinels say now); ``kill_primary()``, ``wait_for_failover(old_port)``, ``restart(server)``;
    ``stop()``."""

    def __init__(
        self,
        *,
        persist: bool = True,
        tls: ServerTLS | None = None,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ):
        self.dir = Path(tempfile.mkdtemp(prefix="embedded-sentinel-"))  # mode 0700
        self.passwords = {user: secrets.token_hex(24) for user in (*USERS, "replica", "sentinel")}
        self.sentinel_password = secrets.token_hex(24)
        self.tls = tls
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        rules = {"replica": REPLICA_RULES, "sentinel": SENTINEL_RULES}
        # Both servers may replicate (each is the replica after some failover): the same user for both.
        auth = ("--masteruser", "replica", "--masterauth", self.passwords["replica"])
        ports = [free_port(), free_port()]
        self.servers = [
            EmbeddedRedis(
                ports[i],
                persist=persist,
                data_dir=self.dir / f"redis-{i}",
                passwords=self.passwords,
                rules=rules,
                extra_args=auth + (("--replicaof", "127.0.0.1", str(ports[0])) if i else ()),
                tls=tls,
            )
            for i in range(2)
        ]
        self.sentinel_ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes] | None] = [None, None, None]

    # ----- what clients are given -------------------------------------------------
    @property
    def url(self) -> str:
        """The worker user's URL (its host and port are not used with Sentinels: the scheme, the
        user, the password and the db are)."""
        return self.servers[0].url

    @property
    def control_url(self) -> str:
        return self.servers[0].control_url

    @property
    def sentinel_addresses(self) -> str:
        """``AGENT_REDIS_SENTINELS``."""
        return ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)

    @property
    def env(self) -> dict[str, str]:
        """What a worker, beat or control plane needs to reach this Redis through the Sentinels."""
        env = {
            "REDIS_URL": self.url,
            "CONTROL_REDIS_URL": self.control_url,
            "AGENT_REDIS_SENTINELS": self.sentinel_addresses,
            "AGENT_REDIS_SENTINEL_MASTER": MASTER,
            "AGENT_REDIS_SENTINEL_PASSWORD": self.sentinel_password,
        }
        if self.tls:
            env["AGENT_REDIS_TLS_CA_FILE"] = str(self.tls.ca_file)
        return env

    # ----- running it --------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> EmbeddedSentinelSet:
        """Start both servers and the Sentinels; return once the replica is in sync and every
        Sentinel knows the primary, the replica and the two other Sentinels. Raises
        ``EmbeddedRedisError``."""
        try:
            for server in self.servers:
                server.start()
            for i in range(3):
                self._start_sentinel(i)
            self._wait(timeout, self._settled, "the Sentinel set did not settle")
        except BaseException:
            self.stop()  # nothing of a set that did not come up is left running
            raise
        return self

    def _start_sentinel(self, i: int) -> None:
        directory = self.dir / f"sentinel-{i}"
        directory.mkdir(mode=0o700, exist_ok=True)
        conf = directory / "sentinel.conf"
        if not conf.exists():  # a restarted Sentinel keeps what it learnt (its rewritten file)
            text = sentinel_config(
                port=0 if self.tls else self.sentinel_ports[i],
                primary_port=self.servers[0].port,
                passwords={"sentinel": self.passwords["sentinel"], "sentinels": self.sentinel_password},
                down_after_ms=self.down_after_ms,
                failover_timeout_ms=self.failover_timeout_ms,
            )
            fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
        listen = tls_args(self.sentinel_ports[i], self.tls) if self.tls else []
        self.sentinels[i] = subprocess.Popen(
            [find_redis_server(), str(conf), "--sentinel", "--dir", str(directory), *listen],
            stdout=open(directory / "sentinel.log", "ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lifetime.preexec(),
        )

    def client(self, port: int, *, sentinel: bool = False, user: str = "worker") -> redis.Redis:
        """A redis-py client of one process of the set: a Sentinel (``sentinel``) or a server."""
        from worker.redis_connection import RedisEndpoint, TLSFiles

        scheme = "rediss" if self.tls else "redis"
        tls = TLSFiles(str(self.tls.ca_file)) if self.tls else TLSFiles()
        if sentinel:
            url = f"{scheme}://:{self.sentinel_password}@127.0.0.1:{port}/0"
        else:
            url = f"{scheme}://{user}:{self.passwords[user]}@127.0.0.1:{port}/0"
        return RedisEndpoint.parse(url, tls=tls).client(socket_timeout=2, socket_connect_timeout=1)

    def _sentinel_says(self, ask: Callable[[redis.Redis], Any]) -> list[Any]:
        """What each Sentinel that answers replies to ``ask(client)``."""
        answers = []
        for port, proc in zip(self.sentinel_ports, self.sentinels, strict=True):
            if proc is None or proc.poll() is not None:
                continue
            client = self.client(port, sentinel=True)
            try:
                answers.append(ask(client))
            except redis.RedisError:
                continue
            finally:
                client.close()
        return answers

    def primary_port(self) -> int | None:
        """The primary's port as a majority of the Sentinels name it now (None without one)."""
        ports = [int(a[1]) for a in self._sentinel_says(lambda c: c.sentinel_get_master_addr_by_name(MASTER)) if a]
        best = max(set(ports), key=ports.count) if ports else None
        return best if best is not None and ports.count(best) >= 2 else None

    def server_on(self, port: int) -> EmbeddedRedis:
        return next(s for s in self.servers if s.port == port)

    def _settled(self) -> bool:
        primary = self.primary_port()
        if primary is None:
            return False
        for master in self._sentinel_says(lambda c: c.sentinel_master(MASTER)):
            if int(master["num-slaves"]) < 1 or int(master["num-other-sentinels"]) < 2:
                return False
        replica = next(s for s in self.servers if s.port != primary)
        client = self.client(replica.port)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return bool(info.get("master_link_status") == "up" and info.get("master_port") == primary)

    @staticmethod
    def _wait(timeout: float, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if done():
                return
            time.sleep(0.1)
        raise EmbeddedRedisError(f"{what} within {timeout:.0f} s")

    def kill_primary(self) -> EmbeddedRedis:
        """SIGKILL the server the Sentinels name as the primary (a crash); returns it."""
        port = self.primary_port()
        if port is None:
            raise EmbeddedRedisError("the Sentinels name no primary")
        server = self.server_on(port)
        server.halt(kill=True)
        return server

    def wait_for_failover(self, old_port: int, timeout: float = 60.0) -> int:
        """Wait until the Sentinels name another primary than ``old_port``, and it takes writes.
        Returns its port. Raises ``EmbeddedRedisError`` after ``timeout`` seconds."""

        def promoted() -> bool:
            port = self.primary_port()
            if port is None or port == old_port:
                return False
            client = self.client(port)
            try:
                return bool(client.info("replication").get("role") == "master")
            except redis.RedisError:
                return False
            finally:
                client.close()

        self._wait(timeout, promoted, "no replica was promoted")
        port = self.primary_port()
        assert port is not None
        return port

    def restart(self, server: EmbeddedRedis, timeout: float = 60.0) -> None:
        """Start a killed server again; returns once it replicates the current primary (the
        Sentinels reconfigure a returning old primary as a replica)."""
        primary = self.primary_port()
        server.start()
        if primary is not None and primary != server.port:
            self._wait(timeout, self._settled, "the restarted server did not become a replica")

    def restart_dead(self) -> list[EmbeddedRedis]:
        """Start again every server whose process exited (as compose's ``restart`` policy would; a
        killed primary rejoins as a replica of the promoted one). Returns those restarted.
        Raises ``EmbeddedRedisError`` when one does not come back."""
        dead = [s for s in self.servers if s.proc is not None and s.proc.poll() is not None]
        for server in dead:
            server.start()
        return dead

    def failovers(self) -> int:
        """Failovers so far, as the first Sentinel logged them (``+switch-master``): the ones a
        caller caused and any other (a primary too slow to answer for ``down_after_ms``)."""
        log = self.dir / "sentinel-0" / "sentinel.log"
        return log.read_text(errors="replace").count("+switch-master") if log.exists() else 0

    def kill_sentinel(self, i: int) -> None:
        proc = self.sentinels[i]
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def stop(self) -> None:
        """Stop the Sentinels and the servers; remove every directory."""
        for proc in self.sentinels:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for server in self.servers:
            server.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedSentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
