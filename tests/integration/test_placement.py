"""Placement without workers: the records and the rule (against a Redis of its own, so fake nodes
never attract the suite's agents), a node's admission of calls (forward, refuse, materialize:
restored from a snapshot in a real S3 server (SeaweedFS, ``devtools.object_store``), or reset), fencing of stale nodes, the drain pass,
(the snapshots themselves: ``tests/integration/test_snapshots.py``). The same paths with real worker processes:
``tests/integration/test_multinode.py``."""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from pathlib import Path

import pytest
import redis

from devtools.embedded_redis import EmbeddedRedis
from devtools.object_store import ObjectStore
from worker.placement.homes import NodeHomes, node_name
from worker.placement.keeper import Keeper
from worker.placement.records import NODES_KEY, Placement, node_queue, rendezvous
from worker.placement.snapshots import SnapshotStore
from worker.settings import Settings
from worker.tooling.contract import define_worker_tool
from worker.tools.assembly import text_turn_tools
from worker.turn.context import TurnContext

# Long enough that a slow machine never lets a test's node expire by itself; tests kill nodes explicitly.
TTL = 120.0


@pytest.fixture(scope="module")
def r():
    srv = EmbeddedRedis()
    url = srv.start()
    client = redis.Redis.from_url(url)
    yield client
    client.close()
    srv.stop()


@pytest.fixture(autouse=True)
def _clean(r):
    for key in r.scan_iter("agent:*"):
        r.delete(key)


@pytest.fixture(scope="module")
def store():
    s = ObjectStore().start()  # SeaweedFS: a real S3 server
    saved = {k: os.environ.get(k) for k in s.credentials}
    os.environ.update(s.credentials)
    yield s
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    s.stop()


def kill(r, node: str) -> None:
    """The node's heartbeat is ten TTLs old: dead for anyone looking."""
    sec, _ = r.time()
    r.zadd(NODES_KEY, {node: sec - 10 * TTL})


KEY = "k" * 40  # AGENT_SNAPSHOT_KEY of the test's nodes


def homes(r, tmp_path: Path, node: str, store: ObjectStore | None = None) -> NodeHomes:
    settings = Settings(homes_root=tmp_path / node, node_name=node, snapshot_key=KEY)
    snapshots = SnapshotStore(store.url(), store.endpoint) if store else None
    return NodeHomes(Placement(r, ttl=TTL), settings, node, snapshots)


# ----- the contract ------------------------------------------------------------


def test_the_computer_category_marks_its_tools_and_no_other_tool_needs_a_computer(tmp_path):
    ctx = TurnContext(turn_id="t", agent_id="a", home=tmp_path, settings=Settings())
    tools = {t.name: t for t in text_turn_tools(ctx)}
    computer = {n for n, t in tools.items() if t.needs_computer}
    assert computer == {"run_command", "read_file", "write_file", "edit_file", "list_files", "search_files"}
    assert not tools["todo_write"].needs_computer  # its list lives in Redis (docs/placement.md)
    plain = define_worker_tool(name="x", description="x", execute=lambda p, c: None)
    assert plain.needs_computer is False


# ----- the rule ----------------------------------------------------------------


def test_rendezvous_in_redis_is_the_documented_rule_and_spreads_agents(r):
    p = Placement(r, ttl=TTL)
    nodes = ["n1", "n2", "n3"]
    for n in nodes:
        p.beat(n)
    where = {f"agent-{i}": p.locate(f"agent-{i}") for i in range(300)}
    for agent, loc in where.items():
        assert loc.node == rendezvous(agent, nodes) and loc.placed and loc.reason == "new" and loc.epoch == 1
    counts = Counter(loc.node for loc in where.values())
    assert set(counts) == set(nodes) and min(counts.values()) >= 70, counts
    # Sticky: a node that joins takes nobody, a second lookup places nothing.
    p.beat("n4")
    again = p.locate("agent-0")
    assert (again.node, again.epoch, again.placed) == (where["agent-0"].node, 1, False)
    assert p.agents_on("n4") == set()


