"""Snapshots of homes (docs/placement.md, "Incremental"): what an incremental snapshot uploads, and how late other
agents' snapshots come while one agent's 1 GiB home is snapshotted. One embedded Redis, one SeaweedFS
S3 server (``devtools.object_store``), a node's ``NodeHomes`` and ``Keeper`` in this process (its
real scheduler threads and chores loop); homes are plain directories (the quota images change
nothing here).

1. **Bytes uploaded after a 1 MiB change to a 1 GiB home** (random bytes: nothing compresses), each
   round a different change, against the floor measured in the same run: a plain full upload of the
   same files (what ``aws s3 cp --recursive`` sends), alternated with the snapshots. Kinds of change:
   1 MiB overwritten in the middle of a file, 1 MiB inserted in the middle of one (everything after
   it shifts), 1 MiB appended.
2. **The worst snapshot delay of the other agents** (from the end of a destructive call to the
   commit of a snapshot that holds it; ``AGENT_SNAPSHOT_INTERVAL`` = 5 s promises 5 s) while one
   agent's first snapshot of 1 GiB runs, against the same agents with nothing big running (the floor).

Run: ``flock /work/coord/heavy.lock .venv/bin/python bench/snapshots.py`` (heavy: about 1 GiB written
and uploaded several times; on a shared machine, under the lock).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MiB = 1 << 20
KEY = "bench-snapshot-key-" + "b" * 32


def _fill(home: Path, total: int, files: int) -> None:
    home.mkdir(parents=True, exist_ok=True)
    size = total // files
    for i in range(files):
        (home / f"data-{i:03d}.bin").write_bytes(os.urandom(size))


def _change(home: Path, kind: str, n: int, files: int) -> None:
    path = home / f"data-{(n * 7) % files:03d}.bin"
    data = path.read_bytes()
    middle = len(data) // 2
    if kind == "overwrite":
        with open(path, "r+b") as f:
            f.seek(middle)
            f.write(os.urandom(MiB))
    elif kind == "insert":
        path.write_bytes(data[:middle] + os.urandom(MiB) + data[middle:])
    else:
        with open(path, "ab") as f:
            f.write(os.urandom(MiB))


def _full_upload(store, home: Path, prefix: str) -> tuple[int, float]:
    """The floor: every file uploaded whole (``aws s3 cp --recursive``): bytes and seconds."""
    client = store.client()
    sent = 0
    t = time.perf_counter()
    for path in sorted(home.iterdir()):
        client.upload_file(str(path), store.bucket, f"{prefix}/{path.name}")
        sent += path.stat().st_size
    return sent, time.perf_counter() - t


def bytes_uploaded(store, node, args) -> None:
    agent = "bench-incremental"
    node.admit(agent, destructive=True).release()
    home = node.home(agent)
    _fill(home, args.home_mib * MiB, args.files)
    t = time.perf_counter()
    assert node.snapshot(agent) == "stored"
    first = node.placement.snapshot(agent)
    print(
        f"first snapshot of {args.home_mib} MiB: {first.uploaded / MiB:.1f} MiB uploaded in {time.perf_counter() - t:.1f} s"
    )
    rows = []
    for n in range(args.rounds):
        kind = ("overwrite", "insert", "append")[n % 3]
        full_bytes, full_s = _full_upload(store, home, f"floor/{n}")
        _change(home, kind, n, args.files)
        node.placement.mark_dirty(node.node, agent)
        t = time.perf_counter()
        assert node.snapshot(agent) == "stored"
        took = time.perf_counter() - t
        up = node.placement.snapshot(agent).uploaded
        rows.append((kind, full_bytes, full_s, up, took))
        print(
            f"round {n + 1} ({kind} 1 MiB): snapshot {up / MiB:.2f} MiB in {took:.2f} s; "
            f"full upload {full_bytes / MiB:.0f} MiB in {full_s:.1f} s; ratio {up / full_bytes:.4f}"
        )
    ratios = [up / full for _, full, _, up, _ in rows]
    times = [took / full_s for _, _, full_s, _, took in rows]
    print(
        f"median bytes ratio {statistics.median(ratios):.4f} (every round: {', '.join(f'{x:.4f}' for x in ratios)}); "
        f"median time ratio {statistics.median(times):.3f}"
    )


def delays(store, node_homes, args) -> None:
    """Other agents write every ``args.write_every`` s; a monitor notes each commit; the delay of a write
    is the first commit after it minus its time (Redis's clock for both)."""
    from worker.placement.keeper import Keeper

    node = node_homes
    others = [f"bench-other-{i}" for i in range(args.others)]
    for agent in others:
        node.admit(agent, destructive=True).release()
        (node.home(agent) / "notes.txt").write_text("start\n")
    r = node.placement.r

    def now() -> float:
        sec, usec = r.time()
        return sec + usec / 1e6

    def run(label: str, huge: str | None) -> list[float]:
        keeper = Keeper(node, interval=args.interval, call_wait=30, concurrency=args.concurrency)
        stop = threading.Event()
        chores = threading.Thread(target=keeper.run_chores, args=(stop,), daemon=True)
        writes: dict[str, list[float]] = {a: [] for a in others}
        commits: dict[str, list[float]] = {a: [] for a in others}
        done = threading.Event()

        def monitor() -> None:
            last: dict[str, float] = {}
            while not done.is_set():
                for a in others:
                    snap = node.placement.snapshot(a)
                    if snap is not None and snap.taken_at != last.get(a):
                        last[a] = snap.taken_at
                        commits[a].append(snap.taken_at)
                time.sleep(0.05)

        watcher = threading.Thread(target=monitor, daemon=True)
        watcher.start()
        chores.start()
        if huge is not None:
            node.admit(huge, destructive=True).release()  # its first snapshot: the whole GiB
        deadline = time.monotonic() + args.duration
        i = 0
        cap = time.monotonic() + 600

        def going() -> bool:  # the set duration, and with a big home until its snapshot is recorded
            if time.monotonic() >= cap:
                return False
            return time.monotonic() < deadline or (huge is not None and node.placement.snapshot(huge) is None)

        while going():
            for a in others:
                adm = node.admit(a, destructive=True)  # a destructive call: the home is marked changed
                try:
                    with open(node.home(a) / "notes.txt", "a") as f:
                        f.write(f"line {i}\n")
                finally:
                    adm.release()
                writes[a].append(now())
            i += 1
            time.sleep(args.write_every)
        time.sleep(args.interval + 2)  # the last writes' snapshots
        done.set()
        watcher.join()
        stop.set()
        chores.join()
        keeper.scheduler.wait(timeout=600)
        keeper.scheduler.stop()
        found = []
        for a in others:
            for w in writes[a]:
                after = [c for c in commits[a] if c >= w]
                found.append((min(after) - w) if after else float("inf"))
        big = node.placement.snapshot(huge) if huge else None
        extra = f"; the big snapshot: {big.uploaded / MiB:.0f} MiB" if big else ""
        print(
            f"{label}: {len(found)} writes of {len(others)} agents, delay median {statistics.median(found):.2f} s, "
            f"p95 {sorted(found)[int(0.95 * (len(found) - 1))]:.2f} s, worst {max(found):.2f} s{extra}"
        )
        return found

    floor = run("floor (nothing big)", None)
    huge = "bench-huge"
    node.admit(huge, destructive=False).release()
    _fill(node.home(huge), args.home_mib * MiB, args.files)
    loaded = run(f"while {args.home_mib} MiB are snapshotted", huge)
    print(f"worst delay ratio loaded / floor: {max(loaded) / max(floor):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home-mib", type=int, default=1024)
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--others", type=int, default=8)
    parser.add_argument("--duration", type=float, default=30.0, help="seconds the other agents write")
    parser.add_argument("--write-every", type=float, default=1.0)
    parser.add_argument("--interval", type=float, default=5.0, help="AGENT_SNAPSHOT_INTERVAL")
    parser.add_argument("--concurrency", type=int, default=4, help="AGENT_SNAPSHOT_CONCURRENCY")
    parser.add_argument("--only", choices=["bytes", "delays"], default=None)
    args = parser.parse_args()

    import redis

    from devtools.embedded_redis import EmbeddedRedis
    from devtools.object_store import ObjectStore
    from worker.placement.homes import NodeHomes
    from worker.placement.records import Placement
    from worker.placement.snapshots import SnapshotStore
    from worker.settings import Settings

    work = Path(tempfile.mkdtemp(prefix="bench-snapshots-", dir=os.environ.get("BENCH_DIR")))
    srv = EmbeddedRedis()
    r = redis.Redis.from_url(srv.start())
    store = ObjectStore().start()  # a temporary data directory
    os.environ.update(store.credentials)
    try:
        settings = Settings(homes_root=work / "homes", node_name="bench", snapshot_key=KEY, home_quota_mb=0)
        node = NodeHomes(Placement(r, 60), settings, "bench", SnapshotStore(store.url(), store.endpoint))
        beat = threading.Event()

        def beats() -> None:
            while not beat.wait(5):
                node.placement.beat("bench")

        node.placement.beat("bench")
        threading.Thread(target=beats, daemon=True).start()
        print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
        if args.only in (None, "bytes"):
            bytes_uploaded(store, node, args)
        if args.only in (None, "delays"):
            delays(store, node, args)
        beat.set()
    finally:
        store.stop()
        srv.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
