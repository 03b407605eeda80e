"""Snapshots of homes (``docs/placement.md``, issue 30 items 1-3), against a real S3 server
(SeaweedFS, ``devtools.object_store``) and real quota homes (loop-mounted ext4 images, an agent uid
each, as a root worker makes them):

- a snapshot keeps files, directories, links, permission bits and holes, and nothing dangerous;
- only what changed is uploaded, and chunks no snapshot references are collected;
- a bucket writer without the nodes' key cannot get a changed or swapped snapshot restored, and the
  model is told the truth;
- a snapshot signed with the key (a leaked key) still cannot write outside the home: the public
  tarfile escapes and their manifest twins change nothing outside it, and are refused before any
  member is written;
- a sparse home is stored as sparse; a home over its bound fails alone, with the reason recorded;
- the node's snapshots share its threads round robin.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tarfile
import threading
import time
import zlib
from pathlib import Path

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from devtools.object_store import ObjectStore
from tests.support import tar_escapes
from worker.placement import homes as node_homes
from worker.placement.entries import DIR, FILE, LINK, Chunk, Entry, encode
from worker.placement.home_writer import HomeWriter, WriteRefused
from worker.placement.homes import NodeHomes
from worker.placement.keeper import Keeper
from worker.placement.records import NODES_KEY, Placement, rendezvous
from worker.placement.restorer import Restorer, Wanted, capacity, empty_home, python_has_tarfile_fixes
from worker.placement.scheduler import FairScheduler
from worker.placement.signing import Header, SnapshotKey, SnapshotRefused
from worker.placement.snapshots import SnapshotStore
from worker.placement.taker import Taker
from worker.settings import Settings
from worker.tools.computer import homes as computer_homes

KEY = "a-test-key-of-the-nodes-" + "k" * 24
TTL = 120.0
MiB = 1024**2


@pytest.fixture(scope="module")
def r():
    srv = EmbeddedRedis()
    client = redis.Redis.from_url(srv.start())
    yield client
    client.close()
    srv.stop()


@pytest.fixture(autouse=True)
def _clean(r):
    for key in r.scan_iter("agent:*"):
        r.delete(key)


@pytest.fixture(scope="module")
def store():
    s = ObjectStore().start()
    saved = {k: os.environ.get(k) for k in s.credentials}
    os.environ.update(s.credentials)
    yield s
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    s.stop()


@pytest.fixture
def snapshots(store) -> SnapshotStore:
    return SnapshotStore(store.url(f"t{time.monotonic_ns()}"), store.endpoint)


@pytest.fixture
def root(tmp_path):
    """A homes root; every quota image mounted under it is released at the end."""
    path = tmp_path / "homes"
    path.mkdir()
    os.chmod(path, 0o755)
    yield path
    computer_homes.release_all(path)


QUOTA = Settings(home_quota_mb=64, home_image_preallocate=False)


def quota_home(root: Path, agent: str) -> tuple[Path, tuple[int, int]]:
    """A home as a root worker makes it: a 64 MB ext4 image, mounted, owned by the agent's uid."""
    ready = computer_homes.provision(QUOTA, root / agent)
    assert ready.uid is not None and ready.gid is not None and ready.uid != 0
    return ready.path, (ready.uid, ready.gid)


def take(snapshots: SnapshotStore, home: Path, agent: str, epoch: int = 1, known=None, files=None):
    """Run a ``Taker`` to its end: the ``Taken``."""
    steps = Taker(snapshots, SnapshotKey(KEY)).take(
        home, agent, epoch, "node-a", known=known if known is not None else set(), files=files or {}, bound=None
    )
    try:
        while True:
            next(steps)
    except StopIteration as done:
        return done.value


def wanted(taken, agent: str, epoch: int = 1) -> Wanted:
    return Wanted(agent, taken.object, epoch, "manifest")


def restore(snapshots, w: Wanted, home: Path, owner, key: str = KEY) -> int:
    return Restorer(snapshots, SnapshotKey(key)).restore(w, home, owner, capacity(home))


