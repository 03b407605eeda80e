"""A Redis failover under load (docs/failover.md): turns run on real Celery worker processes (a
threads pool for the steps, prefork for the tools, beat) against a primary, a replica and three
Sentinels (``devtools.embedded_sentinel``); the primary is SIGKILLed while turns are in flight
(streamed model calls from the scripted gateway, destructive calls), Sentinel promotes the
replica, every process follows it, and every turn ends.

Asserted: no turn lost, none stuck, every one completed; no destructive call ran twice (each run
appends a line to a file in the agent's home, outside Redis); no model call paid twice (the
scripted gateway answered each step of each turn once); two turns followed over the HTTP API's
event stream across the failover get every stored event once, up to ``turn_finished``. Printed:
the time from the kill to the first step of a turn stored on the new primary, and how long the
Sentinels took to promote.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import orjson

from devtools.embedded_sentinel import EmbeddedSentinelSet
from devtools.scripted_gateway import _next_step
from tests.support.api_server import ApiServer
from tests.support.private_stack import PrivateStack
from tests.support.scripts import fc, msg, wait_for

TURNS = 24
KILL_AFTER = 10  # turns enqueued before the primary dies
PROGRESS = ("model_reply", "call_completed")  # a step's stored progress


def _script() -> list[dict]:
    stream = {"stream_chunk": 8, "stream_delay_ms": 25}  # a streamed answer takes about half a second
    return [
        {"output": [msg("Writing a, reading r."), fc("append_marker", {"label": "a", "ms": 300}),
                    fc("read_thing", {"label": "r", "ms": 200})], **stream},
        {"output": [msg("Writing b."), fc("append_marker", {"label": "b", "ms": 300})], **stream},
        {"output": [msg("done")], **stream},
    ]  # fmt: skip


def _paid_twice(gateway, model: str) -> int:
    """Generations the scripted gateway answered more than once for one step of one turn."""
    paid = Counter()
    for body in list(gateway.requests):
        if body.get("model") != model:
            continue
        items = body["input"] if isinstance(body.get("input"), list) else []
        first = next((i.get("content") for i in items if isinstance(i, dict) and i.get("role") == "user"), None)
        paid[(str(first), _next_step(items))] += 1
    return sum(n - 1 for n in paid.values() if n > 1)


def _follow(api: ApiServer, token: str, turn_id: str, into: list[dict]) -> None:
    """Follow a turn's events over the HTTP API until ``turn_finished``, as a browser's
    EventSource does: a stream that ends early is opened again from its ``Last-Event-ID``."""
    last, deadline = None, time.monotonic() + 240
    while time.monotonic() < deadline and not any(e.get("event") == "turn_finished" for e in into):
        headers = {"Last-Event-ID": last} if last else {}
        try:
            with (
                api.client(token, timeout=60) as http,
                http.stream("GET", f"/v1/turns/{turn_id}/events", headers=headers) as resp,
            ):
                cur: dict = {}
                for line in resp.iter_lines():
                    if not line:
                        if "event" in cur:
                            into.append(cur)
                            last = cur.get("id", last)
                        cur = {}
                    elif line.startswith("id: "):
                        cur["id"] = line[4:]
                    elif line.startswith("event: "):
                        cur["event"] = line[7:]
                    elif line.startswith("data: "):
                        cur["data"] = orjson.loads(line[6:])
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def test_a_failover_under_load_loses_nothing_and_pays_nothing_twice(gateway, script_name, homes_root):
    gateway.add_script(script_name, _script())
    redis_set = EmbeddedSentinelSet(down_after_ms=1000)
    stack = PrivateStack(redis_set, AGENT_MODEL_TIMEOUT="30", AGENT_TOOL_TIME_LIMIT="30")
    api = None
    try:
        stack.start_worker(pool="threads", concurrency=16, queues="turns,background,workflow")
        stack.start_worker(pool="prefork", concurrency=2, queues="tools")
        stack.start_beat()
        api = ApiServer(stack.control_url, endpoint=stack.endpoint, **stack.env).start()
        token = api.token(None)
        followed: dict[str, list[dict]] = {}
        followers: list[threading.Thread] = []
        ids: list[str] = []

        def enqueue(i: int) -> None:
            agent = f"fo-{i}-{script_name[-6:]}"
            ids.append(
                wait_for(
                    lambda: _try(
                        lambda: stack.control.enqueue(
                            {
                                "agent_id": agent,
                                "input": f"failover turn {i}",
                                "model": script_name,
                                "toolset": "testing",
                            }
                        )
                    ),
                    timeout=60,
                )  # fmt: skip
            )

        for i in range(KILL_AFTER):
            enqueue(i)
            if i >= KILL_AFTER - 2:  # followed over the API's event hub across the failover
                followed[ids[-1]] = []
                followers.append(threading.Thread(target=_follow, args=(api, token, ids[-1], followed[ids[-1]])))
                followers[-1].start()
            time.sleep(0.2)
        time.sleep(0.5)  # model calls streaming, tools running
        old = redis_set.kill_primary()
        killed_at = time.time()
        new_port = redis_set.wait_for_failover(old.port)
        promoted_after = time.time() - killed_at
        for i in range(KILL_AFTER, TURNS):  # more turns on the new primary
            enqueue(i)
            time.sleep(0.1)
        redis_set.restart(old)  # back as a replica: fencing writes are acknowledged again

        def ended() -> bool:
            views = [_try(lambda t=t: stack.control.status(t)) for t in ids]
            return all(v is not None and v.done for v in views)

        wait_for(ended, timeout=240, poll=1)
        views = {t: stack.control.status(t) for t in ids}
        statuses = Counter(v.status.value for v in views.values())
        assert len(ids) == TURNS and statuses == {"completed": TURNS}, statuses
        marks = {
            i: (homes_root / f"fo-{i}-{script_name[-6:]}" / "markers.txt").read_text().split() for i in range(TURNS)
        }
        twice = {i: m for i, m in marks.items() if any(n > 1 for n in Counter(m).values())}
        assert not twice, twice
        assert _paid_twice(gateway, script_name) == 0
        for thread in followers:
            thread.join(60)
        for tid, events in followed.items():  # the hub followed the primary: every event, once, in order
            kinds = [e["event"] for e in events]
            assert kinds[-1] == "turn_finished" and events[-1]["data"]["status"] == "completed", kinds
            stored = [e for e in stack.control.events(tid)]
            assert len(events) == len({e["id"] for e in events}) == len(stored), (kinds, [e["kind"] for e in stored])
        progress = [
            float(e["at"]) for t in ids for e in stack.control.events(t)
            if e.get("kind") in PROGRESS and float(e["at"]) >= killed_at
        ]  # fmt: skip
        first_step = min(progress) - killed_at
        assert new_port != old.port
        print(
            f"\nfailover: primary {old.port} killed, replica {new_port} promoted after {promoted_after:.1f} s; "
            f"first step stored on the new primary {first_step:.1f} s after the kill; {TURNS} turns completed",
            flush=True,
        )
    finally:
        if api is not None:
            api.stop()
        stack.close()


def _try(run):
    import redis

    from control.errors import ControlPlaneError

    try:
        return run()
    except (redis.RedisError, ControlPlaneError):
        return None


def test_flower_reads_the_queues_through_the_sentinels_across_a_failover(tmp_path):
    """``python -m tasks.flower`` on a Sentinel set: its broker page (queue lengths) asks the
    Sentinels for the primary (before, the explicit transport's URI made Flower answer "'redis'
    broker is not supported" on any deployment), and answers again after a failover."""
    import os
    import subprocess
    import sys

    from devtools.ports import free_port
    from tests.support.private_stack import ROOT

    redis_set = EmbeddedSentinelSet()
    redis_set.start()
    port = free_port()
    env = {**os.environ, **redis_set.env, "FLOWER_BASIC_AUTH": "ops:flower-secret"}
    env.pop("CONTROL_REDIS_URL")
    log = tmp_path / "flower.log"
    flower = subprocess.Popen(
        [sys.executable, "-m", "tasks.flower", f"--port={port}", "--address=127.0.0.1"],
        cwd=ROOT,
        env=env,
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
    )

    def queues() -> dict | None:
        try:
            resp = httpx.get(f"http://127.0.0.1:{port}/api/queues/length", auth=("ops", "flower-secret"), timeout=10)
        except httpx.HTTPError:
            return None
        return resp.json() if resp.status_code == 200 else None

    try:
        redis_set.client(redis_set.primary_port()).lpush("tools", "x")  # one message waiting
        lengths = wait_for(queues, timeout=60, poll=0.5)
        assert {q["name"]: q["messages"] for q in lengths["active_queues"]}["tools"] == 1, lengths
        old = redis_set.kill_primary()
        redis_set.wait_for_failover(old.port)
        lengths = wait_for(queues, timeout=60, poll=0.5)
        assert {q["name"]: q["messages"] for q in lengths["active_queues"]}["tools"] == 1, lengths
    finally:
        flower.terminate()
        flower.wait(15)
        redis_set.stop()
