"""Starting a turn: the request checked, the turn stored with its first items and trace, step 0 enqueued."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from worker.model.items import user_message
from worker.turn import telemetry
from worker.turn.interfaces import step_label
from worker.turn.request import TurnRefused, TurnRequest, check_turn_id, unstorable
from worker.turn.runtime import TurnRuntime


@dataclass(frozen=True)
class NewTurn:
    """A turn about to be stored (``TurnIntake.prepare``): its request as JSON, its first items,
    and the root of its trace (``traceparent``)."""

    request: dict[str, Any]
    items: list[dict[str, Any]]
    traceparent: str

    @property
    def fields(self) -> dict[str, Any]:
        """Extra fields of the turn's hash (``TurnStore.create``'s ``fields``)."""
        return {"traceparent": self.traceparent}


class TurnIntake:
    """Creates turns in ``runtime``'s store and enqueues their first step."""

    def __init__(self, runtime: TurnRuntime):
        self.rt = runtime

    def create(self, request: TurnRequest, turn_id: str) -> tuple[str, bool]:
        """Store a new turn and enqueue its first step. Returns ``(turn_id, created)``; ``created``
        is False for a reused idempotency key or a turn id the agent already used (nothing is
        enqueued again).

        Raises ``TurnRefused`` (nothing stored) for a turn id not matching ``ID_PATTERN``, a turn
        id of another agent, a request whose JSON is over ``settings.max_input_bytes``, or one
        that cannot be stored as JSON (``prepare``).
        """
        new = self.prepare(request, turn_id)
        tid, created = self.rt.store.create(
            turn_id, new.request, new.items, idempotency_key=request.idempotency_key, fields=new.fields
        )
        if created:
            with telemetry.under_turn(new.traceparent):
                self.rt.dispatcher.enqueue_step(tid, 0, queue=request.queue, label=step_label(request.agent_id, tid, 0))
        return tid, created

    def prepare(self, request: TurnRequest, turn_id: str) -> NewTurn:
        """What ``create`` stores for ``request`` (no I/O): its JSON, first items and trace. Raises
        ``TurnRefused`` as ``create`` does (the id, the size), and for a request its JSON encoder
        cannot store (``unstorable``: an integer beyond 64 bits, nesting over 254 levels, a lone
        surrogate), which a client's JSON parser may accept."""
        check_turn_id(turn_id)
        refused: object = request  # what failed to encode: the model, or its JSON-mode dump
        try:
            refused = dumped = request.model_dump(mode="json")
            size = len(orjson.dumps(dumped))
        except (ValueError, TypeError) as exc:  # orjson.JSONEncodeError is a TypeError
            raise TurnRefused(f"the turn request cannot be stored: {unstorable(refused, exc)}") from None
        limit = self.rt.settings.max_input_bytes
        if size > limit:
            raise TurnRefused(
                f"the turn request is {size:,} bytes as JSON (input, instructions, skills, metadata); "
                f"the limit is {limit:,} (AGENT_MAX_INPUT_BYTES)"
            )
        items = [user_message(request.input)] if isinstance(request.input, str) else list(request.input)
        return NewTurn(dumped, items, telemetry.new_traceparent())

    def enqueue(self, request: dict[str, Any] | TurnRequest, turn_id: str | None = None) -> str:
        """The ``enqueue_turn`` tool service: validate ``request`` and start a turn; returns its id
        (an existing one for a reused idempotency key or turn id of the same agent). Raises
        ``pydantic.ValidationError`` or ``TurnRefused`` (see ``create``)."""
        req = request if isinstance(request, TurnRequest) else TurnRequest.model_validate(request)
        return self.create(req, turn_id or uuid.uuid4().hex)[0]