def put_signed(snapshots: SnapshotStore, agent: str, fmt: str, body: bytes, epoch: int = 1, key: str = KEY) -> Wanted:
    """What a holder of the key (a leaked node key) can put in the store: any body, signed."""
    obj = snapshots.new_manifest_key(agent, epoch)
    header = Header(agent, epoch, obj, "attacker", time.time(), fmt, hashlib.sha256(body).hexdigest(), len(body))
    snapshots.put(obj, SnapshotKey(key).seal(header, body))
    return Wanted(agent, obj, epoch, fmt)


def tree(home: Path) -> dict[str, tuple]:
    """Everything under ``home``: type, permission bits, content or target, owner."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(home):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, home)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", os.readlink(path), st.st_uid)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", stat.S_IMODE(st.st_mode), st.st_uid)
            else:
                out[rel] = ("f", stat.S_IMODE(st.st_mode), Path(path).read_bytes(), st.st_uid)
    return out


# ----- what a snapshot keeps ---------------------------------------------------------------------


def test_a_snapshot_keeps_files_dirs_links_modes_mtimes_and_holes_and_nothing_dangerous(snapshots, root):
    home, owner = quota_home(root, "keeper-a")
    (home / "notes/deep").mkdir(parents=True)
    (home / "notes/deep/plan.md").write_text("step 1\n")
    os.chmod(home / "notes/deep/plan.md", 0o640)
    os.utime(home / "notes/deep/plan.md", ns=(1_600_000_000_123_456_789, 1_600_000_000_123_456_789))
    (home / "tool").write_text("#!/bin/sh\n")
    os.chmod(home / "tool", 0o4755)  # setuid: a snapshot never carries it
    os.mkfifo(home / "pipe")
    os.symlink("notes/deep/plan.md", home / "link")
    os.symlink("/etc/passwd", home / "abs-link")  # leads outside: left out
    os.symlink("../../x", home / "notes/up")  # climbs out: left out
    with open(home / "sparse.img", "wb") as f:  # 512 MiB apparent, 2 blocks of data
        f.truncate(512 * MiB)
        f.seek(100 * MiB)
        f.write(b"middle")
    (home / "ro").mkdir()
    os.chmod(home / "ro", 0o555)
    taken = take(snapshots, home, "keeper-a")
    assert taken.uploaded < 64 * 1024  # holes cost nothing
    assert sorted(taken.left_out) == ["abs-link -> /etc/passwd", "notes/up -> ../../x", "pipe"]

    target, target_owner = quota_home(root, "keeper-b")
    restore(snapshots, wanted(taken, "keeper-a"), target, target_owner)
    got = tree(target)
    assert got["notes/deep/plan.md"] == ("f", 0o640, b"step 1\n", target_owner[0])
    assert (target / "notes/deep/plan.md").stat().st_mtime_ns == 1_600_000_000_123_456_789  # mtimes kept
    assert got["tool"][1] == 0o755  # no setuid bit
    assert got["link"] == ("l", "notes/deep/plan.md", target_owner[0])
    assert got["ro"] == ("d", 0o555, target_owner[0])
    assert "pipe" not in got and "abs-link" not in got and "notes/up" not in got
    st = (target / "sparse.img").stat()
    assert st.st_size == 512 * MiB and st.st_blocks * 512 <= 64 * 1024  # still sparse
    with open(target / "sparse.img", "rb") as f:
        f.seek(100 * MiB)
        assert f.read(6) == b"middle"
    assert {v[-1] for v in got.values()} == {target_owner[0]}  # all the agent's, nothing root's


def test_only_what_changed_is_uploaded_and_replaced_chunks_are_collected(r, snapshots, root, tmp_path, store):
    """A 24 MiB home, then 1 MiB changed in the middle of one file: the second snapshot uploads the
    chunks around the change and the manifest, and collects the chunks only the first referenced."""
    node = NodeHomes(Placement(r, TTL), Settings(homes_root=root, node_name="n1", snapshot_key=KEY), "n1", snapshots)
    node.placement.beat("n1")
    node.admit("inc", destructive=True).release()
    home = node.home("inc")
    for i in range(3):
        (home / f"data-{i}.bin").write_bytes(os.urandom(8 * MiB))
    assert node.snapshot("inc") == "stored"
    first = node.placement.snapshot("inc")
    assert first.uploaded >= 24 * MiB
    with open(home / "data-1.bin", "r+b") as f:
        f.seek(3 * MiB)
        f.write(os.urandom(MiB))
    assert node.snapshot("inc") == "stored"
    second = node.placement.snapshot("inc")
    assert second.bytes == 24 * MiB
    assert second.uploaded < 6 * MiB, second.uploaded  # a few chunks, not the home
    prefix = snapshots.chunk_key("inc", "")
    stored = {k[len(prefix) - len(snapshots.prefix) - 1 :] for k in store.objects(prefix)}
    live = Restorer(snapshots, SnapshotKey(KEY)).chunks_of(Wanted("inc", second.object, 1, "manifest"))
    assert {k.rsplit("/", 1)[1] for k in store.objects(prefix)} == live  # nothing else is kept
    assert stored and store.objects(snapshots.chunk_key("inc", "").rsplit("/chunks/", 1)[0] + "/manifests/") == [
        second.object
    ]


def test_chunks_of_failed_snapshots_are_swept_only_once_older_than_the_grace(r, snapshots, root, store, monkeypatch):
    node = NodeHomes(Placement(r, TTL), Settings(homes_root=root, node_name="n1", snapshot_key=KEY), "n1", snapshots)
    node.placement.beat("n1")
    node.admit("gc", destructive=True).release()
    (node.home("gc") / "f").write_text("kept")
    orphan = "0" * 64
    snapshots.put_chunk("gc", orphan, b"left by a snapshot that was refused")
    assert node.snapshot("gc") == "stored"
    assert snapshots.chunk_key("gc", orphan) in store.objects()  # younger than the grace: may be in use
    monkeypatch.setattr(node_homes, "GC_GRACE", -1.0)
    node._known["gc"].swept_at = 0.0
    node.placement.mark_dirty("n1", "gc")
    assert node.snapshot("gc") == "stored"
    assert snapshots.chunk_key("gc", orphan) not in store.objects()
    assert snapshots.chunk_key("gc", hashlib.sha256(b"kept").hexdigest()) in store.objects()


# ----- a bucket writer without the key ---------------------------------------------------------


def _tamper_manifest(snapshots, w: Wanted, body_change=None, other=None) -> None:
    obj = snapshots.client().get_object(Bucket=snapshots.bucket, Key=w.object)["Body"].read()
    if other is not None:
        obj = other
    elif body_change is not None:
        obj = body_change(obj)
    snapshots.client().put_object(Bucket=snapshots.bucket, Key=w.object, Body=obj)


@pytest.mark.parametrize(
    "attack",
    [
        "a byte of the manifest changed",
        "signed with another key",
        "another agent's snapshot put in its place",
        "an older snapshot of the same agent and epoch put in its place",
        "a chunk replaced",
        "a chunk deleted",
    ],
)
def test_a_changed_or_swapped_snapshot_is_refused_before_it_is_read(snapshots, root, attack):
    home, owner = quota_home(root, "victim")
    (home / "a.txt").write_text("version 1\n")
    older = take(snapshots, home, "victim")
    (home / "a.txt").write_text("version 2, the one recorded\n")
    (home / "b.bin").write_bytes(os.urandom(300_000))
    current = take(snapshots, home, "victim")
    w = wanted(current, "victim")
    target, target_owner = quota_home(root, "victim-restored")
    (target / "stale.txt").write_text("the home before the restore\n")
    expect = "it was changed after it was taken"
    if attack == "a byte of the manifest changed":
        _tamper_manifest(snapshots, w, body_change=lambda b: b[:-10] + bytes([b[-10] ^ 1]) + b[-9:])
    elif attack == "signed with another key":
        body = zlib.compress(encode([Entry(FILE, "planted", 0o644, 0)]))
        forged = put_signed(snapshots, "victim", "manifest", body, key="an-attackers-own-key-" + "x" * 20)
        _tamper_manifest(snapshots, w, other=snapshots.get(forged.object, 1 << 20, "x"))
    elif attack == "another agent's snapshot put in its place":
        (home / "a.txt").write_text("someone else's\n")
        theirs = take(snapshots, home, "someone-else")
        _tamper_manifest(snapshots, w, other=snapshots.get(theirs.object, 1 << 20, "x"))
    elif attack == "an older snapshot of the same agent and epoch put in its place":
        _tamper_manifest(snapshots, w, other=snapshots.get(older.object, 1 << 20, "x"))
    elif attack == "a chunk replaced":
        digest = hashlib.sha256((home / "b.bin").read_bytes()).hexdigest()
        chunk = next(c for c in current.files["b.bin"][1])
        assert chunk.sha256 == digest
        snapshots.put(snapshots.chunk_key("victim", digest), b"r" + os.urandom(300_000))
    elif attack == "a chunk deleted":
        chunk = current.files["b.bin"][1][0]
        snapshots.delete(snapshots.chunk_key("victim", chunk.sha256))
        expect = "missing from the store"
    with pytest.raises(SnapshotRefused, match=expect):
        restore(snapshots, w, target, target_owner)
    left = tree(target)
    assert "planted" not in left and left.get("a.txt", ("f", 0, b""))[2] != b"someone else's\n"
    # Refused before a byte was written, or emptied when a chunk failed on the way: never half a home.
    assert set(left) in ({"stale.txt"}, set()), left


def test_snapshots_are_signed_not_encrypted(snapshots, root):
    """What the docs say a bucket reader gets: the home's bytes (a chunk inflates to the file)."""
    home, _ = quota_home(root, "plain")
    (home / "secret.txt").write_text("the agent's notes, readable in the bucket\n" * 100)
    taken = take(snapshots, home, "plain")
    (chunk,) = taken.files["secret.txt"][1]
    stored = snapshots.get(snapshots.chunk_key("plain", chunk.sha256), 1 << 20, "chunk")
    assert zlib.decompress(stored[1:]) == (home / "secret.txt").read_bytes()


