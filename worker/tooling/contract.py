"""The tool contract: ``WorkerTool`` and ``define_worker_tool``.

A ``WorkerTool`` is everything the runtime needs to offer a tool to the model
and to run it: its name and description, its input schema (a pydantic model or
a raw JSON Schema), provider flags (``strict``, namespace, ``defer_loading``),
its execution mode, safety metadata, activity labels and ``execute``.

``execute(params, ctx)`` only ever receives validated params: an instance of
the tool's pydantic model, or a ``dict`` that passed ``jsonschema`` validation
against the raw schema. It returns a ``ToolResult``.
"""

from __future__ import annotations

import inspect
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Generic, Literal, Protocol, TypeVar

import orjson
import redis
from pydantic import BaseModel
from redis import Redis

from worker.errors import AgentRuntimeError
from worker.settings import Settings
from worker.tooling.errors import ToolDefinitionError
from worker.tooling.schemas import current_provider, function_definition

ExecutionMode = Literal["parallel", "sequential"]

NeedsApproval = bool | Callable[[Any, Any], bool]
"""``True``/``False``, or ``(validated_params, turn_context) -> bool`` deciding per call."""

# OpenAI function names: "a-z, A-Z, 0-9, underscores and dashes, max length 64"
# (Responses API reference, FunctionTool.name).
TOOL_NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")

MAX_DESCRIPTION_CHARS = 1024
"""OpenAI limit on a function tool's ``description`` (strict-mode-rules.json, D10)."""

P = TypeVar("P")


class TurnAborted(AgentRuntimeError):
    """Raised by ``AbortSignal.raise_if_aborted`` when the turn was cancelled."""


