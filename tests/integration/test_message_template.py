"""Messages written from a template (``tasks.message_template``) against the messages Celery builds
for the same turn: the control plane's first step, a model step's one tool call (a root message with
its ``call_started`` header) and a call's next step (the running task's child). The same envelope,
headers, properties and ``task-sent`` event, key for key and in the same order, with each message's
own task id, root and parent, clock, time and trace context."""

from __future__ import annotations

import base64
import json
import time
import uuid
from typing import Any

from control.client import ControlPlane
from worker.turn import telemetry

KEY = ("tasks.turns.turn_step", "turns", ())
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
    assert d._templates[KEY] is not None  # the template, not Celery, wrote ``mine``

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
    from tasks.message_template import MessageTemplate
    from tasks.recorded_publish import Unrecordable

    def send(_options: dict[str, Any]) -> None:
        raise Unrecordable("a priority")

    assert MessageTemplate.record(send, lambda exchange, key: [], frozenset()) is None


def test_a_queue_without_a_template_gets_celerys_message(redis_url):
    import os

    cp = ControlPlane(os.environ["CONTROL_REDIS_URL"])
    cp.open_broker()
    d = cp._dispatcher
    d._templates[KEY] = None  # remembered as having none: Celery builds each message
    turn_id = uuid.uuid4().hex
    msg = _decoded(d.own_step_message(turn_id, 0, queue="turns", label="x"))
    assert msg["body"][0] == [turn_id, 0] and msg["event"]["type"] == "task-sent"
    assert d._templates[KEY] is None


def _same_but_own_values(mine: dict[str, Any], theirs: dict[str, Any], *per_message: str) -> None:
    """``mine`` is ``theirs`` key for key and in order, but for each message's own values."""
    assert (mine["queue"], mine["topic"]) == (theirs["queue"], theirs["topic"])
    assert list(mine["msg"]) == list(theirs["msg"])
    assert list(mine["msg"]["headers"]) == list(theirs["msg"]["headers"])
    assert list(mine["msg"]["properties"]) == list(theirs["msg"]["properties"])
    headers = ("id", "published_at", *per_message)
    assert _without(mine["msg"]["headers"], *headers) == _without(theirs["msg"]["headers"], *headers)
    tags = ("correlation_id", "delivery_tag")
    assert _without(mine["msg"]["properties"], *tags) == _without(theirs["msg"]["properties"], *tags)
    assert list(mine["event"]) == list(theirs["event"])
    moving = ("uuid", "clock", "timestamp", *(k for k in per_message if k in ("root_id", "parent_id")))
    assert _without(mine["event"], *moving) == _without(theirs["event"], *moving)
    for m in (mine, theirs):
        assert m["msg"]["headers"]["id"] == m["msg"]["properties"]["correlation_id"] == m["event"]["uuid"]
        assert m["msg"]["headers"]["root_id"] == m["event"]["root_id"]
        assert m["msg"]["headers"]["parent_id"] == m["event"]["parent_id"]
    assert mine["msg"]["headers"]["id"] != theirs["msg"]["headers"]["id"]


def _worker_dispatcher(redis_url: str) -> Any:
    from tasks.app import app
    from tasks.dispatcher import CeleryDispatcher

    assert app.conf.broker_url == redis_url
    return CeleryDispatcher()