def test_the_model_is_told_the_truth_and_operators_see_the_reason(r, snapshots, tmp_path):
    p = Placement(r, TTL)
    a = NodeHomes(p, Settings(homes_root=tmp_path / "na", node_name="na", snapshot_key=KEY), "na", snapshots)
    b = NodeHomes(p, Settings(homes_root=tmp_path / "nb", node_name="nb", snapshot_key=KEY), "nb", snapshots)
    for n in (a, b):
        n.placement.beat(n.node)
    agent = next(f"t{i}" for i in range(100) if rendezvous(f"t{i}", ["na", "nb"]) == "na")
    a.admit(agent, destructive=True).release()
    (a.home(agent) / "work.txt").write_text("mine")
    assert a.snapshot(agent) == "stored"
    snap = p.snapshot(agent)
    _tamper_manifest(
        snapshots, Wanted(agent, snap.object, 1, "manifest"), body_change=lambda x: x.replace(b"{", b"[", 1)
    )
    sec, _ = r.time()
    r.zadd(NODES_KEY, {"na": sec - 10 * TTL})
    moved = b.admit(agent, destructive=False)
    moved.release()
    assert moved.notice.startswith("[computer reset]"), moved.notice
    assert "the snapshot was refused: it was changed after it was taken" in moved.notice
    assert list(b.home(agent).iterdir()) == []
    record = p.snapshot_record(agent)
    assert record["failure"].startswith("restore refused: it was changed after it was taken")
    assert record["failed_node"] == "nb"
    assert "it was changed after it was taken" in b.describe()["snapshot_failure"]