def test_a_dead_nodes_agents_spread_over_the_live_ones_with_a_new_epoch(r):
    p = Placement(r, ttl=TTL)
    for n in ("n1", "n2", "n3"):
        p.beat(n)
    first = {f"a{i}": p.locate(f"a{i}") for i in range(120)}
    kill(r, "n1")
    moved = {a for a, loc in first.items() if loc.node == "n1"}
    after = {a: p.locate(a) for a in first}
    for a, loc in after.items():
        if a in moved:
            assert loc.node in ("n2", "n3") and loc.epoch == 2 and loc.reason == "node_down" and loc.prev == "n1"
            assert loc.node == rendezvous(a, ["n2", "n3"])
        else:
            assert (loc.node, loc.epoch, loc.placed) == (first[a].node, 1, False)
    assert {after[a].node for a in moved} == {"n2", "n3"}  # spread, not piled onto one
    assert p.agents_on("n1") == set()


def test_draining_nodes_take_no_new_agent_but_keep_theirs_until_released(r):
    p = Placement(r, ttl=TTL)
    for n in ("n1", "n2"):
        p.beat(n)
    agent = next(f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["n1", "n2"]) == "n1")
    assert p.locate(agent).node == "n1"
    p.drain("n1")
    assert p.locate(agent).node == "n1"  # still its node: the drain releases it after its calls
    newcomer = next(f"b{i}" for i in range(100) if rendezvous(f"b{i}", ["n1", "n2"]) == "n1")
    assert p.locate(newcomer).node == "n2"
    ok, _ = p.commit(agent, "n1", 1, release=True)
    assert ok
    loc = p.locate(agent)
    assert (loc.node, loc.epoch, loc.reason, loc.prev) == ("n2", 2, "drained", "n1")
    p.drain("n2")
    assert p.locate("c").node == ""  # nobody takes placements: no node, nothing written
    assert p.record("c") == {}


def test_a_stale_node_cannot_commit_a_snapshot_or_release(r):
    p = Placement(r, ttl=TTL)
    p.beat("n1")
    p.locate("x")
    p.beat("n2")
    kill(r, "n1")
    assert p.locate("x").node == "n2"
    assert p.commit("x", "n1", 1, "old-object", 10) == (False, "")  # the zombie's snapshot is refused
    assert p.commit("x", "n1", 1, release=True) == (False, "")
    assert p.snapshot("x") is None
    assert p.commit("x", "n2", 2, "obj-1", 10) == (True, "")
    assert p.commit("x", "n2", 2, "obj-2", 12) == (True, "obj-1")  # the replaced object is named for deletion
    assert p.snapshot("x").object == "obj-2"


# ----- a node's admission of calls ----------------------------------------------


def test_admission_forwards_refuses_and_adopts_an_existing_home(r, tmp_path):
    a, b = homes(r, tmp_path, "na"), homes(r, tmp_path, "nb")
    for h in (a, b):
        h.placement.beat(h.node)
    agent = next(f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["na", "nb"]) == "na")
    (a.home(agent)).mkdir(parents=True)
    (a.home(agent) / "kept.txt").write_text("from before placement")
    elsewhere = b.admit(agent, destructive=False)
    assert elsewhere.forward_to == node_queue("na") and elsewhere.error is None
    here = a.admit(agent, destructive=True)
    assert here.forward_to is None and here.notice is None and here.error is None
    here.release()
    assert (a.home(agent) / "kept.txt").read_text() == "from before placement"  # a first placement adopts
    assert a.epoch(agent) == 1
    assert a.placement.take_dirty("na") == {agent}  # a destructive call marks the home changed
    a.placement.drain("na")
    a.placement.drain("nb")
    a.placement.commit(agent, "na", 1, release=True)
    refused = a.admit(agent, destructive=False)
    assert refused.error and "no node can hold" in refused.error and refused.forward_to is None


