"""Named toolsets: which category assembly a turn uses.

A turn request names its ``toolset``. Built in: ``text`` (the main text-turn
catalog, ``worker.tools.assembly.text_turn_tools``) and ``workflow_task`` (the fixed
workflow task catalog). Extra toolsets are configured explicitly with
``AGENT_EXTRA_TOOLSETS="name=module:function,..."`` (tests, plugins): no
discovery, no registry scanning.
"""

from __future__ import annotations

import importlib
from typing import Callable

from worker.errors import AgentRuntimeError
from worker.settings import Settings
from worker.turn.interfaces import Toolset


class UnknownToolset(AgentRuntimeError, LookupError):
    """The turn names a toolset this worker does not have."""


BUILTIN = ("text", "workflow_task")


def _import(spec: str) -> Toolset:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"toolset spec {spec!r} must look like 'package.module:function'")
    toolset: Toolset = getattr(importlib.import_module(module), attr)
    return toolset


def extra_toolset_specs(settings: Settings) -> dict[str, str]:
    """``AGENT_EXTRA_TOOLSETS`` parsed: ``{name: "module:function"}`` (nothing imported).

    Raises ``ValueError`` naming the variable for a malformed entry.
    """
    specs: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in settings.extra_toolsets.split(","))):
        name, sep, spec = (part.strip() for part in entry.partition("="))
        if not sep or not name or ":" not in spec:
            raise ValueError(f"AGENT_EXTRA_TOOLSETS entry {entry!r} must look like 'name=package.module:function'")
        specs[name] = spec
    return specs


def toolset_names(settings: Settings) -> list[str]:
    """Every toolset name a turn may use with these settings (built in and configured)."""
    return sorted({*BUILTIN, *extra_toolset_specs(settings)})


def toolset_resolver(settings: Settings) -> Callable[[str], Toolset]:
    """Return ``resolve(name) -> Toolset``; raises ``UnknownToolset`` for an unknown name.

    Extra toolsets are imported on first use, so a process that only enqueues turns (the
    control plane) never imports tool code; workers import them all at start
    (``check_toolsets``).
    """
    specs = extra_toolset_specs(settings)
    table: dict[str, Toolset] = {}

    def resolve(name: str) -> Toolset:
        if name not in table:
            if name in BUILTIN:
                from worker.tools import assembly

                table[name] = assembly.text_turn_tools if name == "text" else assembly.workflow_task_tools
            elif name in specs:
                table[name] = _import(specs[name])
            else:
                raise UnknownToolset(f"unknown toolset {name!r}; this worker has: {', '.join(toolset_names(settings))}")
        return table[name]

    return resolve


def check_toolsets(settings: Settings) -> None:
    """Import every configured toolset now. Raises ``ValueError`` naming ``AGENT_EXTRA_TOOLSETS``
    and the entry when one cannot be imported (a worker must not start with a broken toolset)."""
    resolve = toolset_resolver(settings)
    for name in toolset_names(settings):
        try:
            resolve(name)
        except Exception as exc:
            raise ValueError(
                f"AGENT_EXTRA_TOOLSETS: toolset {name!r} cannot be loaded: {exc.__class__.__name__}: {exc}"
            ) from exc