def test_a_snapshot_from_before_signing_is_refused_and_said_so(snapshots, root):
    home, owner = quota_home(root, "legacy")
    with pytest.raises(SnapshotRefused, match="earlier version, which did not sign snapshots"):
        restore(snapshots, Wanted("legacy", "snapshots/legacy/1-0-x.tar.gz", 1, ""), home, owner)


def test_a_store_without_a_key_is_a_start_up_error(r, tmp_path):
    with pytest.raises(ValueError, match="AGENT_SNAPSHOT_KEY"):
        Settings(snapshot_store="s3://bucket/prefix")
    with pytest.raises(ValueError, match="at least 32 characters"):
        Settings(snapshot_store="s3://bucket/prefix", snapshot_key="short")
    with pytest.raises(ValueError, match="AGENT_SNAPSHOT_KEY"):
        NodeHomes(Placement(r, TTL), Settings(homes_root=tmp_path), "n", SnapshotStore("s3://b/p"))


# ----- a holder of the key: the escapes -----------------------------------------------------------


@pytest.fixture
def surroundings(root):
    """The victim's home among things an escape would reach: another agent's home, a file in the
    homes root, and /tmp. ``changed()`` lists what differs afterwards outside the victim's home."""
    home, owner = quota_home(root, "victim")
    other, _ = quota_home(root, "other")
    (other / "private.txt").write_text("another agent's file\n")
    (root / "flag").write_text("original\n")
    (home / "stale.txt").write_text("the home before the restore\n")

    def outside() -> dict:
        os.sync()  # what was written before is on the images now: only later changes show
        state = {}
        for base in (root,):
            for dirpath, dirnames, filenames in os.walk(base):
                if Path(dirpath) == home:
                    dirnames[:] = []
                    continue
                dirnames[:] = [d for d in dirnames if Path(dirpath, d) != home]
                for name in dirnames + filenames + ["."]:
                    path = os.path.join(dirpath, name)
                    st = os.lstat(path)
                    if path.endswith(".img"):  # a home's backing file: ext4 writes it lazily (its
                        state[path] = (st.st_mode, st.st_uid)  # inode tables); its files are compared above
                        continue
                    content = Path(path).read_bytes() if stat.S_ISREG(st.st_mode) else b""
                    state[path] = (st.st_mode, st.st_uid, st.st_mtime_ns, content)
        return state

    def marked_in_tmp() -> list[str]:
        found = []
        for dirpath, dirnames, filenames in os.walk("/tmp"):
            if dirpath.count("/") > 3:
                dirnames[:] = []
            for name in dirnames + filenames:
                if tar_escapes.MARK in name:
                    found.append(os.path.join(dirpath, name))
        return found

    before = outside()

    def changed() -> list[str]:
        after = outside()
        diff = [p for p in set(before) | set(after) if before.get(p) != after.get(p)]
        return sorted(diff) + marked_in_tmp()

    return home, owner, changed