def test_a_one_call_batch_from_a_template_is_celerys_message_with_its_own_header(redis_url):
    """A model step's one tool call (a finisher thread: no running task): a root message, its
    ``call_started`` header set per message, in Celery's place among the headers."""
    from tasks.dispatcher import STARTED_HEADER
    from worker.turn.dispatch import Batch

    d = _worker_dispatcher(redis_url)
    turn_id = uuid.uuid4().hex
    batch = Batch("parallel", ["call_a"])
    with telemetry.under_turn(TRACEPARENT):
        theirs = _decoded(
            d._record(d._routes_to_record(), d._batch_sender(turn_id, 1, batch, "tools", None, None, {"call_a": "1-0"}))
        )
        mine = _decoded(d.batch_message(turn_id, 1, batch, queue="tools", started={"call_a": "7-3"}))
        plain = _decoded(d.batch_message(turn_id, 2, Batch("parallel", ["call_b"]), queue="tools"))
    assert d._templates[("tasks.turns.tool_call", "tools", (STARTED_HEADER,))] is not None
    assert d._templates[("tasks.turns.tool_call", "tools", ())] is not None
    _same_but_own_values(mine, theirs, "root_id", STARTED_HEADER)
    assert mine["body"] == theirs["body"] == [[turn_id, 1, "call_a"], {}, theirs["body"][2]]
    assert mine["msg"]["headers"][STARTED_HEADER] == "7-3" and theirs["msg"]["headers"][STARTED_HEADER] == "1-0"
    assert mine["msg"]["headers"]["root_id"] == mine["msg"]["headers"]["id"]  # a root message
    assert mine["msg"]["headers"]["parent_id"] is None
    assert mine["msg"]["headers"]["traceparent"].split("-")[1] == "ab" * 16
    assert mine["msg"]["headers"]["argsrepr"] == f"turn={turn_id} step=1 call=call_a"
    assert STARTED_HEADER not in plain["msg"]["headers"] and plain["body"][0] == [turn_id, 2, "call_b"]


def test_a_step_message_sent_by_a_running_task_is_its_child_as_celery_makes_it(redis_url):
    """A call's next step, sent inside the ``tool_call`` task (a tools worker's child): Celery makes
    the message the running task's child (its root, its id as parent); so does the template."""
    from celery._state import _task_stack

    import tasks.turns

    d = _worker_dispatcher(redis_url)
    task = tasks.turns.tool_call
    task.push_request(id="the-call-task", root_id="the-first-step", called_directly=False)
    _task_stack.push(task)
    try:
        turn_id = uuid.uuid4().hex
        theirs = _decoded(d._record(d._routes_to_record(), d._step_sender(turn_id, 2, "turns", "x")))
        mine = _decoded(d.step_message(turn_id, 2, queue="turns", label="x"))
    finally:
        _task_stack.pop()
        task.pop_request()
    outside = _decoded(d.step_message(turn_id, 3, queue="turns"))
    _same_but_own_values(mine, theirs)
    assert d._templates[KEY] is not None
    for m in (mine, theirs):
        assert (m["msg"]["headers"]["root_id"], m["msg"]["headers"]["parent_id"]) == ("the-first-step", "the-call-task")
    assert mine["body"] == theirs["body"] == [[turn_id, 2], {}, theirs["body"][2]]
    # The same template outside a task: a root message again.
    assert outside["msg"]["headers"]["root_id"] == outside["msg"]["headers"]["id"] == outside["event"]["root_id"]
    assert outside["msg"]["headers"]["parent_id"] is None and outside["event"]["parent_id"] is None
    assert outside["msg"]["headers"]["argsrepr"] == f"turn={turn_id} step=3"


def test_with_parent_priority_inherited_a_task_child_is_celerys(redis_url, monkeypatch):
    """``task_inherit_parent_priority``: Celery gives a task's child its parent's priority, which a
    template does not know: the message is Celery's."""
    from celery._state import _task_stack

    import tasks.turns
    from tasks.app import app

    d = _worker_dispatcher(redis_url)
    d.step_message(uuid.uuid4().hex, 1, queue="turns")  # the template, taken outside a task
    monkeypatch.setitem(app.conf, "task_inherit_parent_priority", True)
    task = tasks.turns.tool_call
    task.push_request(id="p", root_id="r", called_directly=False, delivery_info={"priority": 0})
    _task_stack.push(task)
    calls: list[Any] = []
    record = d._record
    monkeypatch.setattr(d, "_record", lambda routes, send: calls.append(send) or record(routes, send))
    try:
        msg = _decoded(d.step_message(uuid.uuid4().hex, 2, queue="turns"))
    finally:
        _task_stack.pop()
        task.pop_request()
    assert len(calls) == 1  # Celery built it
    assert msg["msg"]["headers"]["parent_id"] == "p"
