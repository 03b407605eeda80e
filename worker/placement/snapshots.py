"""Snapshots of agent homes in an object store (S3 API, through boto3).

A snapshot is a gzip'd tar of the home's contents: regular files, directories and symbolic links
(never followed); FIFOs, sockets and device files are left out. It is restored with tarfile's
``data`` filter, which refuses absolute paths, paths and links leading outside the home and
device files, and drops setuid/setgid bits and owners: an archive, even a tampered one, cannot
write outside the home it is restored into.

Objects are ``<prefix>/<agent_id>/<epoch>-<ms>-<random>.tar.gz``: each snapshot is a new object,
recorded in Redis only if the taker still holds the agent (``records.Placement.commit``); the one
it replaces is deleted then, and a refused one at once. What a root worker restores belongs to
the home's owner (the agent's host uid), never to root.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


class SnapshotError(Exception):
    """The object store could not be reached, or refused the request, or the archive is bad."""


def clear_dir(path: Path) -> None:
    """Remove everything inside ``path`` (not ``path`` itself), whatever the agent left there:
    read-only directories, symbolic links (removed, never followed)."""

    def retry_writable(func: Any, target: str, _exc: Any) -> None:
        parent = os.path.dirname(target)
        os.chmod(parent, stat.S_IRWXU)  # a directory the agent made read-only
        if os.path.isdir(target) and not os.path.islink(target):
            os.chmod(target, stat.S_IRWXU)
        func(target)

    with os.scandir(path) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, onerror=retry_writable)
            else:
                try:
                    os.unlink(entry.path)
                except PermissionError:
                    retry_writable(os.unlink, entry.path, None)


def _keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # Only what a home needs: FIFOs, sockets and devices are not files to keep.
    return info if (info.isreg() or info.isdir() or info.issym() or info.islnk()) else None


def pack_home(home: Path, archive: Path, compresslevel: int = 1) -> int:
    """Write ``home``'s contents to ``archive`` (tar.gz); returns the archive's size in bytes."""
    with tarfile.open(archive, "w:gz", compresslevel=compresslevel) as tar:
        with os.scandir(home) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                tar.add(entry.path, arcname=entry.name, recursive=True, filter=_keep)
    return archive.stat().st_size


def unpack_home(archive: Path, home: Path) -> None:
    """Replace ``home``'s contents with ``archive``'s (tarfile's ``data`` filter). Raises
    ``SnapshotError`` for an archive that is not a tar.gz or holds a member the filter refuses."""
    clear_dir(home)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(home, filter="data")
        _own_like(home)
    except (tarfile.TarError, EOFError, OSError) as exc:
        clear_dir(home)  # never leave half a home
        raise SnapshotError(f"the snapshot could not be unpacked: {exc}") from exc


def _own_like(home: Path) -> None:
    # A root worker extracts as root: give everything to the home's owner (the agent's host uid),
    # so the agent can change what was restored and nothing in its home is root's.
    if os.geteuid() != 0:
        return
    st = home.stat()
    for dirpath, dirnames, filenames in os.walk(home):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), st.st_uid, st.st_gid)


class SnapshotStore:
    """The object store at ``url`` (``s3://bucket/prefix``), through ``endpoint_url`` when given (an
    S3-compatible server). Credentials and region: boto3's usual lookup (``AWS_*`` variables, files)."""

    def __init__(self, url: str, endpoint_url: str | None = None):
        parts = urlsplit(url)
        self.url = url
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.endpoint_url = endpoint_url
        self._client: tuple[int, Any] | None = None

    def client(self) -> Any:
        """A boto3 S3 client for this process (re-made after a fork: a client is not fork-safe)."""
        if self._client is None or self._client[0] != os.getpid():
            import boto3
            from botocore.config import Config

            config = Config(connect_timeout=5, read_timeout=60, retries={"max_attempts": 3, "mode": "standard"})
            session = boto3.session.Session()
            self._client = (os.getpid(), session.client("s3", endpoint_url=self.endpoint_url, config=config))
        return self._client[1]

    def _key(self, agent_id: str, epoch: int) -> str:
        name = f"{agent_id}/{epoch}-{int(time.time() * 1000)}-{uuid.uuid4().hex[:8]}.tar.gz"
        return f"{self.prefix}/{name}" if self.prefix else name

    def put(self, home: Path, agent_id: str, epoch: int, workdir: Path) -> tuple[str, int]:
        """Pack ``home`` and upload it; returns ``(object key, bytes)``. Raises ``SnapshotError``."""
        archive = workdir / f"snap-{uuid.uuid4().hex}.tar.gz"
        try:
            size = pack_home(home, archive)
            key = self._key(agent_id, epoch)
            self.client().upload_file(str(archive), self.bucket, key)
            return key, size
        except SnapshotError:
            raise
        except Exception as exc:  # botocore's errors, a home the worker cannot read
            raise SnapshotError(f"snapshot of {agent_id} not stored: {exc.__class__.__name__}: {exc}") from exc
        finally:
            archive.unlink(missing_ok=True)

    def restore(self, key: str, home: Path, workdir: Path) -> None:
        """Replace ``home``'s contents with snapshot ``key``. Raises ``SnapshotError`` (the home is
        then untouched when the download failed, empty when the archive was bad)."""
        archive = workdir / f"restore-{uuid.uuid4().hex}.tar.gz"
        try:
            try:
                self.client().download_file(self.bucket, key, str(archive))
            except Exception as exc:
                raise SnapshotError(f"snapshot {key} not read: {exc.__class__.__name__}: {exc}") from exc
            unpack_home(archive, home)
        finally:
            archive.unlink(missing_ok=True)

    def delete(self, key: str) -> None:
        """Delete snapshot ``key`` (best effort: a leftover object costs storage, not correctness)."""
        try:
            self.client().delete_object(Bucket=self.bucket, Key=key)
        except Exception:  # a lifecycle rule on the bucket can collect leftovers
            pass