def test_a_moved_home_is_restored_from_its_snapshot_and_the_model_is_told(r, tmp_path, store):
    a, b = homes(r, tmp_path, "na", store), homes(r, tmp_path, "nb", store)
    for h in (a, b):
        h.placement.beat(h.node)
    agent = next(f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["na", "nb"]) == "na")
    a.admit(agent, destructive=True).release()
    (a.home(agent) / "notes").mkdir()
    (a.home(agent) / "notes/plan.md").write_text("step 1\n")
    os.symlink("notes/plan.md", a.home(agent) / "link")
    assert Keeper(a, interval=1, call_wait=5).snapshot_changed() == {agent: "stored"}
    (a.home(agent) / "late.txt").write_text("after the snapshot")  # lost with the node
    first = a.placement.snapshot(agent)
    kill(r, "na")
    moved = b.admit(agent, destructive=False)
    try:
        assert moved.forward_to is None and moved.error is None
        assert moved.notice.startswith("[computer moved]") and "restored from its last snapshot" in moved.notice
        assert "(na) stopped" in moved.notice
        assert (b.home(agent) / "notes/plan.md").read_text() == "step 1\n"
        assert os.readlink(b.home(agent) / "link") == "notes/plan.md"
        assert not (b.home(agent) / "late.txt").exists()
    finally:
        moved.release()
    again = b.admit(agent, destructive=False)  # told once: the home now belongs to this epoch
    assert again.notice is None
    again.release()
    # The next snapshot replaces the first manifest in the store, and the chunk only it referenced.
    (b.home(agent) / "notes/plan.md").write_text("step 2\n")
    b.placement.mark_dirty("nb", agent)
    assert Keeper(b, interval=1, call_wait=5).snapshot_changed() == {agent: "stored"}
    assert store.objects(f"snapshots/{agent}/manifests/") == [b.placement.snapshot(agent).object]
    assert first.object not in store.objects()
    step2 = hashlib.sha256(b"step 2\n").hexdigest()
    assert store.objects(f"snapshots/{agent}/chunks/") == [f"snapshots/{agent}/chunks/{step2}"]


def test_without_a_store_a_moved_home_is_reset_and_the_model_is_told(r, tmp_path):
    a, b = homes(r, tmp_path, "na"), homes(r, tmp_path, "nb")
    for h in (a, b):
        h.placement.beat(h.node)
    agent = next(f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["na", "nb"]) == "na")
    a.admit(agent, destructive=True).release()
    (a.home(agent) / "work.txt").write_text("x")
    kill(r, "na")
    # A stale home on the new node (it held the agent long ago) is not passed off as current.
    b.home(agent).mkdir(parents=True)
    (b.home(agent) / "stale.txt").write_text("from an old epoch")
    moved = b.admit(agent, destructive=False)
    moved.release()
    assert moved.notice.startswith("[computer reset]") and "AGENT_SNAPSHOT_STORE" in moved.notice
    assert list(b.home(agent).iterdir()) == []


def test_a_store_that_does_not_answer_refuses_the_call_and_keeps_the_home_unplaced_here(r, tmp_path, store):
    a, b = homes(r, tmp_path, "na", store), homes(r, tmp_path, "nb", store)
    for h in (a, b):
        h.placement.beat(h.node)
    agent = next(f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["na", "nb"]) == "na")
    a.admit(agent, destructive=True).release()
    (a.home(agent) / "f").write_text("1")
    a.snapshot(agent)
    kill(r, "na")
    b.store = SnapshotStore(store.url(), "http://127.0.0.1:9")  # nothing listens there
    refused = b.admit(agent, destructive=False)
    assert refused.error and "could not be restored" in refused.error
    assert b.epoch(agent) is None  # the next call tries the restore again
    b.store = SnapshotStore(store.url(), store.endpoint)
    ok = b.admit(agent, destructive=False)
    ok.release()
    assert ok.notice.startswith("[computer moved]") and (b.home(agent) / "f").read_text() == "1"


