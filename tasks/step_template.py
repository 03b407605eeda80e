"""A turn's first step message, built by Celery once per queue and then written again per turn
with that turn's own values: what the control plane's enqueue records
(``CeleryDispatcher.own_step_message``, ``control.client.ControlPlane.create_call``).

Celery building the message (``Signature.apply_async``: routing, the app's configuration read key
by key, protocol-2 headers, the event dispatcher) took about 90 us of the HTTP API's enqueue, more
than half of the route's own work, for a message that differs from one turn to the next only in
a few values. ``StepTemplate`` records one message of ``turn_step`` to a queue through Celery
(``tasks.recorded_publish.RecordingProducer``: the task message and its ``task-sent`` event, as
publish calls), then for each turn publishes the same calls on a new ``RecordingProducer`` with:

- the task's id (a new ``uuid4``, Celery's): the headers' ``id`` and ``root_id``, the
  properties' ``correlation_id``, the event's ``uuid`` and ``root_id``;
- its arguments ``(turn_id, step)`` in the body, its label (``argsrepr``: the headers', the
  properties', the event's ``args``);
- the properties' ``reply_to`` (``app.thread_oid``, per thread), and the event's clock (the app's
  Lamport clock, forwarded as Celery's event dispatcher does), ``timestamp`` and ``utcoffset``;
- what the ``before_task_publish`` handlers write (``published_at``, and the turn's
  ``traceparent`` when one is current): the signal is sent with the new headers, as Celery sends
  it; ``after_task_publish`` likewise.

The template is taken outside any trace context, and ``published_at`` (the one header a handler
writes there, ``tasks.queue_metrics``) is taken out of it, so the headers the handlers write come
from each message's own signal. A message for a task already running (Celery would make it that
task's child: ``parent_id``) is built by Celery, as is any when the recorded calls are not the
two expected. ``tests/integration/test_step_template.py`` compares the template's messages with
Celery's.
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


class _Capturing(RecordingProducer):
    """A ``RecordingProducer`` that also keeps each publish call: ``(body, keyword arguments)``."""

    def __init__(self, topics: Callable[[str, str], list[str]], expiring: frozenset[str]):
        super().__init__(topics, expiring)
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body: Any, **kwargs: Any) -> None:  # type: ignore[override]
        self.calls.append((body, {**kwargs, "headers": dict(kwargs.get("headers") or {})}))
        super().publish(body, **kwargs)


class StepTemplate:
    """``StepTemplate.record(send, topics, expiring)``: the template of the messages ``send``
    publishes (a ``CeleryDispatcher`` sender of ``turn_step`` to one queue, given ``apply_async``
    options), or None when they are not a task message and its ``task-sent`` event;
    ``message(turn_id, step, label)``: one turn's commands."""

    def __init__(self, task: tuple[Any, dict[str, Any]], event: tuple[Any, dict[str, Any]], topics: Any, expiring: Any):
        body, self._task = task
        self._kwargs, self._embed = body[1], body[2]
        self._headers = {k: v for k, v in self._task.pop("headers").items() if k not in HANDLER_HEADERS}
        self._event, self._event_kwargs = event
        self._name = self._headers["task"]
        self._topics, self._expiring = topics, expiring
        self._pid = os.getpid()

    @classmethod
    def record(
        cls, send: Callable[[dict[str, Any]], Any], topics: Callable[[str, str], list[str]], expiring: frozenset[str]
    ) -> StepTemplate | None:
        """Record the messages ``send`` publishes given ``{"producer": ...}`` (its ``apply_async``
        options), outside any trace context. ``topics(exchange, routing_key)``: the Redis lists a
        fanout publish reaches; ``expiring``: the queues whose messages expire (both as
        ``RecordingProducer`` takes them). Returns the template, or None when the calls are not one
        root task message and its ``task-sent`` event, or when the recorder cannot reproduce the
        publish (``tasks.recorded_publish.Unrecordable``): the caller lets Celery build each message."""
        producer = _Capturing(topics, expiring)
        token = otel_context.attach(otel_context.Context())  # no current span: no traceparent
        try:
            send({"producer": producer})
        except Unrecordable:
            return None
        finally:
            otel_context.detach(token)
        if len(producer.calls) != 2:
            return None
        (body, task), (event, _event_kwargs) = producer.calls
        headers = task["headers"]
        task_id = headers.get("id")
        shaped = (
            isinstance(body, tuple)
            and len(body) == 3
            and headers.get("root_id") == task_id
            and headers.get("parent_id") is None
            and task.get("correlation_id") == task_id
            and isinstance(event, dict)
            and event.get("uuid") == task_id
            and event.get("type") == "task-sent"
        )
        return cls(producer.calls[0], producer.calls[1], topics, expiring) if shaped else None

    @property
    def usable(self) -> bool:
        """False in a forked child (the template names its parent's process) or inside a running
        task (Celery would make the message its child)."""
        return os.getpid() == self._pid and app.current_worker_task is None

    def message(self, turn_id: str, step: int, label: str) -> MessageCommands:
        """The commands of ``turn_step(turn_id, step)`` labelled ``label``, as Celery's publish
        would have recorded them (module docstring)."""
        task_id = uuid()
        headers = {**self._headers, "id": task_id, "root_id": task_id, "argsrepr": label}
        body = ((turn_id, step), self._kwargs, self._embed)
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
            headers=headers,
            properties=properties,
            retry_policy=kw["retry_policy"],
        )
        producer = RecordingProducer(self._topics, self._expiring)
        producer.publish(body, **{**kw, **properties, "headers": headers})
        after_task_publish.send(
            sender=self._name, body=body, headers=headers, exchange=kw["exchange"], routing_key=kw["routing_key"]
        )
        event = {
            **self._event,
            "utcoffset": utcoffset(),
            "clock": app.clock.forward(),  # type: ignore[attr-defined]  # the stubs lack Celery.clock
            "uuid": task_id,
            "root_id": task_id,
            "args": label,
            "timestamp": time.time(),
        }
        producer.publish(event, **self._event_kwargs)
        return producer.commands