@pytest.mark.parametrize("name", sorted(tar_escapes.ESCAPES))
def test_a_signed_tar_escape_changes_nothing_outside_the_home(snapshots, surroundings, name):
    """CVE-2025-4517 and the other public tarfile escapes, signed with the nodes' key (as a leaked
    key could): refused whole before any member is written, nothing outside the home changes."""
    home, owner, changed = surroundings
    w = put_signed(snapshots, "victim", "tar", tar_escapes.build(name, str(home)))
    with pytest.raises(SnapshotRefused):
        restore(snapshots, w, home, owner)
    assert changed() == []
    assert set(tree(home)) == {"stale.txt"}  # refused before the first write: the home as it was


def test_the_bypass_archive_escapes_tarfiles_own_filter_on_an_unfixed_python(tmp_path):
    """The archive is the real thing: on this interpreter, ``tarfile``'s ``data`` filter lets it out
    when the interpreter lacks the fix (Python < 3.11.13 / 3.12.11 / 3.13.4: no ``os.path.ALLOW_MISSING``),
    and stops it when it has it. The restore above never relies on that filter."""
    homes = tmp_path / "scratch"
    (homes / "home").mkdir(parents=True)
    (homes / "flag").write_text("original\n")
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(tar_escapes.realpath_overflow(str(homes / "home")))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(homes / "home", filter="data")
    except (OSError, KeyError, tarfile.TarError):
        pass
    escaped = (homes / "flag").read_text() != "original\n"
    assert escaped == (not python_has_tarfile_fixes()), (sys_version(), escaped)


def sys_version() -> str:
    import sys

    return sys.version.split()[0]


def test_a_signed_tar_of_a_plain_home_is_restored_member_by_member(snapshots, root):
    """The previous format still reads when signed, through the same checks and writer."""
    src = root.parent / "plain"
    (src / "d").mkdir(parents=True)
    (src / "d/f.txt").write_text("data")
    os.symlink("d/f.txt", src / "link")
    archive = root.parent / "plain.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for entry in sorted(os.listdir(src)):
            tar.add(src / entry, arcname=entry)
    home, owner = quota_home(root, "tarred")
    w = put_signed(snapshots, "tarred", "tar", archive.read_bytes())
    restore(snapshots, w, home, owner)
    assert (home / "d/f.txt").read_text() == "data" and os.readlink(home / "link") == "d/f.txt"
    assert (home / "d/f.txt").stat().st_uid == owner[0]


