"""A local S3-compatible object store for the snapshot tests: moto's server (``moto[server]``, a test
dependency) on a free loopback port, with a bucket made for the test. Real HTTP, real boto3."""

from __future__ import annotations

import uuid

from devtools.ports import free_port

# moto accepts any credentials; boto3 needs some (and a region) to sign its requests.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class ObjectStore:
    """``start()`` runs the server; ``env(prefix)`` is what a worker needs to use it
    (``AGENT_SNAPSHOT_STORE``, ``AGENT_SNAPSHOT_ENDPOINT_URL``, credentials); ``objects()`` lists keys."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.bucket = f"homes-{uuid.uuid4().hex[:8]}"
        self._server = None

    def start(self) -> "ObjectStore":
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def client(self):
        import boto3

        return boto3.session.Session(
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            region_name=CREDENTIALS["AWS_DEFAULT_REGION"],
        ).client("s3", endpoint_url=self.endpoint)

    def url(self, prefix: str = "snapshots") -> str:
        """The ``AGENT_SNAPSHOT_STORE`` value for ``prefix``."""
        return f"s3://{self.bucket}/{prefix}"

    def env(self, prefix: str = "snapshots") -> dict[str, str]:
        """The environment of a worker that snapshots into this store."""
        return {"AGENT_SNAPSHOT_STORE": self.url(prefix), "AGENT_SNAPSHOT_ENDPOINT_URL": self.endpoint, **CREDENTIALS}

    def objects(self, prefix: str = "") -> list[str]:
        """The keys stored under ``prefix``."""
        listed = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix)
        return sorted(o["Key"] for o in listed.get("Contents", []))

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