def test_a_drain_snapshots_and_releases_every_agent_and_their_next_node_restores_them(r, tmp_path, store):
    a, b = homes(r, tmp_path, "na", store), homes(r, tmp_path, "nb", store)
    for h in (a, b):
        h.placement.beat(h.node)
    agents = [f"a{i}" for i in range(100) if rendezvous(f"a{i}", ["na", "nb"]) == "na"][:3]
    for agent in agents:
        a.admit(agent, destructive=True).release()
        (a.home(agent) / "mine.txt").write_text(agent)
    keeper = Keeper(a, interval=1, call_wait=5)
    assert keeper.drain_pass() == {}  # not draining: nothing happens
    held = a.admit(agents[0], destructive=False)  # a running call: the drain waits for it
    a.placement.drain("na")
    keeper.call_wait = 0.3
    assert keeper.drain_pass()[agents[0]] == "busy"
    held.release()
    keeper.call_wait = 5
    assert set(keeper.drain_pass().values()) == {"released"}
    assert a.placement.agents_on("na") == set()
    assert r.hget("agent:homes:node:na", "drained_at")
    straggler = a.admit(agents[1], destructive=False)  # a call still queued on the drained node
    assert straggler.forward_to == node_queue("nb")
    for agent in agents:
        moved = b.admit(agent, destructive=False)
        moved.release()
        assert moved.notice and "was drained" in moved.notice and (b.home(agent) / "mine.txt").read_text() == agent


def test_the_node_name_is_kept_in_the_homes_root(tmp_path):
    settings = Settings(homes_root=tmp_path / "root")
    first = node_name(settings)
    assert first == node_name(settings) == (tmp_path / "root/.placement/node").read_text().strip()
    assert node_name(Settings(homes_root=tmp_path / "other")) != first
    assert node_name(Settings(homes_root=tmp_path / "root", node_name="explicit")) == "explicit"
    with pytest.raises(ValueError, match="node name"):
        Settings(node_name="bad/name")
    with pytest.raises(ValueError, match="s3://"):
        Settings(snapshot_store="/tmp/x")


# ----- forwarding at the Celery edge ---------------------------------------------


def test_a_forwarded_call_keeps_its_task_id_and_brings_the_rest_of_its_chain():
    """``tasks.placement.forward`` publishes through the suite's real broker to queues nobody
    consumes, and the test reads the messages back: the call itself to the holder's queue, and the
    chain's next link, bound for the node it left, re-addressed to the holder."""
    from celery.exceptions import Ignore

    from tasks.app import app
    from tasks.placement import forward
    from tasks.turns import tool_call

    old, new = node_queue(f"gone-{os.getpid()}"), node_queue(f"holder-{os.getpid()}")
    shared_link = app.signature("tasks.turns.tool_call", ("t", 1, "c3"), immutable=True).set(queue="tools")
    next_link = app.signature("tasks.turns.tool_call", ("t", 1, "c2"), immutable=True).set(queue=old)
    tool_call.push_request(
        id="task-1",
        args=["t", 1, "c1"],
        delivery_info={"routing_key": old},
        chain=[dict(shared_link), dict(next_link)],  # Celery keeps the rest of a chain reversed
        argsrepr="read_file agent=a turn=t step=1 call=c1",
    )
    try:
        with pytest.raises(Ignore):
            forward(tool_call, new)
    finally:
        tool_call.pop_request()
    from kombu.simple import SimpleQueue

    with app.connection_for_write() as conn:
        q = SimpleQueue(conn, new)
        try:
            message = q.get(timeout=10)
            message.ack()
        finally:
            q.close()
    args, _kwargs, embed = message.decode()
    assert message.headers["task"] == "tasks.turns.tool_call" and message.headers["id"] == "task-1"
    assert list(args) == ["t", 1, "c1"]
    rest = embed["chain"]  # what runs after it, reversed like Celery's own
    assert [(link["args"][2], link["options"]["queue"]) for link in rest] == [("c3", "tools"), ("c2", new)]