def _hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


MANIFEST_ESCAPES = {
    "dot-dot path": [Entry(FILE, "../escaped", 0o644, 0)],
    "absolute path": [Entry(FILE, "/tmp/escaped", 0o644, 0)],
    "link leading out": [Entry(LINK, "out", 0o777, target="../other")],
    "absolute link": [Entry(LINK, "out", 0o777, target="/tmp")],
    "file under a link": [Entry(LINK, "in", 0o777, target="."), Entry(FILE, "in/x", 0o644, 0)],
    "listed twice": [Entry(DIR, "d", 0o755), Entry(LINK, "d", 0o777, target="sub")],
    "setuid bit": [Entry(FILE, "suid", 0o4755, 0)],
    "empty component": [Entry(DIR, "a//b", 0o755)],
    "more data than the quota": [
        Entry(FILE, f"big{i}", 0o644, 8 << 20, (Chunk(0, 8 << 20, _hash(bytes([i]))),)) for i in range(20)
    ],
    "a chunk longer than any": [Entry(FILE, "f", 0o644, 64 << 20, (Chunk(0, 64 << 20, _hash(b"x")),))],
    "overlapping chunks": [Entry(FILE, "f", 0o644, 100, (Chunk(0, 60, _hash(b"a")), Chunk(50, 50, _hash(b"b"))))],
    "more entries than inodes": [Entry(FILE, f"f{i}", 0o644, 0) for i in range(70_000)],
}


@pytest.mark.parametrize("name", sorted(MANIFEST_ESCAPES))
def test_a_signed_manifest_that_leaves_the_home_is_refused_before_anything_is_written(snapshots, surroundings, name):
    home, owner, changed = surroundings
    body = zlib.compress(encode(MANIFEST_ESCAPES[name]))
    w = put_signed(snapshots, "victim", "manifest", body)
    with pytest.raises(SnapshotRefused):
        restore(snapshots, w, home, owner)
    assert changed() == []
    assert set(tree(home)) == {"stale.txt"}  # refused before the first write: the home as it was


def test_the_writer_runs_as_the_agent_and_never_follows_a_link(root, surroundings):
    """The second wall, without the parent's checks: the writer process itself (as the agent's uid)
    refuses a path through a link it made, a link leading out, and cannot write where the agent
    cannot (the homes root), whatever it is told."""
    home, owner, changed = surroundings
    with HomeWriter(home, owner, 1 << 20, 100) as w:
        w.symlink("tmp", "sub")
        w.mkdir("sub", 0o755)
        w.open_file("tmp/through-link", 0o644, 4)  # "tmp" is a link: O_NOFOLLOW refuses it
        with pytest.raises(WriteRefused, match="Too many levels of symbolic links|Not a directory"):
            w.finish()
    with HomeWriter(home, owner, 1 << 20, 100) as w:
        w.symlink("out", "../other")
        with pytest.raises(WriteRefused, match="leading outside the home"):
            w.finish()
    with HomeWriter(root, owner, 1 << 20, 100) as w:  # told to write into the homes root itself
        w.open_file(f"planted-{tar_escapes.MARK}", 0o644, 0)
        with pytest.raises(WriteRefused, match="Permission denied"):
            w.finish()
    assert changed() == []
    with HomeWriter(home, owner, 1 << 20, 100) as w:
        w.open_file("mine.txt", 0o600, 2)
        w.write(0, b"ok")
        w.close_file()
        w.finish()
    st = (home / "mine.txt").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (owner[0], owner[1], 0o600)


def test_a_home_is_emptied_as_its_agent_and_what_it_cannot_remove_by_the_worker(root):
    home, owner = quota_home(root, "emptied")
    (home / "mine/deep").mkdir(parents=True)
    (home / "mine/deep/f").write_text("x")
    os.chmod(home / "mine", 0o500)  # read-only: the agent may still empty it
    os.symlink("/etc", home / "etc-link")  # removed, never followed
    (home / "lost+found").mkdir()  # root's, 0700: what e2fsck leaves
    (home / "lost+found/#12").write_text("y")
    os.chmod(home / "lost+found", 0o700)
    empty_home(home, owner)
    assert list(home.iterdir()) == [] and os.path.exists("/etc/passwd")


