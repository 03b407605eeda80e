"""``RecordingProducer`` (``tasks.recorded_publish``): what it records for kombu's publish arguments,
and the publishes it refuses, so that the dispatcher sends those the long way. That the records
are what the real publish writes is shown against Redis in ``tests/integration/test_publish_batch.py``."""

from __future__ import annotations

import base64
import json

import pytest
from kombu import Exchange

from tasks.recorded_publish import RecordingProducer, Unrecordable


def _producer(expiring: frozenset[str] = frozenset()) -> RecordingProducer:
    return RecordingProducer(lambda exchange, key: [f"/0.{exchange}/{key}"], expiring)


def test_a_message_to_a_queue_is_an_lpush_of_kombus_envelope():
    p = _producer()
    p.publish(["args"], routing_key="tools", exchange="", serializer="json", headers={"task": "t"},
              delivery_mode="persistent", correlation_id="c1")  # fmt: skip
    ((name, key, payload),) = p.commands
    assert (name, key) == ("LPUSH", "tools")
    message = json.loads(payload)
    assert json.loads(base64.b64decode(message["body"])) == ["args"]
    assert message["content-type"] == "application/json" and message["headers"] == {"task": "t"}
    props = message["properties"]
    assert props["delivery_mode"] == 2 and props["priority"] == 0 and props["body_encoding"] == "base64"
    assert props["delivery_info"] == {"exchange": "", "routing_key": "tools"} and props["correlation_id"] == "c1"
    assert props["delivery_tag"]


def test_an_event_is_a_publish_on_each_topic_of_its_fanout_exchange():
    p = _producer()
    events = Exchange("celeryev", type="fanout")
    p.publish({"type": "task-sent"}, routing_key="task.sent", exchange="celeryev", declare=[events],
              serializer="json", delivery_mode=1, retry=True, retry_policy={})  # fmt: skip
    ((name, topic, payload),) = p.commands
    assert (name, topic) == ("PUBLISH", "/0.celeryev/task.sent")
    props = json.loads(payload)["properties"]
    assert props["delivery_mode"] == 1 and "retry" not in props and "retry_policy" not in props


@pytest.mark.parametrize(
    "options",
    [
        {"routing_key": "tools", "priority": 5},  # kombu would push to another list
        {"routing_key": "tools", "compression": "zlib"},
        {"routing_key": "tools", "expiration": 10},
        {"routing_key": "expiring"},  # a queue list that expires
        {"routing_key": ""},  # no queue
        {"routing_key": "x", "exchange": "direct-one", "declare": [Exchange("direct-one", type="direct")]},
        {"routing_key": "x", "exchange": "undeclared"},
    ],
)
def test_a_publish_it_cannot_reproduce_is_refused_and_nothing_is_recorded(options):
    p = _producer(frozenset({"expiring"}))
    with pytest.raises(Unrecordable):
        p.publish(["args"], serializer="json", **options)
    assert p.commands == []


def _kombu_envelope(**publish) -> dict:
    """What kombu's own ``Producer.publish`` hands the virtual channel's ``_put`` for these arguments
    (a channel of the in-memory transport, which encodes bodies as the Redis one does), without its
    ``delivery_tag``."""
    from kombu import Connection, Producer

    from tasks.serialization import register_orjson

    register_orjson()
    channel = Connection("memory://").channel()
    put: list[dict] = []
    channel._put = lambda queue, message, **_: put.append(message)
    Producer(channel, auto_declare=False).publish(**publish)
    (message,) = put
    message["properties"].pop("delivery_tag")
    return json.loads(json.dumps(message))


@pytest.mark.parametrize(
    "publish",
    [
        {"body": ["a", 1], "serializer": "orjson"},
        {"body": ["a", 1], "serializer": "json", "priority": None, "headers": {"h": "v"}},
        # A body already serialized: kombu sends it as it is, under the given content type.
        {"body": '{"a": 1}', "content_type": "application/json", "content_encoding": "utf-8"},
        {"body": '{"a": 1}', "content_type": "application/json"},
        {"body": b"raw", "content_type": "application/data"},
        # No delivery mode given: the exchange's, as kombu takes it.
        {"body": ["a"], "serializer": "json", "exchange": Exchange("", delivery_mode=1)},
        {"body": ["a"], "serializer": "json", "exchange": Exchange("", delivery_mode="transient")},
    ],
)
def test_a_recorded_message_is_kombus_envelope_for_the_same_publish(publish):
    """For any publish it records, the recorder writes the envelope kombu's ``Producer.publish``
    would: a producer that records something else sends a message kombu never would (a body
    re-serialized as ``text/plain``, a transient message made persistent)."""
    expected = _kombu_envelope(routing_key="tools", **publish)
    p = _producer()
    p.publish(routing_key="tools", **publish)
    ((_, _, payload),) = p.commands
    recorded = json.loads(payload)
    recorded["properties"].pop("delivery_tag")
    assert recorded == expected


def test_a_publish_recorded_while_celery_sends_a_callback_is_recorded():
    """Celery publishes a worker's callbacks (a chain's next link, a ``link``) with a retry of its
    own (``AMQP._retry_publish``), which reads the producer's ``connection.recoverable_connection_errors``:
    a message recorded there is recorded, not an ``AttributeError`` out of the task."""
    from celery.app.amqp import _callback_publish_retry

    from tasks.app import app
    from tasks.dispatcher import SEND_OPTIONS

    p = _producer()
    token = _callback_publish_retry.set(True)
    try:
        app.signature("tasks.turns.turn_step", ("cb-turn", 1)).apply_async(producer=p, queue="turns", **SEND_OPTIONS)
    finally:
        _callback_publish_retry.reset(token)
    assert [(name, key) for name, key, _ in p.commands] == [("LPUSH", "turns"), ("PUBLISH", "/0.celeryev/task.sent")]
