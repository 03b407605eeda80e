"""Operator metrics read from Redis at scrape time (``tasks.queue_metrics``): queue backlog and the
age of the oldest message per queue, approvals waiting and the oldest's age; and Flower's task
list showing the task labels by default."""

from __future__ import annotations

import os
import sys
import time

from tasks.queue_metrics import ApprovalsWaiting, QueueBacklog
from tests.support.scripts import fc, msg, wait_for
from worker.turn.request import TurnStatus

DB = 9  # a database no worker consumes: the messages stay queued


def _gauges(collector) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for fam in collector.collect() for s in fam.samples}


def test_queue_backlog_and_oldest_age_from_the_broker_lists():
    import redis

    from tasks.app import app

    url = os.environ["REDIS_URL"].rsplit("/", 1)[0] + f"/{DB}"
    r = redis.Redis.from_url(url)
    for q in ("background", "workflow"):
        r.delete(q)
    collector = QueueBacklog(r, ("background", "workflow"))
    assert collector.read() == {"background": (0, 0.0), "workflow": (0, 0.0)}
    with app.connection_for_write(url) as conn:
        app.send_task("tasks.health.ping", queue="background", connection=conn)
        time.sleep(1.2)
        app.send_task("tasks.health.ping", queue="background", connection=conn)
        app.send_task("tasks.health.ping", queue="background", connection=conn, priority=6)
    read = collector.read()
    assert read["workflow"] == (0, 0.0)
    n, age = read["background"]
    assert n == 3 and 1.1 <= age < 30, read  # every priority's list counted; the first message's age
    g = _gauges(collector)
    assert g[("agent_queue_backlog", (("queue", "background"),))] == 3
    assert g[("agent_queue_oldest_age_seconds", (("queue", "background"),))] >= 1.1
    r.delete("background", "background\x06\x166")


def test_a_scrape_during_a_redis_outage_yields_nothing_and_does_not_fail():
    import redis

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    assert list(QueueBacklog(dead, ("turns",)).collect()) == []
    assert list(ApprovalsWaiting(dead).collect()) == []


def test_approvals_waiting_and_the_oldest_wait(control, gateway, script_name):
    gateway.add_script(script_name, [{"output": [fc("guarded_write", {"label": "m"})]}, {"output": [msg("ok")]}])
    tid = control.enqueue(
        {
            "agent_id": "metrics-a",
            "input": "go",
            "model": script_name,
            "toolset": "testing",
            "approval": {"mode": "declared"},
        }
    )
    wait_for(lambda: control.status(tid).status == TurnStatus.awaiting_approval, timeout=30)
    time.sleep(1.1)
    g = _gauges(ApprovalsWaiting(control.redis))
    n = g[("agent_approvals_waiting", ())]
    assert n >= 1 and g[("agent_approval_oldest_wait_seconds", ())] >= 1.0
    control.cancel(tid)  # other tests' parked turns may remain: this one's call leaves the count
    wait_for(lambda: _gauges(ApprovalsWaiting(control.redis))[("agent_approvals_waiting", ())] == n - 1, timeout=10)


def test_flower_shows_the_task_labels_by_default(monkeypatch):
    import celery.bin.celery

    from tasks import flower

    seen = []
    monkeypatch.setenv("FLOWER_BASIC_AUTH", "u:p")
    monkeypatch.setattr(celery.bin.celery, "main", lambda: seen.append(list(sys.argv)))
    flower.main(["--port=1"])
    assert "--tasks_columns=name,uuid,state,args,received,started,runtime,worker" in seen[0]
    flower.main(["--tasks_columns=name"])  # an operator's own choice wins
    assert [a for a in seen[1] if a.startswith("--tasks_columns")] == ["--tasks_columns=name"]