# ----- bounded by the quota ---------------------------------------------------------------------


def test_sixteen_sparse_gigabytes_in_a_64_mb_home_snapshot_as_what_they_use(snapshots, root):
    """Issue 30's attack: ``truncate -s 1G`` sixteen times in a 64 MB home packed to a 75 MB
    archive on the node's disk. Now: stored as holes (a few KB of manifest), and restored as holes
    into a home of the same size."""
    home, owner = quota_home(root, "sparse")
    for i in range(16):
        with open(home / f"big-{i}", "wb") as f:
            f.truncate(1024**3)
    (home / "real.txt").write_text("some real data\n")
    taken = take(snapshots, home, "sparse")
    assert taken.data == len("some real data\n")
    assert taken.uploaded < 64 * 1024, taken.uploaded
    target, target_owner = quota_home(root, "sparse-restored")
    restore(snapshots, wanted(taken, "sparse"), target, target_owner)
    for i in range(16):
        st = (target / f"big-{i}").stat()
        assert st.st_size == 1024**3 and st.st_blocks == 0
    assert (target / "real.txt").read_text() == "some real data\n"


def test_a_home_over_its_bound_fails_alone_with_the_reason_recorded(r, snapshots, tmp_path):
    """A home holding more data than its quota (here a plain directory under a 1 MB setting) is not
    stored; the reason is in its snapshot record and the node's info; the other agent of the same
    round is stored."""
    settings = Settings(homes_root=tmp_path / "n1", node_name="n1", snapshot_key=KEY, home_quota_mb=1)
    node = NodeHomes(Placement(r, TTL), settings, "n1", snapshots)
    node.placement.beat("n1")
    for agent in ("big", "small"):
        node.admit(agent, destructive=True).release()
    (node.home("big") / "blob").write_bytes(os.urandom(2 * MiB))
    (node.home("small") / "note").write_text("fine")
    keeper = Keeper(node, interval=1, call_wait=5)
    assert keeper.snapshot_changed() == {"big": "over bound", "small": "stored"}
    record = node.placement.snapshot_record("big")
    assert "more than 1 MiB of data, more than its quota" in record["failure"]
    assert "big: the home holds more than 1 MiB" in node.describe()["snapshot_failure"]
    assert node.placement.snapshot("small") is not None and node.placement.snapshot("big") is None
    keeper.scheduler.stop()


# ----- several at once ---------------------------------------------------------------------------


def test_the_scheduler_shares_its_threads_round_robin():
    """With one thread, short jobs submitted after a long one finish while it still runs: each
    step goes to the back of the line."""
    sched = FairScheduler(1, name="test-fair")
    finished: list[str] = []
    gate = threading.Event()

    def job(n: int):
        for _ in range(n):
            yield
        return n

    def long_job():
        while not gate.is_set():
            yield
        return "long"

    def done(key, result, error):
        finished.append(key)

    assert sched.submit("long", long_job(), done)
    assert not sched.submit("long", long_job(), done)  # one job per key
    for i in range(5):
        assert sched.submit(f"short-{i}", job(20), done)
    assert sched.wait({f"short-{i}" for i in range(5)}, timeout=60)
    assert "long" in sched.in_flight() and finished == [f"short-{i}" for i in range(5)]
    gate.set()
    assert sched.wait(timeout=60) and finished[-1] == "long"
    sched.stop()


def test_a_snapshot_cut_short_by_a_stop_marks_its_home_changed_again(r, snapshots, tmp_path):
    """A warm shutdown closes the snapshots still in flight: their homes are marked changed again, so
    the node's next start snapshots them (nothing is left unsaved by a stop)."""
    node = NodeHomes(
        Placement(r, TTL), Settings(homes_root=tmp_path, node_name="n1", snapshot_key=KEY), "n1", snapshots
    )
    keeper = Keeper(node, interval=1, call_wait=5)
    closed, started = threading.Event(), threading.Event()

    def endless():
        started.set()
        try:
            while True:
                yield 0.01
        finally:
            closed.set()

    assert keeper.scheduler.submit("cut", endless(), keeper._done(False))
    assert started.wait(30)
    keeper.scheduler.stop()
    assert closed.is_set() and node.placement.take_dirty("n1") == {"cut"}
