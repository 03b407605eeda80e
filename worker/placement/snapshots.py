"""The object store that keeps homes' snapshots (S3 API, through boto3): its layout, and reading
and writing its objects with their bounds.

Layout under ``s3://bucket/prefix``, per agent (``docs/placement.md``, "Snapshots"):

- ``<prefix>/<agent_id>/chunks/<sha256>``: a piece of a file's data, stored once under the SHA-256
  of its bytes, whichever file or snapshot holds it: one byte ``r`` then the bytes, or ``z`` then
  them deflated (zlib, level 1, when a sample of the chunk shrinks by a tenth or more). A reader
  checks the length and the digest before it uses a byte of it;
- ``<prefix>/<agent_id>/manifests/<epoch>-<ms>-<random>``: a snapshot, signed
  (``worker.placement.signing``): the home's entries, each file a list of chunks
  (``worker.placement.entries``), deflated JSON.

Chunks are per agent, not shared between agents: what one agent's snapshots reference, only its
own node collects, under its own lock (``worker.placement.homes``), and a guess at another agent's
content can never be confirmed through the store.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
import uuid
import zlib
from datetime import datetime
from typing import Any, Iterable, Iterator
from urllib.parse import urlsplit

from worker.placement.entries import MAX_CHUNK, Chunk
from worker.placement.signing import CHANGED, SnapshotRefused

# The largest manifest object read, and what its JSON may inflate to.
MAX_MANIFEST_OBJECT = 64 << 20
MAX_MANIFEST_JSON = 512 << 20
_SAMPLE = 64 << 10


class SnapshotError(Exception):
    """The object store could not be reached, or refused the request: try again later."""


def encode_chunk(data: bytes | memoryview) -> bytes:
    """The stored form of a chunk: deflated when a sample of it shrinks by a tenth, else raw."""
    view = memoryview(data)
    sample = bytes(view[:_SAMPLE])
    if len(zlib.compress(sample, 1)) < 0.9 * len(sample):
        return b"z" + zlib.compress(view, 1)
    return b"r" + bytes(view)


def decode_chunk(stored: bytes, chunk: Chunk) -> bytes:
    """The bytes of ``chunk`` from its stored form, checked (length and SHA-256). Raises ``SnapshotRefused``."""
    kind, body = stored[:1], memoryview(stored)[1:]
    if kind == b"r":
        data = bytes(body)
    elif kind == b"z":
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(body, chunk.length + 1)  # never more than it should be
        except zlib.error:
            raise SnapshotRefused(f"{CHANGED} (a chunk of it is not what it names)") from None
    else:
        raise SnapshotRefused(f"{CHANGED} (a chunk of it is not what it names)")
    if len(data) != chunk.length or hashlib.sha256(data).hexdigest() != chunk.sha256:
        raise SnapshotRefused(f"{CHANGED} (a chunk of it is not what it names)")
    return data


def _errors(what: str) -> contextlib.AbstractContextManager[None]:
    """A context manager turning botocore's and the network's errors into ``SnapshotError``."""

    @contextlib.contextmanager
    def guard() -> Iterator[None]:
        try:
            yield
        except (SnapshotError, SnapshotRefused):
            raise
        except Exception as exc:  # botocore's errors have no common base importable here cheaply
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("NoSuchKey", "404"):
                raise SnapshotRefused(f"{what} is missing from the store (deleted after it was taken)") from None
            raise SnapshotError(f"{what}: {exc.__class__.__name__}: {exc}") from exc

    return guard()


class SnapshotStore:
    """The object store at ``url`` (``s3://bucket/prefix``), through ``endpoint_url`` when given (an
    S3-compatible server). Credentials and region: boto3's usual lookup (``AWS_*`` variables, files).
    ``sent`` counts the bytes of every object put (for the bench and the records). Thread-safe."""

    def __init__(self, url: str, endpoint_url: str | None = None):
        parts = urlsplit(url)
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.endpoint_url = endpoint_url
        self._client: tuple[int, Any] | None = None
        self._lock = threading.Lock()
        self.sent = 0

    def client(self) -> Any:
        """A boto3 S3 client for this process (re-made after a fork: a client is not fork-safe).
        boto3's clients are thread-safe once made."""
        with self._lock:
            if self._client is None or self._client[0] != os.getpid():
                import boto3
                from botocore.config import Config

                config = Config(
                    connect_timeout=5,
                    read_timeout=60,
                    retries={"max_attempts": 3, "mode": "standard"},
                    max_pool_connections=32,
                )
                session = boto3.session.Session()
                self._client = (os.getpid(), session.client("s3", endpoint_url=self.endpoint_url, config=config))
            return self._client[1]

    # ----- names -------------------------------------------------------------
    def _under(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def chunk_key(self, agent_id: str, sha256: str) -> str:
        return self._under(f"{agent_id}/chunks/{sha256}")

    def new_manifest_key(self, agent_id: str, epoch: int) -> str:
        return self._under(f"{agent_id}/manifests/{epoch}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}")

    # ----- objects -----------------------------------------------------------
    def put(self, key: str, body: bytes) -> int:
        """Store ``body`` at ``key``; returns its size. Raises ``SnapshotError``."""
        with _errors(f"object {key} not stored"):
            self.client().put_object(Bucket=self.bucket, Key=key, Body=body)
        with self._lock:
            self.sent += len(body)
        return len(body)

    def put_chunk(self, agent_id: str, sha256: str, data: bytes | memoryview) -> int:
        """Store a chunk whose SHA-256 is ``sha256``; returns the bytes sent. Raises ``SnapshotError``."""
        return self.put(self.chunk_key(agent_id, sha256), encode_chunk(data))

    def get(self, key: str, limit: int, what: str) -> bytes:
        """The object at ``key`` if it is at most ``limit`` bytes (``SnapshotRefused`` otherwise, and
        when it is missing); ``SnapshotError`` when the store cannot be read."""
        with _errors(what):
            answer = self.client().get_object(Bucket=self.bucket, Key=key)
            body = answer["Body"]
            try:
                if int(answer.get("ContentLength") or 0) > limit:
                    raise SnapshotRefused(f"{CHANGED} ({what} is larger than any a node writes)")
                data: bytes = body.read(limit + 1)
            finally:
                body.close()
        if len(data) > limit:
            raise SnapshotRefused(f"{CHANGED} ({what} is larger than any a node writes)")
        return data

    def get_chunk(self, agent_id: str, chunk: Chunk) -> bytes:
        """The checked bytes of ``chunk`` (``decode_chunk``). Raises ``SnapshotRefused`` or ``SnapshotError``."""
        stored = self.get(self.chunk_key(agent_id, chunk.sha256), MAX_CHUNK + 1024, f"chunk {chunk.sha256[:12]}")
        return decode_chunk(stored, chunk)

    def stream(self, key: str, what: str) -> Any:
        """A streaming body of the object at ``key`` (``read(n)``, ``close()``). Raises like ``get``."""
        with _errors(what):
            return self.client().get_object(Bucket=self.bucket, Key=key)["Body"]

    def delete(self, key: str) -> None:
        """Delete ``key`` (best effort: a leftover object costs storage, not correctness)."""
        self.delete_many([key])

    def delete_many(self, keys: Iterable[str]) -> int:
        """Delete ``keys``, a thousand per request (best effort). Returns how many were asked."""
        batch: list[str] = []
        asked = 0
        for key in [*keys, None]:
            if key is not None:
                batch.append(key)
            if batch and (key is None or len(batch) == 1000):
                try:
                    self.client().delete_objects(
                        Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
                    )
                except Exception:  # a lifecycle rule on the bucket can collect leftovers
                    pass
                asked += len(batch)
                batch = []
        return asked

    def chunks_of(self, agent_id: str) -> dict[str, float]:
        """Every chunk stored for ``agent_id``: ``{sha256: last modified (Unix s)}``. Raises ``SnapshotError``."""
        prefix = self.chunk_key(agent_id, "")
        found: dict[str, float] = {}
        with _errors(f"chunks of {agent_id} not listed"):
            for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for obj in page.get("Contents", []):
                    modified = obj.get("LastModified")
                    ts = modified.timestamp() if isinstance(modified, datetime) else 0.0
                    found[obj["Key"][len(prefix) :]] = ts
        return found
