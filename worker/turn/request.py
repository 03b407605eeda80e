"""The turn request (what a control plane enqueues) and turn status values."""

from __future__ import annotations

import re
import threading
from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from worker.errors import AgentRuntimeError
from worker.model.input_items import InputItemError, check_input_items
from worker.settings import ApprovalMode

# Agent ids name a directory (the agent's home) and Redis keys; turn ids name Redis keys.
# Published in the JSON Schema as ``ID_PATTERN`` (ECMA-262 and pydantic-core's Rust regex: ``$``
# matches only at the very end). Checked in Python with ``fullmatch`` and ``\Z``: Python's ``$``
# would also match before a trailing newline ("alice\n").
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\Z")


# A turn whose metadata names one of these belongs to a record that must hear how it ended
# (``tasks.hooks``: a workflow task's attempt, a background job); other turns have no end hooks.
END_HOOK_METADATA = ("workflow_task_id", "background_job_id")
IDEMPOTENCY_KEY_MAX = 200
"""The longest idempotency key a turn request takes (characters), in its body or the HTTP header."""


class TurnRefused(AgentRuntimeError, ValueError):
    """A turn that cannot be created: a bad or foreign turn id, or a request over the size cap.
    The message says which rule and setting; nothing was stored."""


def is_valid_id(value: str) -> bool:
    """True when ``value`` is a valid agent or turn id (``ID_PATTERN``, no trailing newline)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def check_turn_id(turn_id: str) -> str:
    """Return ``turn_id`` if it matches ``ID_PATTERN``; raises ``TurnRefused`` otherwise."""
    if not is_valid_id(turn_id):
        raise TurnRefused(f"turn id {turn_id[:80]!r} must match {ID_PATTERN}")
    return turn_id


class TurnStatus(str, Enum):
    """Lifecycle of a turn. Terminal: every value but ``queued``, ``running`` and ``awaiting_approval``."""

    queued = "queued"
    running = "running"
    awaiting_approval = "awaiting_approval"  # calls wait for a person's decision; no task runs for them
    completed = "completed"  # the model answered without calling tools
    incomplete = "incomplete"  # the model's answer stopped at the output-token limit
    terminated = "terminated"  # a tool result asked to end the turn
    max_model_calls = "max_model_calls"  # runaway turn stopped at the model-call cap
    invalid_arguments = "invalid_arguments"  # a tool's retry budget for invalid calls ran out
    budget_exceeded = "budget_exceeded"  # the turn's token budget (TurnRequest.token_budget) was used up
    cancelled = "cancelled"
    failed = "failed"

    @property
    def terminal(self) -> bool:
        """True for every status but ``queued``, ``running`` and ``awaiting_approval``."""
        return self not in (TurnStatus.queued, TurnStatus.running, TurnStatus.awaiting_approval)

    @property
    def failure(self) -> bool:
        """True for the endings that are failures, shown as such by monitors (Flower, traces):
        ``failed``, ``invalid_arguments``, ``max_model_calls``, ``budget_exceeded``."""
        return self in (
            TurnStatus.failed,
            TurnStatus.invalid_arguments,
            TurnStatus.max_model_calls,
            TurnStatus.budget_exceeded,
        )


class Skill(BaseModel):
    """An enabled skill of the agent, projected into the turn's instructions.

    ``mcp_server`` names an MCP server configured for the agent (reached through the
    command tool and the ``mcporter`` CLI).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    description: str
    instructions: str = ""
    mcp_server: str | None = None


class TurnSupports(BaseModel):
    """What a turn may do: ``spawn_jobs`` offers background job tools; ``brain`` offers Brain tools in workflow task turns."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # part of a shared TurnRequest
    spawn_jobs: bool = False
    brain: bool = False


class TokenBudget(BaseModel):
    """Token limits of one turn, summed over its model calls (the Responses ``usage`` of each reply).

    A turn whose totals reached a limit makes no further model call: it ends with status
    ``budget_exceeded`` and an error naming the limit. The reply that crossed the limit is
    kept (its tool calls run, or its answer completes the turn).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)  # part of a shared TurnRequest
    input_tokens: int | None = Field(default=None, ge=1)
    output_tokens: int | None = Field(default=None, ge=1)
    total_tokens: int | None = Field(default=None, ge=1)


