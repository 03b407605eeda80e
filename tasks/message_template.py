"""A turn's messages (a step's ``turn_step``, a call's ``tool_call``), built by Celery once per
process, task, queue and header, and then written again per message with that message's own values:
what the control plane's enqueue and the workers' transitions record (``CeleryDispatcher.own_step_message``,
``step_message`` and ``batch_message`` for a one-call batch; ``control.client.ControlPlane.create_call``).

Celery building a message (``app.send_task``: routing, the app's configuration read key by key,
protocol-2 headers, the event dispatcher) took about 90 us of the HTTP API's enqueue, more than half
of the route's own work, and 12.9% of a tools worker's samples for the next step's message
(bench/README.md, "Worker CPU per turn, third pass"), for a message that differs from the next one
only in a few values. ``MessageTemplate`` records one message of a task to a queue through Celery
(``tasks.recorded_publish.RecordingProducer``: the task message and its ``task-sent`` event, as
publish calls), with placeholder ``root_id`` and ``parent_id`` given to ``send_task``, then for
each message publishes the same calls on a new ``RecordingProducer`` with:

- the task's id (a new ``uuid4``, Celery's): the headers' ``id``, the properties'
  ``correlation_id``, the event's ``uuid``;
- its root and parent, as ``send_task`` takes them: from the task running in this thread
  (``app.current_worker_task``: its ``root_id`` or else its id, and its id), or, outside a task,
  the message's own id and None;
- its arguments in the body, its label (``argsrepr``: the headers', the properties', the event's
  ``args``), and the values of the headers the template was recorded with (``call_started``);
- the properties' ``reply_to`` (``app.thread_oid``, per thread), and the event's clock (the app's
  Lamport clock, forwarded as Celery's event dispatcher does), ``timestamp`` and ``utcoffset``;
- what the ``before_task_publish`` handlers write (``published_at``, and the turn's
  ``traceparent`` when one is current): the signal is sent with the new headers, as Celery sends
  it; ``after_task_publish`` likewise.

The template is taken outside any trace context, and ``published_at`` (the one header a handler
writes there, ``tasks.queue_metrics``) is taken out of it, so the headers the handlers write come
from each message's own signal. A template is used only in the process that recorded it (its
``origin`` header and event name the process) and never for a child message when
``task_inherit_parent_priority`` is on (Celery would give it its parent's priority). Celery builds
the message when the recorded calls are not the two expected.
``tests/integration/test_message_template.py`` compares the template's messages with Celery's, for
a root message and for a task's child.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable

from celery.signals import after_task_publish, before_task_publish
from celery.utils.time import utcoffset
from kombu.utils.uuid import uuid
from opentelemetry import context as otel_context

from tasks.app import app
from tasks.recorded_publish import RecordingProducer, Unrecordable
from worker.turn.guard import MessageCommands

# Headers a ``before_task_publish`` handler writes whatever the context (``tasks.queue_metrics``):
# written again by each message's own signal, not copied from the template.
HANDLER_HEADERS = ("published_at",)
# The root and parent a template is recorded with (``send_task``'s own options), replaced per message.
ROOT_MARK, PARENT_MARK = "template-root", "template-parent"


class _Capturing(RecordingProducer):
    """A ``RecordingProducer`` that also keeps each publish call: ``(body, keyword arguments)``."""

    def __init__(self, topics: Callable[[str, str], list[str]], expiring: frozenset[str]):
        super().__init__(topics, expiring)
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.calls.append((body, {**kwargs, "headers": dict(kwargs.get("headers") or {})}))
        super().publish(body, **kwargs)


class MessageTemplate:
    """``MessageTemplate.record(send, topics, expiring, headers)``: the template of the messages
    ``send`` publishes (a ``CeleryDispatcher`` sender of one task to one queue, given ``apply_async``
    options), or None when they are not a task message and its ``task-sent`` event;
    ``message(args, label, headers)``: one message's commands."""

    def __init__(
        self,
        task: tuple[Any, dict[str, Any]],
        event: tuple[Any, dict[str, Any]],
        topics: Callable[[str, str], list[str]],
        expiring: frozenset[str],
    ):
        body, self._task = task
        self._kwargs, self._embed = body[1], body[2]
        self._headers = {k: v for k, v in self._task.pop("headers").items() if k not in HANDLER_HEADERS}
        self._event, self._event_kwargs = event
        self._name = self._headers["task"]
        self._topics, self._expiring = topics, expiring
        self._pid = os.getpid()

    @classmethod
    def record(
        cls,
        send: Callable[[dict[str, Any]], Any],
        topics: Callable[[str, str], list[str]],
        expiring: frozenset[str],
        headers: tuple[str, ...] = (),
    ) -> MessageTemplate | None:
        """Record the messages ``send`` publishes given ``{"producer": ...}`` and the placeholder
        root and parent (its ``apply_async`` options), outside any trace context. ``topics(exchange,
        routing_key)``: the Redis lists a fanout publish reaches; ``expiring``: the queues whose
        messages expire (both as ``RecordingProducer`` takes them); ``headers``: the custom headers
        ``send`` gives, whose values each message sets. Returns the template, or None when the calls
        are not one task message and its ``task-sent`` event, or when the recorder cannot reproduce
        the publish (``tasks.recorded_publish.Unrecordable``): the caller lets Celery build each message."""
        producer = _Capturing(topics, expiring)
        token = otel_context.attach(otel_context.Context())  # no current span: no traceparent
        try:
            send({"producer": producer, "root_id": ROOT_MARK, "parent_id": PARENT_MARK})
        except Unrecordable:
            return None
        finally:
            otel_context.detach(token)
        if len(producer.calls) != 2:
            return None
        (body, task), (event, _event_kwargs) = producer.calls
        recorded = task["headers"]
        task_id = recorded.get("id")
        shaped = (
            isinstance(body, tuple)
            and len(body) == 3
            and recorded.get("root_id") == ROOT_MARK
            and recorded.get("parent_id") == PARENT_MARK
            and all(h in recorded for h in headers)
            and task.get("correlation_id") == task_id
            and isinstance(event, dict)
            and event.get("uuid") == task_id
            and event.get("root_id") == ROOT_MARK
            and event.get("parent_id") == PARENT_MARK
            and event.get("type") == "task-sent"
        )
        return cls(producer.calls[0], producer.calls[1], topics, expiring) if shaped else None

    @property
    def recorded_here(self) -> bool:
        """False in a forked child: the template names its parent's process."""
        return os.getpid() == self._pid

    @property
    def usable(self) -> bool:
        """Whether this message may be written from the template: recorded in this process, and
        not inside a running task when Celery would give the message its parent's priority."""
        if not self.recorded_here:
            return False
        return not (app.conf.task_inherit_parent_priority and app.current_worker_task is not None)

    def message(
        self, args: tuple[str | int, ...], label: str, headers: dict[str, str] | None = None
    ) -> MessageCommands:
        """The commands of the task with ``args`` labelled ``label`` (and the recorded custom
        ``headers`` set to these values), as Celery's publish would have recorded them (module
        docstring)."""
        task_id = uuid()
        parent = app.current_worker_task
        if parent is not None:  # as ``send_task`` takes them
            root_id, parent_id = parent.request.root_id or parent.request.id, parent.request.id
        else:
            root_id, parent_id = task_id, None
        message_headers = {
            **self._headers,
            "id": task_id,
            "root_id": root_id,
            "parent_id": parent_id,
            "argsrepr": label,
            **(headers or {}),
        }
        body = (args, self._kwargs, self._embed)
        kw = self._task
        properties = {
            "correlation_id": task_id,
            "reply_to": app.thread_oid,
            "kwargsrepr": kw.get("kwargsrepr"),
            "argsrepr": label,
        }
        before_task_publish.send(
            sender=self._name,
            body=body,
            exchange=kw["exchange"],
            routing_key=kw["routing_key"],
            declare=kw["declare"],
            headers=message_headers,
            properties=properties,
            retry_policy=kw["retry_policy"],
        )
        producer = RecordingProducer(self._topics, self._expiring)
        producer.publish(body, **{**kw, **properties, "headers": message_headers})
        after_task_publish.send(
            sender=self._name,
            body=body,
            headers=message_headers,
            exchange=kw["exchange"],
            routing_key=kw["routing_key"],
        )
        event = {
            **self._event,
            "utcoffset": utcoffset(),
            "clock": app.clock.forward(),  # type: ignore[attr-defined]  # the stubs lack Celery.clock
            "uuid": task_id,
            "root_id": root_id,
            "parent_id": parent_id,
            "args": label,
            "timestamp": time.time(),
        }
        producer.publish(event, **self._event_kwargs)
        return producer.commands
