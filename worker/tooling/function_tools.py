"""Tools from plain Python functions: signature -> pydantic input model.

``function_input_model(fn)`` builds a pydantic model whose fields are the
function's parameters (same rules as openai-agents-python
``function_schema``): annotations give the types, defaults (including
``Field(...)``) the defaults and constraints, a Google/NumPy/reST docstring
(parsed with ``docstring-parser``) the descriptions; the model title is
``<function name>_args``. ``*args: T`` becomes a list field (``T`` kept as is
when it is already a sequence type such as ``tuple[int, ...]``);
``**kwargs: T`` becomes a ``dict[str, T]`` field (kept as is when already a
mapping type), which is an open map and so cannot be strict.

``function_tool(fn, ...)`` wraps it as a ``WorkerTool`` whose ``execute``
calls ``fn`` with the validated params (``call_arguments``) and returns its
value as the ``ToolResult`` content.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any, Callable

from docstring_parser import parse as parse_docstring
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool

_SEQUENCES = (list, tuple, collections.abc.Sequence)
_MAPPINGS = (dict, collections.abc.Mapping)


def _is_a(annotation: object, kinds: tuple[type, ...]) -> bool:
    origin = typing.get_origin(annotation) or annotation
    return isinstance(origin, type) and issubclass(origin, kinds)


def function_input_model(fn: Callable[..., Any]) -> type[BaseModel]:
    """Pydantic model of ``fn``'s parameters (see the module docstring for the rules).

    A parameter without annotation is typed ``Any``; a ``ctx: ToolContext``
    parameter is skipped (the runtime passes it). Raises pydantic's
    ``PydanticSchemaGenerationError`` for a type pydantic cannot handle.
    """
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    docs = {p.arg_name: p.description for p in parse_docstring(fn.__doc__ or "").params}
    fields: dict[str, Any] = {}
    for name, param in sig.parameters.items():
        ann = hints.get(name, Any)
        if ann is ToolContext:
            continue
        default = param.default
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            ann = ann if _is_a(ann, _SEQUENCES) else list[ann]  # type: ignore[valid-type]
            default = Field(default_factory=list)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            ann = ann if _is_a(ann, _MAPPINGS) else dict[str, ann]  # type: ignore[valid-type]
            default = Field(default_factory=dict)
        elif default is inspect.Parameter.empty:
            default = ...
        if name in docs:
            if isinstance(default, FieldInfo):
                if default.description is None:
                    default.description = docs[name]
            else:
                default = Field(default, description=docs[name])
        fields[name] = (ann, default)
    return create_model(f"{fn.__name__}_args", __config__=ConfigDict(title=f"{fn.__name__}_args"), **fields)


def call_arguments(fn: Callable[..., Any], params: BaseModel) -> tuple[list[Any], dict[str, Any]]:
    """``(args, kwargs)`` to call ``fn`` with validated ``params`` (``*args``/``**kwargs`` expanded)."""
    args: list[Any] = []
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if name not in type(params).model_fields:
            continue
        value = getattr(params, name)
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            args.extend(value)
        elif param.kind is inspect.Parameter.VAR_KEYWORD:
            kwargs.update(value)
        elif param.kind is inspect.Parameter.KEYWORD_ONLY:
            kwargs[name] = value
        else:
            args.append(value)
    return args, kwargs


def function_tool(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None, **options: Any
) -> WorkerTool[Any]:
    """A ``WorkerTool`` running ``fn``; ``options`` go to ``define_worker_tool`` (``strict``, ...).

    Raises ``ToolDefinitionError`` like ``define_worker_tool`` (e.g. strict
    with a ``Mapping``/``**kwargs`` parameter).
    """
    model = function_input_model(fn)
    doc = parse_docstring(fn.__doc__ or "")
    wants_ctx = any(a is ToolContext for a in typing.get_type_hints(fn).values())

    def execute(params: BaseModel, ctx: ToolContext) -> ToolResult:
        args, kwargs = call_arguments(fn, params)
        if wants_ctx:
            kwargs["ctx"] = ctx
        return ToolResult(content=fn(*args, **kwargs))

    return define_worker_tool(
        name=name or fn.__name__,
        description=description if description is not None else (doc.short_description or fn.__name__),
        execute=execute,
        input_model=model,
        **options,
    )
