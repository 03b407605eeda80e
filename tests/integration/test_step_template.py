"""The control plane's first-step messages written from a template (``tasks.step_template``) against
the messages Celery builds for the same turn: the same envelope, headers, properties and
``task-sent`` event, key for key and in the same order, with each message's own task id, clock,
time and trace context."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

from control.client import ControlPlane
from worker.turn import telemetry

TRACEPARENT = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"


def _decoded(commands: Any) -> dict[str, Any]:
    (push, queue, raw), (publish, topic, raw_event) = commands
    assert (push, publish) == ("LPUSH", "PUBLISH")
    msg = json.loads(raw)
    event_env = json.loads(raw_event)
    return {
        "queue": queue,
        "topic": topic,
        "msg": msg,
        "body": json.loads(base64.b64decode(msg["body"])),
        "event_env": event_env,
        "event": json.loads(base64.b64decode(event_env["body"])),
    }


def _without(d: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k not in keys}


def test_a_template_message_is_the_message_celery_builds_with_its_own_ids(redis_url):
    import os

    cp = ControlPlane(os.environ["CONTROL_REDIS_URL"])
    cp.open_broker()
    d = cp._dispatcher
    turn_id, label = uuid.uuid4().hex, "agent=a turn=t step=0"
    with telemetry.under_turn(TRACEPARENT):
        theirs = _decoded(d._record(d._own_routes(), d._step_sender(turn_id, 0, "turns", label)))
        mine = _decoded(d.own_step_message(turn_id, 0, queue="turns", label=label))
        again = _decoded(d.own_step_message(turn_id, 0, queue="turns", label=label))
    assert d._templates["turns"] is not None  # the template, not Celery, wrote ``mine``

    assert (mine["queue"], mine["topic"]) == (theirs["queue"], theirs["topic"])
    assert mine["body"] == theirs["body"] == [[turn_id, 0], {}, theirs["body"][2]]
    # The envelope, its headers and properties: the same keys in the same order, the same values
    # but the per-message ones.
    assert list(mine["msg"]) == list(theirs["msg"])
    assert list(mine["msg"]["headers"]) == list(theirs["msg"]["headers"])
    assert list(mine["msg"]["properties"]) == list(theirs["msg"]["properties"])
    per_message = ("id", "root_id", "published_at")
    assert _without(mine["msg"]["headers"], *per_message) == _without(theirs["msg"]["headers"], *per_message)
    assert mine["msg"]["headers"]["traceparent"].split("-")[1] == "ab" * 16  # the turn's trace
    assert mine["msg"]["headers"]["argsrepr"] == label
    assert abs(mine["msg"]["headers"]["published_at"] - time.time()) < 30
    tags = ("correlation_id", "delivery_tag")
    assert _without(mine["msg"]["properties"], *tags) == _without(theirs["msg"]["properties"], *tags)
    assert _without(mine["msg"], "body", "headers", "properties") == _without(
        theirs["msg"], "body", "headers", "properties"
    )

    # One task id throughout each message, never another message's.
    for m in (mine, again, theirs):
        task_id = m["msg"]["headers"]["id"]
        assert m["msg"]["headers"]["root_id"] == m["msg"]["properties"]["correlation_id"] == task_id
        assert m["event"]["uuid"] == m["event"]["root_id"] == task_id
    ids = {m["msg"]["headers"]["id"] for m in (mine, again, theirs)}
    tags_seen = {m["msg"]["properties"]["delivery_tag"] for m in (mine, again, theirs)}
    assert len(ids) == 3 and len(tags_seen) == 3

    # The task-sent event: the same fields in the same order; its clock the app's, moving on.
    assert list(mine["event"]) == list(theirs["event"])
    moving = ("uuid", "root_id", "clock", "timestamp")
    assert _without(mine["event"], *moving) == _without(theirs["event"], *moving)
    assert theirs["event"]["clock"] < mine["event"]["clock"] < again["event"]["clock"]
    assert theirs["event"]["timestamp"] <= mine["event"]["timestamp"] <= again["event"]["timestamp"]
    assert list(mine["event_env"]) == list(theirs["event_env"])
    assert _without(mine["event_env"], "body", "properties") == _without(theirs["event_env"], "body", "properties")
    assert _without(mine["event_env"]["properties"], "delivery_tag") == _without(
        theirs["event_env"]["properties"], "delivery_tag"
    )


def test_without_a_trace_context_a_template_message_has_no_traceparent(redis_url):
    import os

    cp = ControlPlane(os.environ["CONTROL_REDIS_URL"])
    cp.open_broker()
    d = cp._dispatcher
    with telemetry.under_turn(TRACEPARENT):
        d.own_step_message(uuid.uuid4().hex, 0, queue="turns")  # the template taken inside a context
    plain = _decoded(d.own_step_message(uuid.uuid4().hex, 0, queue="turns"))
    assert "traceparent" not in plain["msg"]["headers"]
    assert plain["msg"]["headers"]["argsrepr"].startswith("turn=")


def test_a_publish_the_recorder_cannot_reproduce_gives_no_template():
    """A queue whose message the recorder cannot reproduce (``Unrecordable``: an expiry, a
    priority...) gets no template: ``record`` answers None, it does not raise into the enqueue."""
    from tasks.recorded_publish import Unrecordable
    from tasks.step_template import StepTemplate

    def send(_options: dict[str, Any]) -> None:
        raise Unrecordable("a priority")

    assert StepTemplate.record(send, lambda exchange, key: [], frozenset()) is None


def test_a_queue_without_a_template_gets_celerys_message(redis_url):
    import os

    cp = ControlPlane(os.environ["CONTROL_REDIS_URL"])
    cp.open_broker()
    d = cp._dispatcher
    d._templates["turns"] = None  # remembered as having none: Celery builds each message
    turn_id = uuid.uuid4().hex
    msg = _decoded(d.own_step_message(turn_id, 0, queue="turns", label="x"))
    assert msg["body"][0] == [turn_id, 0] and msg["event"]["type"] == "task-sent"
    assert d._templates["turns"] is None
