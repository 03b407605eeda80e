"""The model-client interface: what a turn needs from a model API, whatever its wire format.

A model step builds a ``ModelRequest`` and hands it to a ``ModelClient``; it gets a ``ModelReply``
back, whole (``create``) or while the model writes it (``stream``, which reports each ``Delta``).
Both sides use the runtime's one item format, the Responses API's: the history is a list of
Responses input items, the tools are Responses function-tool definitions, the reply's output is a
list of Responses output items. A client of another wire API (Chat Completions) maps the request
and the reply at its own edge, so adding one is one new module that implements ``ModelClient``;
nothing in ``worker.turn`` changes (docs/architecture.md, "Model clients").

The request is a plain, JSON-serialisable record (``to_json``/``from_json``): a step can hand it to
another component (an event loop that makes the call without holding a worker thread) and the
reply is stored as JSON (``ModelReply.to_json``, the per-step memo).

Errors: a client raises ``GatewayError`` for every failure, ``retryable`` or not, never an
exception of its HTTP library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from worker.errors import AgentRuntimeError
from worker.model.items import assistant_text, function_calls

# What a model server says when its own tool-call parser refuses the model's output, whatever the
# HTTP status or stream frame it says it in: llama.cpp's llama-server (common/chat.cpp,
# common_chat_peg_parse: "The model produced output that does not match the expected <format>
# format") and Ollama (server/routes.go: "error parsing tool call: raw='...', err=...").
_MODEL_OUTPUT_ERRORS = ("does not match the expected", "error parsing tool call")


def is_model_output_error(message: str) -> bool:
    """Whether a server's error ``message`` says that the model's output did not parse
    (``_MODEL_OUTPUT_ERRORS``): the model's doing, not the server's or the network's."""
    lowered = message.lower()
    return any(pattern in lowered for pattern in _MODEL_OUTPUT_ERRORS)


class GatewayError(AgentRuntimeError, RuntimeError):
    """The model call failed.

    ``retryable`` is true for transport errors, timeouts, HTTP 408/409/429 and
    5xx (worth retrying with backoff); false for other 4xx (the request is wrong).
    ``status_code`` is the HTTP status or None for transport errors.

    ``model_output``: the server refused the model's own output (its tool-call parser failed,
    ``is_model_output_error``), whatever the status. Such an error is never ``retryable``: the
    same request gives the same output (greedy sampling), so the turn tells the model instead
    (``worker.turn.unread_output``).
    """

    def __init__(self, message: str, *, retryable: bool, status_code: int | None = None):
        super().__init__(message)
        self.model_output = is_model_output_error(message)
        self.retryable = retryable and not self.model_output
        self.status_code = status_code


@dataclass(frozen=True)
class ModelRequest:
    """One model call, in the runtime's format.

    - ``model``: the model name the API knows;
    - ``input``: the turn's history as Responses input items, in order;
    - ``tools``: Responses function-tool definitions (``worker.tooling.schemas.collect_tool_definitions``);
    - ``instructions``: the system instructions, or None;
    - ``max_output_tokens``: the cap on the reply's tokens, or None for the API's default;
    - ``metadata``: string pairs passed to the API, or None.
    """

    model: str
    input: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON form (to hand the request to another component or store it)."""
        return {
            "model": self.model,
            "input": self.input,
            "tools": self.tools,
            "instructions": self.instructions,
            "max_output_tokens": self.max_output_tokens,
            "metadata": self.metadata,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelRequest:
        """Inverse of ``to_json``."""
        return cls(
            model=data["model"],
            input=list(data.get("input") or []),
            tools=list(data.get("tools") or []),
            instructions=data.get("instructions"),
            max_output_tokens=data.get("max_output_tokens"),
            metadata=data.get("metadata"),
        )


@dataclass
class ModelReply:
    """One model reply, in the runtime's format.

    - ``id``: the API's response id (may be empty);
    - ``status``: ``completed``, or ``incomplete`` (stopped at the output-token limit; the
      reason in ``incomplete_reason``);
    - ``output``: the output items (Responses format: ``message``, ``function_call``, ``reasoning``...);
    - ``usage``: the Responses ``usage`` object as the API sent it (``worker.turn.usage`` reads it).
    """

    id: str
    status: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] = field(default_factory=dict)
    incomplete_reason: str | None = None

    @property
    def function_calls(self) -> list[dict[str, Any]]:
        """The reply's ``function_call`` items in emitted order."""
        return function_calls(self.output)

    @property
    def text(self) -> str:
        """The assistant's text (concatenated ``output_text`` parts)."""
        return assistant_text(self.output)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the per-step memo in Redis."""
        return {
            "id": self.id,
            "status": self.status,
            "output": self.output,
            "usage": self.usage,
            "incomplete_reason": self.incomplete_reason,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelReply:
        """Parse a Responses API response body (or our memo) into a ``ModelReply``."""
        status = data.get("status") or "completed"
        reason = data.get("incomplete_reason")
        if reason is None and isinstance(data.get("incomplete_details"), dict):
            reason = data["incomplete_details"].get("reason")
        return cls(
            id=str(data.get("id", "")),
            status=status,
            output=list(data.get("output") or []),
            usage=dict(data.get("usage") or {}),
            incomplete_reason=reason,
        )


@dataclass(frozen=True)
class Delta:
    """A piece of the reply as the model writes it: ``kind`` ``text`` (assistant text) or
    ``arguments`` (a function call's arguments, with its ``call_id`` and ``name``), for the output
    item at ``output_index``."""

    kind: Literal["text", "arguments"]
    output_index: int
    text: str
    call_id: str | None = None
    name: str | None = None


OnDelta = Callable[[Delta], None]


class ModelClient(Protocol):
    """A model API client (one per process: it pools connections). Raises ``GatewayError`` only."""

    def create(self, request: ModelRequest) -> ModelReply:
        """Make the call; return the whole reply."""
        ...

    def stream(self, request: ModelRequest, on_delta: OnDelta) -> ModelReply:
        """Make the call streamed: ``on_delta`` gets each piece in order; returns the whole reply
        (the same as ``create`` would). An endpoint that cannot stream answers whole."""
        ...

    def close(self) -> None:
        """Release the client's connections."""
        ...