class ApprovalPolicy(BaseModel):
    """Which calls of the turn wait for a person (``worker.turn.approvals``).

    - ``mode``: which calls wait, one of the modes this field's values list (what each means:
      docs/control-plane.md, "Approvals"); ``None`` takes ``AGENT_APPROVAL_MODE``.
    - ``timeout``: seconds a call may wait for a decision before it is rejected
      (``None``: ``AGENT_APPROVAL_TIMEOUT``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)  # part of a shared TurnRequest
    mode: ApprovalMode | None = None
    timeout: float | None = Field(default=None, gt=0, le=30 * 24 * 3600)


class TurnRequest(BaseModel):
    """A turn to run, as enqueued by a control plane (JSON Schema: ``TurnRequest.model_json_schema()``).

    - ``agent_id``: the agent; its home is ``<homes_root>/<agent_id>``.
    - ``input``: the user's message, or a list of Responses input items.
    - ``toolset``: ``text`` (the main text-turn catalog), ``workflow_task``,
      or a name configured in ``AGENT_EXTRA_TOOLSETS``.
    - ``model`` / ``instructions``: override the settings' model; system instructions.
    - ``max_model_calls``: cap on model calls in this turn (default from settings).
    - ``token_budget``: input/output/total token limits of the turn (``TokenBudget``).
    - ``idempotency_key``: enqueueing twice with the same key *for the same agent* returns the
      same turn id (keys are scoped per agent: two agents using one key get two turns).
    - ``queue``: where the turn's model steps run (``turns``, ``background``, ``workflow``).
    - ``finish_tool``: the tool that must end the turn (``submit_result`` in workflow task turns).
    - ``approval``: which calls wait for a person's decision, and for how long (``ApprovalPolicy``).
    - ``metadata``: free JSON for the control plane (``workflow_task_id``, ``background_job_id``...).
    - ``network``: ``none`` (commands have no network) or ``egress`` (through the egress proxy and
      its address guard); ``egress_allow_hosts``: optional host allowlist for egress.
    """

    # Frozen: a stored request is parsed once per process and shared (``stored_request``).
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent_id: str = Field(default="agent", pattern=ID_PATTERN)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    model: str | None = None
    toolset: str = "text"
    supports: TurnSupports = Field(default_factory=TurnSupports)
    skills: list[Skill] = Field(default_factory=list)
    max_model_calls: int | None = Field(default=None, ge=1, le=200)
    token_budget: TokenBudget | None = None
    idempotency_key: str | None = Field(default=None, max_length=IDEMPOTENCY_KEY_MAX)
    queue: Literal["turns", "background", "workflow"] = "turns"
    # When set, the turn may only end through this tool (a result with the terminate flag);
    # a reply in prose gets one repair instruction, a second one fails the turn.
    finish_tool: str | None = None
    approval: ApprovalPolicy = Field(default_factory=ApprovalPolicy)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # Network of the turn's commands: "none" (default, no network at all) or "egress" (through
    # the worker's egress proxy, which refuses loopback, private, link-local and metadata
    # addresses). ``egress_allow_hosts``: when set, the only hosts egress may reach
    # ("example.com", or ".example.com" for its subdomains).
    network: Literal["none", "egress"] = "none"
    egress_allow_hosts: list[str] | None = Field(default=None, max_length=100)

    @field_validator("input")
    @classmethod
    def _input(cls, v: str | list[dict[str, Any]]) -> str | list[dict[str, Any]]:
        # The Responses input item shapes (worker.model.input_items): the path of the first error
        # goes in the error's context, for the HTTP API's ``param``.
        if isinstance(v, list):
            try:
                check_input_items(v)
            except InputItemError as exc:
                raise PydanticCustomError(
                    "input_item", "{path}: {detail}", {"path": exc.path, "detail": exc.detail}
                ) from None
        return v

    @field_validator("agent_id")
    @classmethod
    def _agent_id(cls, v: str) -> str:
        if not is_valid_id(v):  # pattern= already ran; this also refuses a trailing newline in Python terms
            raise ValueError(f"agent_id must match {ID_PATTERN} (it names a directory)")
        return v


def request_problem(request: TurnRequest) -> tuple[str, str] | None:
    """What a control plane refuses in a request its schema accepts, as ``(param, message)``: an
    empty message (a string ``input`` with nothing but whitespace), an empty ``idempotency_key``
    (no key to de-duplicate by), and ``egress_allow_hosts`` with ``network: none`` (hosts for an
    egress the turn does not have). None when none of them.
    Checked at enqueue (``ControlPlane.create``, the HTTP API), never on stored requests."""
    if isinstance(request.input, str) and not request.input.strip():
        return "input", "the message is empty"
    if request.idempotency_key == "":  # it would enqueue every repeat as a new turn
        return "idempotency_key", "the idempotency key is empty: give one of 1-200 characters, or none"
    if request.egress_allow_hosts is not None and request.network != "egress":
        return "egress_allow_hosts", (
            "egress_allow_hosts is given with network 'none': commands have no network to allow hosts on "
            "(set network 'egress', or drop the hosts)"
        )
    return None


STORE_INT_RANGE = (-(2**63), 2**64 - 1)
"""The integers the store's JSON encoder (orjson) writes; it refuses any other."""
STORE_MAX_DEPTH = 254
"""The deepest nesting of arrays and objects the store's JSON encoder (orjson) writes, the
outermost counted: it refuses a 255th level ("Recursion limit reached")."""
_WIDE_INT = "an integer is beyond 64 bits (-2**63 to 2**64-1); send a larger number as a string"
_TOO_DEEP = f"arrays and objects are nested more than {STORE_MAX_DEPTH} levels deep (the outermost object counted)"
_LONE_SURROGATE = (
    "a string holds a lone surrogate (an escaped \\ud800-\\udfff without its pair), which is not Unicode text"
)


