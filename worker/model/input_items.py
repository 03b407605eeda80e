"""The Responses API's input item shapes, checked when a turn is enqueued (``TurnRequest.input``).

The items this runtime reads and writes are checked field by field (pydantic models below):
messages (``role`` user/assistant/system/developer; ``content`` a string or content parts:
``input_text``/``input_image``/``input_file`` for user, system and developer, ``output_text``/
``refusal`` (and input parts) for assistant), ``function_call``, ``function_call_output``,
``reasoning``, ``item_reference``, ``custom_tool_call`` and its output. The other item types the
API documents (hosted tools' calls, MCP, shell, compaction...) are accepted by their ``type``
alone: the runtime passes them to the model unchanged. Extra keys are allowed (new API fields).

``check_input_items`` raises ``InputItemError`` with the path of the first error
(``input[0].role``), as the API does with its ``param``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from worker.errors import AgentRuntimeError


class _Item(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _InputText(_Item):
    type: Literal["input_text"]
    text: str


class _InputImage(_Item):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["low", "high", "auto", "original"] | None = None


class _InputFile(_Item):
    type: Literal["input_file"]
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class _OutputText(_Item):
    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None


class _Refusal(_Item):
    type: Literal["refusal"]
    refusal: str


_INPUT_PARTS: dict[str, type[_Item]] = {"input_text": _InputText, "input_image": _InputImage, "input_file": _InputFile}
_ASSISTANT_PARTS: dict[str, type[_Item]] = {**_INPUT_PARTS, "output_text": _OutputText, "refusal": _Refusal}


class _Message(_Item):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[dict[str, Any]]


class _FunctionCall(_Item):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class _FunctionCallOutput(_Item):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


class _Summary(_Item):
    type: Literal["summary_text"]
    text: str


class _Reasoning(_Item):
    type: Literal["reasoning"]
    summary: list[_Summary]


class _ItemReference(_Item):
    type: Literal["item_reference"] | None = None
    id: str


class _CustomToolCall(_Item):
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str


class _CustomToolCallOutput(_Item):
    type: Literal["custom_tool_call_output"]
    call_id: str
    output: str | list[dict[str, Any]]


CHECKED: dict[str, type[_Item]] = {
    "message": _Message,
    "function_call": _FunctionCall,
    "function_call_output": _FunctionCallOutput,
    "reasoning": _Reasoning,
    "item_reference": _ItemReference,
    "custom_tool_call": _CustomToolCall,
    "custom_tool_call_output": _CustomToolCallOutput,
}
# Documented item types passed through by type alone.
PASSED = frozenset(
    {
        "file_search_call",
        "computer_call",
        "computer_call_output",
        "web_search_call",
        "tool_search_call",
        "tool_search_output",
        "additional_tools",
        "configuration_update",
        "compaction",
        "compaction_trigger",
        "image_generation_call",
        "code_interpreter_call",
        "local_shell_call",
        "local_shell_call_output",
        "shell_call",
        "shell_call_output",
        "apply_patch_call",
        "apply_patch_call_output",
        "mcp_list_tools",
        "mcp_approval_request",
        "mcp_approval_response",
        "mcp_call",
        "program",
        "program_output",
    }
)
_ADAPTERS: dict[str, TypeAdapter[_Item]] = {name: TypeAdapter(model) for name, model in CHECKED.items()}


class InputItemError(AgentRuntimeError, ValueError):
    """An input item that is not a Responses input item: ``path`` (``input[2].content[0].text``)
    and ``detail`` (what is wrong)."""

    def __init__(self, path: str, detail: str):
        super().__init__(f"{path}: {detail}")
        self.path, self.detail = path, detail


def _path(base: str, loc: tuple[Any, ...]) -> str:
    out = base
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _validate(adapter: TypeAdapter[_Item], value: Any, base: str) -> None:
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputItemError(
            _path(base, tuple(x for x in e["loc"] if x not in ("str", "list[dict[str,any]]"))), e["msg"]
        ) from None


def _check_parts(parts: list[dict[str, Any]], allowed: dict[str, type[_Item]], base: str) -> None:
    for j, part in enumerate(parts):
        where = f"{base}[{j}]"
        kind = part.get("type")
        if kind not in allowed:
            raise InputItemError(f"{where}.type", f"expected one of {', '.join(sorted(allowed))}, got {kind!r}")
        _validate(TypeAdapter(allowed[kind]), part, where)


def check_input_items(items: Any, base: str = "input") -> None:
    """Check a list of Responses input items; raises ``InputItemError`` at the first bad one."""
    if not isinstance(items, list):
        raise InputItemError(base, "expected a string or a list of input items")
    if not items:
        raise InputItemError(base, "the list of input items is empty")
    for i, item in enumerate(items):
        where = f"{base}[{i}]"
        if not isinstance(item, dict):
            raise InputItemError(where, f"expected an object, got {type(item).__name__}")
        kind = item.get("type", "message")
        if kind in PASSED:
            continue
        if kind not in CHECKED:
            raise InputItemError(f"{where}.type", f"unknown input item type {kind!r}")
        _validate(_ADAPTERS[kind], item, where)
        if kind == "message" and isinstance(item["content"], list):
            allowed = _ASSISTANT_PARTS if item["role"] == "assistant" else _INPUT_PARTS
            _check_parts(item["content"], allowed, f"{where}.content")
        elif kind in ("function_call_output", "custom_tool_call_output") and isinstance(item["output"], list):
            _check_parts(item["output"], _INPUT_PARTS, f"{where}.output")
