"""``tasks.dispatcher._send``: a message sent alone (a step's, a lone tool call's) goes through
``app.send_task`` without the signature's and task's layers and without an ``AsyncResult``; what
it publishes is what ``app.signature(...).apply_async`` publishes for the same task and options:
the same envelope, headers (time limits, the ``call_started`` header, labels), properties, body
and ``task-sent`` event, ids, tags, clocks and times aside."""

from __future__ import annotations

import base64
import json
import re

import pytest

from tasks.recorded_publish import RecordingProducer

_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIMES = ("published_at", "timestamp", "clock", "traceparent", "utcoffset")


def _normal(payload: bytes) -> dict:
    message = json.loads(payload)
    message["body"] = json.loads(base64.b64decode(message["body"]))
    for part in (message["headers"], message["body"] if isinstance(message["body"], dict) else {}):
        for name in _TIMES:
            if name in part:
                part[name] = "<t>"
    return json.loads(_ID.sub("<id>", json.dumps(message, sort_keys=True)))


def _recorded(send) -> list[tuple[str, str, dict]]:
    producer = RecordingProducer(lambda exchange, key: [f"/0.{exchange}/{key}"])
    send(producer)
    return [(name, key, _normal(payload)) for name, key, payload in producer.commands]


@pytest.mark.parametrize(
    "name, args, extra",
    [
        ("tasks.turns.turn_step", ("d-turn", 3), {"queue": "turns", "argsrepr": "turn=d-turn step=3"}),
        (
            "tasks.turns.tool_call",
            ("d-turn", 3, "c1"),
            {"queue": "tools", "argsrepr": "read_thing", "headers": {"call_started": "1-0"}},
        ),
    ],
)
def test_the_same_message_as_the_signature_sends(name, args, extra):
    import tasks.turns  # noqa: F401  (the tasks registered, as in a worker: their own options apply)
    from tasks.app import app
    from tasks.dispatcher import SEND_OPTIONS, _send

    options = {**SEND_OPTIONS, **extra}
    by_signature = _recorded(lambda p: app.signature(name, args, immutable=True).set(**options).apply_async(producer=p))
    direct = _recorded(lambda p: _send(name, args, {**options, "producer": p}))
    assert [(n, k) for n, k, _ in direct] == [("LPUSH", extra["queue"]), ("PUBLISH", "/0.celeryev/task.sent")]
    assert direct == by_signature
    headers = direct[0][2]["headers"]
    assert headers["task"] == name and headers["argsrepr"] == extra["argsrepr"]
    if name == "tasks.turns.tool_call":  # the task's own time limits, merged by send_task
        assert headers["timelimit"][0] is not None and headers["call_started"] == "1-0"
