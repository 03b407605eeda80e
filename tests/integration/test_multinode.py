"""Several tools nodes on one machine, as real worker processes (``docs/placement.md``).

A private stack (its own Redis, beat with the watchdog), a turn pool (a threads worker on
``turns``), and three tools nodes, each a prefork worker on ``tools`` with its own homes root
and node name: ``na`` and ``nb`` snapshot homes into a real S3 server (SeaweedFS, ``devtools.object_store``), ``nc`` has no
snapshot store. One agent's life across them:

1. its files written in turn 1 are read in turn 2, from its node only (no other homes root holds
   them), while a tool that needs no computer (``todo_write``) runs on the shared queue;
2. draining its node moves it: its next call runs on another node, restored from the drain's
   snapshot, and the model is told;
3. killing its node (SIGKILL) moves it again: restored from the last periodic snapshot, told;
4. another agent on the node without a store, killed: its next node starts it empty and says so.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

from devtools.object_store import ObjectStore
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg, output_texts, wait_for
from worker.placement.records import Placement, rendezvous
from worker.tools.computer.homes import release_all

NODES = ("na", "nb", "nc")


def _agent(order: tuple[str, ...]) -> str:
    """An agent id whose rendezvous ranking of the nodes is ``order`` (best first)."""
    for i in range(10_000):
        agent = f"mn-{i}"
        ranked = []
        left = list(NODES)
        while left:
            best = rendezvous(agent, left)
            ranked.append(best)
            left.remove(best)
        if tuple(ranked) == order:
            return agent
    raise AssertionError(f"no agent ranks the nodes {order}")


@pytest.fixture(scope="module")
def cluster():
    store = ObjectStore().start()
    stack = PrivateStack(AGENT_SNAPSHOT_INTERVAL="0.5", AGENT_PROGRESS_SLACK="900")
    roots = {n: Path(tempfile.mkdtemp(prefix=f"homes-{n}-")) for n in NODES}
    procs = {}
    try:
        stack.start_beat()
        stack.start_worker(
            queues="turns,background,workflow",
            env={"AGENT_HOMES_ROOT": tempfile.mkdtemp(prefix="homes-turns-"), "AGENT_NODE_NAME": "turns-only"},
        )
        for n in NODES:
            env = {"AGENT_HOMES_ROOT": str(roots[n]), "AGENT_NODE_NAME": n}
            if n != "nc":
                env.update(store.env(), AGENT_SNAPSHOT_KEY="multinode-test-key-" + "k" * 32)
            procs[n] = stack.start_worker(queues="tools", pool="prefork", concurrency=1, env=env)
        placement = Placement(stack.control.redis, ttl=2.0)
        wait_for(lambda: all(placement.nodes().get(n, {}).get("live") for n in NODES), timeout=30)
        yield stack, store, roots, procs, placement
    finally:
        stack.close()
        store.stop()
        for root in roots.values():  # the quota images the nodes mounted (tests/conftest.py)
            release_all(root)


def _turn(stack, gateway, agent: str, steps: list[dict], name: str) -> tuple[str, list[str]]:
    model = f"{name}-{agent}-{time.monotonic_ns()}"
    gateway.add_script(model, steps)
    tid = stack.control.enqueue({"agent_id": agent, "input": "go", "model": model})
    view = stack.control.wait(tid, timeout=90)
    assert view.status.value == "completed", (view, output_texts(stack.control, tid))
    return tid, output_texts(stack.control, tid)


def _snapshot_after(placement: Placement, agent: str, since: float, epoch: int) -> None:
    def taken():
        snap = placement.snapshot(agent)
        return snap is not None and snap.epoch == epoch and snap.taken_at >= since

    wait_for(taken, timeout=30)


def test_an_agents_computer_across_nodes(cluster, gateway):
    stack, store, roots, procs, placement = cluster
    agent = _agent(("na", "nb", "nc"))  # first na; then nb; with na back, na again

    # 1. Turn 1 writes on its node; turn 2 reads it back; the todo list needs no computer.
    todos = {"todos": [{"id": "1", "content": "keep notes", "status": "in_progress"}]}
    _, outs = _turn(
        stack,
        gateway,
        agent,
        [
            {"output": [fc("write_file", {"path": "notes.txt", "content": "first turn\n"}), fc("todo_write", todos)]},
            {"output": [msg("written")]},
        ],
        "t1",
    )
    assert not any(o.startswith("[computer") for o in outs), outs
    assert placement.record(agent)["node"] == "na"
    assert (roots["na"] / agent / "notes.txt").read_text() == "first turn\n"
    assert not (roots["nb"] / agent / "notes.txt").exists() and not (roots["nc"] / agent / "notes.txt").exists()
    _, outs = _turn(
        stack, gateway, agent, [{"output": [fc("read_file", {"path": "notes.txt"})]}, {"output": [msg("ok")]}], "t2"
    )
    assert "first turn" in outs[0] and not outs[0].startswith("[computer")

    # 2. Draining na: the agent is snapshotted and released; its next call runs on nb, restored.
    assert stack.control.drain("na")["draining"]
    wait_for(lambda: placement.nodes()["na"]["agents"] == 0, timeout=30)
    _, outs = _turn(
        stack,
        gateway,
        agent,
        [
            {"output": [fc("read_file", {"path": "notes.txt"})]},
            {"output": [fc("write_file", {"path": "more.txt", "content": "written on nb\n"})]},
            {"output": [msg("ok")]},
        ],
        "t3",
    )
    assert outs[0].startswith("[computer moved]") and "(na) was drained" in outs[0], outs[0]
    assert "first turn" in outs[0]
    assert not outs[1].startswith("[computer")  # told once
    record = placement.record(agent)
    assert (record["node"], record["epoch"], record["reason"]) == ("nb", "2", "drained")

    # 3. Killing nb after its periodic snapshot: the agent moves to na (taking placements again).
    stack.control.drain("na", on=False)
    _snapshot_after(placement, agent, since=float(record["at"]), epoch=2)
    stack.kill(procs["nb"])
    _, outs = _turn(
        stack,
        gateway,
        agent,
        [
            {"output": [fc("read_file", {"path": "more.txt"}), fc("read_file", {"path": "notes.txt"})]},
            {"output": [msg("ok")]},
        ],
        "t4",
    )
    told = [o for o in outs if o.startswith("[computer moved]")]
    assert len(told) == 1 and "(nb) stopped" in told[0], outs
    assert "written on nb" in outs[0] and "first turn" in outs[1], outs
    record = placement.record(agent)
    assert (record["node"], record["epoch"], record["reason"], record["prev"]) == ("na", "3", "node_down", "nb")
    # What was restored is the agent's own (not the root worker's): it can change it.
    edit = {"path": "notes.txt", "old_string": "first turn", "new_string": "edited after two moves"}
    _, outs = _turn(stack, gateway, agent, [{"output": [fc("edit_file", edit)]}, {"output": [msg("ok")]}], "t5")
    assert "Error" not in outs[0], outs
    home = roots["na"] / agent
    assert (home / "notes.txt").read_text() == "edited after two moves\n"
    assert {p.stat().st_uid for p in home.rglob("*")} == {home.stat().st_uid} != {0}


def test_a_node_without_a_store_that_dies_leaves_an_empty_home_and_says_so(cluster, gateway):
    stack, store, roots, procs, placement = cluster
    live = [n for n in NODES if placement.nodes().get(n, {}).get("live")]
    assert "nc" in live and "na" in live
    agent = next(f"reset-{i}" for i in range(10_000) if rendezvous(f"reset-{i}", live) == "nc")
    _turn(
        stack,
        gateway,
        agent,
        [{"output": [fc("write_file", {"path": "lost.txt", "content": "only on nc\n"})]}, {"output": [msg("ok")]}],
        "r1",
    )
    assert placement.record(agent)["node"] == "nc" and (roots["nc"] / agent / "lost.txt").exists()
    stack.kill(procs["nc"])
    _, outs = _turn(
        stack, gateway, agent, [{"output": [fc("list_files", {"path": "."})]}, {"output": [msg("ok")]}], "r2"
    )
    assert outs[0].startswith("[computer reset]") and "(nc) stopped" in outs[0], outs[0]
    assert "lost.txt" not in outs[0]
    assert placement.record(agent)["node"] != "nc"