class AbortSignal:
    """Cancellation seen by running tools.

    ``aborted`` turns true when ``abort()`` is called locally or when the
    optional ``probe`` callable (for instance a Redis cancel-flag check)
    returns true. Probing is rate-limited to once per ``probe_interval``
    seconds so that tight loops stay cheap; ``probed=True`` says the caller has just read the
    flag unset, so the first probe waits one interval (a short tool makes no probe at all).
    """

    def __init__(self, probe: Callable[[], bool] | None = None, probe_interval: float = 0.25, *, probed: bool = False):
        self._event = threading.Event()
        self._probe = probe
        self._probe_interval = probe_interval
        self._last_probe = time.monotonic() if probed else 0.0
        self.reason: str | None = None

    def abort(self, reason: str = "cancelled") -> None:
        """Abort locally (e.g. on a worker shutdown) with ``reason``."""
        self.reason = reason
        self._event.set()

    @property
    def aborted(self) -> bool:
        """True once aborted locally or when the probe (rate-limited) reports cancellation."""
        if self._event.is_set():
            return True
        if self._probe is not None:
            now = time.monotonic()
            if now - self._last_probe >= self._probe_interval:
                self._last_probe = now
                if self._probe():
                    self.abort("cancelled")
                    return True
        return False

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds; return True early if aborted."""
        end = time.monotonic() + timeout
        while True:
            if self.aborted:
                return True
            left = end - time.monotonic()
            if left <= 0:
                return False
            self._event.wait(min(left, self._probe_interval))

    def raise_if_aborted(self) -> None:
        """Raise ``TurnAborted`` if aborted: a convenient check point inside long tools."""
        if self.aborted:
            raise TurnAborted(self.reason or "cancelled")


@dataclass(frozen=True)
class PresentationEvent:
    """A reply presentation event for the user-facing surface (not seen by the model).

    ``kind`` is a short type tag (``"file"``, ``"link"``, ``"table"``...);
    ``data`` is a JSON-serialisable dict.
    """

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class ToolResult:
    """What ``execute`` returns.

    - ``content``: the text the model sees as the ``function_call_output``
      (a ``str``; a dict/list is JSON-encoded by the runtime).
    - ``details``: structured data for logs and the transcript (JSON-serialisable).
    - ``presentation_events``: optional events for the reply surface.
    - ``terminate``: when true, the turn ends after the current batch of
      calls without another model call.
    - ``is_error``: marks the output as a failure (recorded in details).
    """

    content: Any
    details: dict[str, Any] = field(default_factory=dict)
    presentation_events: list[PresentationEvent] = field(default_factory=list)
    terminate: bool = False
    is_error: bool = False


class EnqueueTurn(Protocol):
    """Start a turn: ``request`` is a ``TurnRequest`` or its JSON dict; returns the turn id (an
    existing one for a reused idempotency key or turn id). Raises ``pydantic.ValidationError`` or
    ``TurnRefused`` (``worker.turn.request``)."""

    def __call__(self, request: Any, turn_id: str | None = None) -> str: ...


@dataclass(frozen=True)
class ToolServices:
    """The services a tool (and a tool category creator) may use, given by the layer that runs
    it; each is None when the turn has none, and a tool or creator treats None as "capability
    absent" (the creator offers no tool that needs it).

    - ``redis``: the runtime's Redis client (Brain pages, workflow tasks, jobs, schedules, todos);
    - ``settings``: the worker's ``Settings``;
    - ``enqueue_turn(request, turn_id=None) -> turn_id``: start another turn (``EnqueueTurn``);
    - ``cancel_turn(turn_id) -> bool``: ask a turn to stop (False when unknown or already ended);
    - ``save_schedule_entry(record) -> None`` / ``delete_schedule_entry(schedule_id) -> None``: a
      schedule's timer entry (``worker.records.schedules.ScheduleRecord``), kept by the Celery edge.
    """

    redis: redis.Redis | None = None
    settings: Settings | None = None
    enqueue_turn: EnqueueTurn | None = None
    cancel_turn: Callable[[str], bool] | None = None
    save_schedule_entry: Callable[[Any], None] | None = None
    delete_schedule_entry: Callable[[str], None] | None = None

    def redis_client(self) -> Redis:  # (in this class, ``redis`` names the field)
        """``redis``, for a tool that is only offered with it; raises ``RuntimeError`` when absent."""
        if self.redis is None:
            raise RuntimeError("this turn has no Redis client")
        return self.redis


@dataclass
class ToolContext:
    """What a running tool may use besides its params.

    - ``turn_id`` / ``call_id``: identify the turn and the function call
      (``call_id`` scoped by turn is the call's idempotency key).
    - ``home``: the agent's home directory; file and command tools are
      confined to it.
    - ``abort``: the turn's ``AbortSignal``.
    - ``agent_id``: the agent the turn belongs to.
    - ``services``: the ``ToolServices`` of the turn.
    - ``metadata``: the turn request's ``metadata`` (free JSON of the control plane).
    """

    turn_id: str
    call_id: str
    home: Path
    abort: AbortSignal
    agent_id: str = "agent"
    services: ToolServices = field(default_factory=ToolServices)
    metadata: dict[str, Any] = field(default_factory=dict)


MAX_LABEL_CHARS = 300
"""An activity label longer than this is cut (with ``...``)."""


def _short(label: str) -> str:
    return label if len(label) <= MAX_LABEL_CHARS else label[: MAX_LABEL_CHARS - 3] + "..."


def _default_describe(name: str) -> Callable[[Any], str]:
    return lambda params: f"Running {name}"


@dataclass(frozen=True, eq=False)
class WorkerTool(Generic[P]):
    """A tool the runtime can offer and run. Build it with ``define_worker_tool``.

    Fields are the tool contract (docs/writing-a-tool.md). ``input_model`` and
    ``json_schema`` are mutually exclusive; with neither the tool takes no
    arguments (an empty object schema).
    """

    name: str
    description: str
    execute: Callable[[P, ToolContext], ToolResult]
    input_model: type[BaseModel] | None = None
    json_schema: dict[str, Any] | None = None
    strict: bool = False
    namespace: str | None = None
    namespace_description: str | None = None
    defer_loading: bool = False
    execution_mode: ExecutionMode = "parallel"
    is_read_only: bool = False
    is_destructive: bool = False
    describe_activity: Callable[[P], str] | None = None
    describe_completed_activity: Callable[[P, ToolResult], str] | None = None
    needs_approval: NeedsApproval = False
    # Runs on the agent's computer (its home, its commands): such a call is routed to the node
    # that holds the agent's home (docs/placement.md); any other call runs on any tools worker.
    needs_computer: bool = False

    def approval_required(self, params: P, ctx: Any) -> bool:
        """Whether a person must approve this call before it runs (the tool's own declaration).

        ``ctx`` is the turn's ``TurnContext``. A decision function that raises counts as
        "needs approval": when in doubt, ask.
        """
        if not callable(self.needs_approval):
            return bool(self.needs_approval)
        try:
            return bool(self.needs_approval(params, ctx))
        except Exception:
            return True

    @property
    def is_async(self) -> bool:
        """True when ``execute`` is a coroutine function (run with ``asyncio.run``)."""
        return inspect.iscoroutinefunction(self.execute)

    def activity(self, params: P) -> str:
        """Short label for progress, e.g. ``"Reading src/app.py"``, at most ``MAX_LABEL_CHARS``
        (a label quotes model-chosen params, and goes into the plan and several events). Never raises."""
        fn = self.describe_activity or _default_describe(self.name)
        try:
            return _short(str(fn(params)))
        except Exception:  # a label must never break a call
            return f"Running {self.name}"

    def completed_activity(self, params: P, result: ToolResult) -> str:
        """Label after completion, e.g. ``"Read 120 lines of src/app.py"``, capped as ``activity``.
        Never raises."""
        if self.describe_completed_activity is None:
            return self.activity(params)
        try:
            return _short(str(self.describe_completed_activity(params, result)))
        except Exception:
            return self.activity(params)


def define_worker_tool(
    *,
    name: str,
    description: str,
    execute: Callable[[Any, ToolContext], ToolResult],
    input_model: type[BaseModel] | None = None,
    json_schema: dict[str, Any] | None = None,
    strict: bool = False,
    namespace: str | None = None,
    namespace_description: str | None = None,
    defer_loading: bool = False,
    execution_mode: ExecutionMode = "parallel",
    is_read_only: bool = False,
    is_destructive: bool = False,
    describe_activity: Callable[[Any], str] | None = None,
    describe_completed_activity: Callable[[Any, ToolResult], str] | None = None,
    needs_approval: NeedsApproval = False,
    needs_computer: bool = False,
) -> WorkerTool[Any]:
    """Build a ``WorkerTool`` and check it can be offered to a model.

    The parameters schema is generated (or taken raw), checked and cached
    here, so a broken tool fails when it is defined, not mid-turn.

    Raises ``ToolDefinitionError`` when: the name breaks the OpenAI function
    name rule (``^[A-Za-z0-9_-]{1,64}$``); both ``input_model`` and
    ``json_schema`` are given; the schema root is not an object ("function
    tool parameters must use a root object schema"); ``execution_mode`` is not
    ``parallel`` or ``sequential``; a tool is both read-only and destructive;
    ``strict`` is asked of a schema that OpenAI strict mode cannot express
    (the error names the field and the rule); the description is empty or
    longer than ``MAX_DESCRIPTION_CHARS`` (1024, the API's limit); or a raw
    schema has a ``$ref`` that is not local or does not resolve; ``needs_approval`` is
    neither a bool nor a callable.

    ``needs_approval``: ``True`` (every call waits for a person), ``False``, or a function
    ``(validated_params, turn_context) -> bool`` deciding per call (e.g. a command tool that
    needs approval unless the command is on an allowlist). Whether it is honoured depends on
    the turn's approval mode (``worker.turn.approvals``).

    ``needs_computer``: the tool touches the agent's home (files, commands). Its calls run on the
    node that holds that home, through the node's own queue (``docs/placement.md``); a tool that
    keeps its state in Redis or calls the network leaves it False and runs on any tools worker.
    """
    # A category creator defines the same tools on every step and every call: a definition is
    # checked once per process (the key holds all the checks read; a raw schema, a mutable dict,
    # by its content as it is now).
    checked = _definition_key(name, description, input_model, json_schema, strict, namespace, defer_loading)
    if checked is None or checked not in _CHECKED:
        _check_definition(name, description, input_model, json_schema, namespace)
    if execution_mode not in ("parallel", "sequential"):
        raise ToolDefinitionError(
            f"tool {name!r}: execution_mode must be 'parallel' or 'sequential', got {execution_mode!r}"
        )
    if is_read_only and is_destructive:
        raise ToolDefinitionError(f"tool {name!r}: a tool cannot be both read-only and destructive")
    if not callable(execute):
        raise ToolDefinitionError(f"tool {name!r}: execute must be callable")
    if not (isinstance(needs_approval, bool) or callable(needs_approval)):
        raise ToolDefinitionError(f"tool {name!r}: needs_approval must be a bool or a callable (params, context)")
    # The frozen dataclass's own __init__ sets each of the 16 fields through object.__setattr__
    # (2.9 us a tool); a category creator defines all its tools again for every step and call, so
    # the fields go in with one dict update (every field, as WorkerTool(...) would set them:
    # tests/unit/tooling/test_accepted_path.py compares the two).
    tool: WorkerTool[Any] = _new_tool(WorkerTool)
    tool.__dict__.update(
        name=name,
        description=description,
        execute=execute,
        input_model=input_model,
        json_schema=json_schema,
        strict=bool(strict),
        namespace=namespace,
        namespace_description=namespace_description,
        defer_loading=bool(defer_loading),
        execution_mode=execution_mode,
        is_read_only=bool(is_read_only),
        is_destructive=bool(is_destructive),
        describe_activity=describe_activity,
        describe_completed_activity=describe_completed_activity,
        needs_approval=needs_approval,
        needs_computer=bool(needs_computer),
    )
    if checked is None or checked not in _CHECKED:
        try:
            function_definition(tool)  # generates, checks and caches the parameters schema
        except ToolDefinitionError:
            raise
        except Exception as exc:  # pydantic schema generation errors, bad raw schemas
            raise ToolDefinitionError(f"tool {name!r}: cannot build its parameters schema: {exc}") from exc
        if checked is not None:
            if len(_CHECKED) > 4096:
                _CHECKED.clear()
            _CHECKED.add(checked)
    return tool


_new_tool = object.__new__

# Definitions checked so far, by what their checks read (``_definition_key``).
_CHECKED: set[tuple[object, ...]] = set()


def _definition_key(
    name: str,
    description: str,
    input_model: type[BaseModel] | None,
    json_schema: dict[str, Any] | None,
    strict: bool,
    namespace: str | None,
    defer_loading: bool,
) -> tuple[object, ...] | None:
    """What a definition's checks read, as a key of ``_CHECKED``: a raw schema by its canonical
    JSON (sorted keys); None for a raw schema that is not JSON (it is checked, and refused, every
    time)."""
    schema: bytes | None = None
    if json_schema is not None:
        try:
            schema = orjson.dumps(json_schema, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            return None
    return (current_provider(), name, description, input_model, schema, bool(strict), namespace, bool(defer_loading))


def _check_definition(
    name: str,
    description: str,
    input_model: type[BaseModel] | None,
    json_schema: dict[str, Any] | None,
    namespace: str | None,
) -> None:
    """``define_worker_tool``'s checks of a name, description, schema source and namespace."""
    if not TOOL_NAME_PATTERN.match(name or ""):
        raise ToolDefinitionError(
            f"tool name {name!r} is invalid: OpenAI function names must match ^[A-Za-z0-9_-]{{1,64}}$"
        )
    if not description or not description.strip():
        raise ToolDefinitionError(f"tool {name!r}: description must not be empty")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ToolDefinitionError(
            f"tool {name!r}: description is {len(description)} characters, the limit is {MAX_DESCRIPTION_CHARS} "
            "(the API refuses the request: \"Invalid 'tools[n].function.description': string too long. "
            f'Expected a string with maximum length {MAX_DESCRIPTION_CHARS}", rule D10); shorten it'
        )
    if input_model is not None and json_schema is not None:
        raise ToolDefinitionError(f"tool {name!r}: give either input_model or json_schema, not both")
    if input_model is not None and not (isinstance(input_model, type) and issubclass(input_model, BaseModel)):
        raise ToolDefinitionError(f"tool {name!r}: input_model must be a pydantic BaseModel subclass")
    if namespace is not None and not TOOL_NAME_PATTERN.match(namespace):
        raise ToolDefinitionError(f"tool {name!r}: namespace {namespace!r} must match ^[A-Za-z0-9_-]{{1,64}}$")
