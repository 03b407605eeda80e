"""Redis's and Sentinel's files for one machine of a deployment on several hosts
(``devtools.hosts_config`` writes them, ``devtools.host`` runs them): TLS only, ACL users,
replication as the ``replica`` user, Sentinel through the ``sentinel`` user."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from pathlib import Path

from devtools.embedded_redis import USER_RULES

REDIS_PORT = 6379
SENTINEL_PORT = 26379
MASTER_NAME = "agent"
QUORUM = 2
# Sentinel's timing: a primary unreachable for DOWN_AFTER_MS is failed over (docs/deployment.md).
DOWN_AFTER_MS = 5000
FAILOVER_TIMEOUT_MS = 60000
# Redis ACL (redis.io "ACL" and "Sentinel" docs): what replication and Sentinel need, nothing more.
REPLICA_RULES = "+psync +replconf +ping"
SENTINEL_RULES = (
    "allchannels +multi +slaveof +ping +exec +subscribe +config|rewrite +role +publish +info "
    "+client|setname +client|kill +script|kill"
)


@dataclass(frozen=True)
class RedisMachine:
    """Where one machine's Redis and Sentinel live: its name and address, the folder of its
    configuration (``config``: certificates, ACL), the deployment's folder on it (``base``) and
    the address of the machine whose Redis starts as the primary."""

    name: str
    address: str
    config: Path
    base: Path
    primary: str

    @property
    def is_primary(self) -> bool:
        return self.address == self.primary


def _sha(password: str) -> str:
    return hashlib.sha256(password.encode()).hexdigest()


def acl_text(worker: str, control: str, replica: str, sentinel_user: str) -> str:
    """Redis's ACL file: ``worker`` (workers, beat, Flower) and ``control`` (the control plane) as in
    ``devtools.embedded_redis``; ``replica`` (replication) and ``sentinel`` (Sentinel's commands)
    with only what they need; ``default`` with a password nobody is given (so anonymous clients get
    NOAUTH; not ``off``: Redis 7.0 replays its append-only file as ``default``). Passwords as
    SHA-256 hashes only."""
    lines = [
        f"user default on #{_sha(secrets.token_hex(32))} {USER_RULES}",
        f"user worker on #{_sha(worker)} {USER_RULES}",
        f"user control on #{_sha(control)} {USER_RULES}",
        f"user replica on #{_sha(replica)} {REPLICA_RULES}",
        f"user sentinel on #{_sha(sentinel_user)} {SENTINEL_RULES}",
    ]
    return "\n".join(lines) + "\n"


def _tls_lines(conf: Path) -> list[str]:
    return [
        f"tls-cert-file {conf / 'server.crt'}",
        f"tls-key-file {conf / 'server.key'}",
        f"tls-ca-cert-file {conf / 'ca.crt'}",
        # Clients prove who they are with their ACL password over TLS, not a client certificate.
        "tls-auth-clients no",
        "tls-replication yes",
    ]


def redis_conf(m: RedisMachine, replica_password: str) -> str:
    """redis.conf of machine ``m``: TLS only on its address and loopback, ACL users, replication
    as ``replica``, an append-only file, never evicting; a replica of the primary unless ``m`` is it.
    ``devtools.host`` copies it into the data directory at the first start: Sentinel rewrites
    that copy (``replicaof``) when it fails over."""
    conf = m.config
    lines = [
        f"# Redis of the agent runtime on {m.name} ({m.address}): python -m devtools.hosts_config",
        f"bind {m.address} 127.0.0.1",
        "port 0",
        f"tls-port {REDIS_PORT}",
        *_tls_lines(conf),
        f"aclfile {conf / 'users.acl'}",
        "masteruser replica",
        f"masterauth {replica_password}",
        f"replica-announce-ip {m.address}",
        f"replica-announce-port {REDIS_PORT}",
        f"dir {m.base / 'redis'}",
        "appendonly yes",
        "appendfsync everysec",
        "maxmemory-policy noeviction",
    ]
    if not m.is_primary:
        lines.append(f"replicaof {m.primary} {REDIS_PORT}")
    return "\n".join(lines) + "\n"


def sentinel_conf(m: RedisMachine, password: str, sentinel_user_password: str) -> str:
    """sentinel.conf of machine ``m``: TLS only, a password (``requirepass``, the same on every
    Sentinel: they use it with each other), monitoring the primary as ``MASTER_NAME`` with quorum
    2 through the ``sentinel`` ACL user. Sentinel rewrites its own copy (``devtools.host``)."""
    conf = m.config
    lines = [
        f"# Sentinel of the agent runtime on {m.name} ({m.address}): python -m devtools.hosts_config",
        f"bind {m.address} 127.0.0.1",
        "port 0",
        f"tls-port {SENTINEL_PORT}",
        *_tls_lines(conf),
        f"dir {m.base / 'sentinel'}",
        f"sentinel announce-ip {m.address}",
        f"sentinel announce-port {SENTINEL_PORT}",
        f"requirepass {password}",
        f"sentinel monitor {MASTER_NAME} {m.primary} {REDIS_PORT} {QUORUM}",
        f"sentinel auth-user {MASTER_NAME} sentinel",
        f"sentinel auth-pass {MASTER_NAME} {sentinel_user_password}",
        f"sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}",
        f"sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}",
        f"sentinel parallel-syncs {MASTER_NAME} 1",
    ]
    return "\n".join(lines) + "\n"