def unstorable(value: object, exc: Exception) -> str:
    """Why the stored JSON cannot hold ``value``, a value a client sent (a turn request, an
    approval's edited params) that ``orjson.dumps`` (or pydantic's ``model_dump``) refused with
    ``exc``: a value Python's ``json`` reads but the store's encoder refuses.

    The cause is found in the value itself, never in the encoder's wording: the first (in the
    encoder's order) integer outside ``STORE_INT_RANGE``, array or object nested deeper than
    ``STORE_MAX_DEPTH``, or string (or object key) with a lone surrogate. ``str(exc)`` when the
    value has none of them. Runs on the error path only: it stops at the first cause, as the
    encoder did, and never descends past the depth limit (a cyclic value ends there too)."""
    cause = _unstorable_part(value, 1)
    return cause if cause is not None else str(exc)


def _unstorable_part(value: object, depth: int) -> str | None:
    """The first cause ``unstorable`` names in ``value``, a container at nesting level ``depth``."""
    if isinstance(value, str):
        return None if _is_unicode(value) else _LONE_SURROGATE
    if isinstance(value, int):  # bool too (always in range)
        return None if STORE_INT_RANGE[0] <= value <= STORE_INT_RANGE[1] else _WIDE_INT
    if isinstance(value, BaseModel):  # a request model_dump refused: its fields, one object
        value = dict(value)
    if not isinstance(value, (dict, list, tuple)):
        return None
    if depth > STORE_MAX_DEPTH:
        return _TOO_DEEP
    pairs = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    for key, item in pairs:  # an object's key before its value, as the encoder writes them
        if isinstance(key, str) and not _is_unicode(key):
            return _LONE_SURROGATE
        if (cause := _unstorable_part(item, depth + 1)) is not None:
            return cause
    return None


def _is_unicode(text: str) -> bool:
    """False when ``text`` holds a lone surrogate (UTF-8 cannot encode it)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Kept(dict[bytes, TurnRequest]):
    """Parsed requests by their stored bytes, oldest first, with ``nbytes``: the stored bytes of
    all of them, kept by ``stored_request`` as it adds and evicts (a sum over up to 1,024 keys per
    new turn was 2% of a steps worker's samples: bench/README.md, "Worker CPU per turn, third pass")."""

    nbytes = 0


# Stored requests parsed in this process (``stored_request``).
_PARSED = _Kept()
_PARSED_MAX = 1024
# And at most this many stored bytes: a request may be up to ``AGENT_MAX_INPUT_BYTES`` (1 MB) and
# its parsed objects take about five times its bytes; 1,024 of them held gigabytes per process.
_PARSED_MAX_BYTES = 16 * 1024 * 1024
# A threads pool's tasks read it at once: two evicting the same oldest entry raised KeyError.
_PARSED_LOCK = threading.Lock()


def stored_request(raw: bytes) -> TurnRequest:
    """The ``TurnRequest`` a turn hash stores as ``raw`` (its ``request`` field: JSON bytes),
    validated once per process: every step and every tool call of a turn reads it, and the same
    bytes always parse to the same request. The instance is shared (the model is frozen; its
    lists and dicts must not be changed in place either). At most ``_PARSED_MAX`` are kept, of at
    most ``_PARSED_MAX_BYTES`` stored bytes in all (the oldest go first; a larger one is not
    kept). Raises pydantic's ``ValidationError`` as ``model_validate_json`` does."""
    request = _PARSED.get(raw)
    if request is None:
        request = TurnRequest.model_validate_json(raw)
        with _PARSED_LOCK:
            if raw in _PARSED:  # another thread parsed it meanwhile: one shared instance
                request = _PARSED[raw]
            elif len(raw) <= _PARSED_MAX_BYTES:
                kept = _PARSED.nbytes + len(raw)
                while _PARSED and (len(_PARSED) >= _PARSED_MAX or kept > _PARSED_MAX_BYTES):
                    oldest = next(iter(_PARSED))
                    del _PARSED[oldest]
                    kept -= len(oldest)
                _PARSED[raw] = request
                _PARSED.nbytes = kept
    return request
