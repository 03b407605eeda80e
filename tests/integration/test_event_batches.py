"""A worker's task events go to Redis in batches (``tasks.reconnect.Consumer``): a real threads
worker on a stack of its own runs 30 tasks sent at once, and every task's ``task-received``,
``task-started`` and ``task-succeeded`` reach an event subscriber (what Flower reads), in a few
``PUBLISH``es of many events each instead of one or two events per ``PUBLISH``."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest

from tasks.serialization import SERIALIZER  # noqa: F401  (the app's serializers registered)
from tests.support.private_stack import PrivateStack
from tests.support.scripts import wait_for

TASKS = 30


@pytest.fixture
def stack():
    s = PrivateStack()
    yield s
    s.close()


def _decode(data: bytes) -> list[dict]:
    """The events of one ``PUBLISH`` on Celery's event exchange (a kombu envelope; ``task.multi``
    carries a list)."""
    import base64

    body = json.loads(base64.b64decode(json.loads(data)["body"]))
    return body if isinstance(body, list) else [body]


def test_task_events_reach_a_subscriber_in_batches(stack):
    from tasks.app import app

    stack.start_worker(pool="threads", concurrency=8, queues="turns")
    r = stack.client()
    pubsub = r.pubsub()
    pubsub.psubscribe("*celeryev/task.*")
    published: list[list[dict]] = []
    done = threading.Event()

    def listen() -> None:
        while not done.is_set():
            message = pubsub.get_message(timeout=0.2)
            if message and message["type"] == "pmessage":
                published.append(_decode(message["data"]))

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    time.sleep(0.5)
    with app.connection_for_write(stack.url) as conn:
        ids = [app.signature("tasks.health.ping").apply_async(queue="turns", connection=conn).id for _ in range(TASKS)]

    def all_succeeded() -> bool:
        seen = {(e.get("uuid"), e["type"]) for batch in published for e in batch}
        return all((i, "task-succeeded") in seen for i in ids)

    try:
        wait_for(all_succeeded, timeout=30)
    finally:
        done.set()
        listener.join(5)
        pubsub.close()
    kinds = Counter(e["type"] for batch in published for e in batch if e.get("uuid") in ids)
    assert kinds["task-received"] == kinds["task-started"] == kinds["task-succeeded"] == TASKS
    worker_batches = [b for b in published if any(e["type"] != "task-sent" and e.get("uuid") in ids for e in b)]
    # 90 worker events: Celery's own flush at the loop's next turn published them one or two at a time
    assert len(worker_batches) <= 12, [len(b) for b in worker_batches]
