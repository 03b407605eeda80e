"""Named toolsets: which category assembly a turn uses.

A turn request names its ``toolset``. Built in: ``text`` (the main text-turn
catalog, ``worker.assembly.text_turn_tools``) and ``workflow_task`` (the fixed
workflow task catalog). Extra toolsets are configured explicitly with
``AGENT_EXTRA_TOOLSETS="name=module:function,..."`` (tests, plugins): no
discovery, no registry scanning.
"""

from __future__ import annotations

import importlib
from typing import Callable

from worker.contract import WorkerTool
from worker.settings import Settings
from worker.turn_context import TurnContext

Toolset = Callable[[TurnContext], list[WorkerTool]]


class UnknownToolset(LookupError):
    """The turn names a toolset this worker does not have."""


def _import(spec: str) -> Toolset:
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"toolset spec {spec!r} must look like 'package.module:function'")
    return getattr(importlib.import_module(module), attr)


def toolset_resolver(settings: Settings) -> Callable[[str], Toolset]:
    """Return ``resolve(name) -> Toolset``; raises ``UnknownToolset`` for an unknown name."""
    from worker.assembly import text_turn_tools, workflow_task_tools

    table: dict[str, Toolset] = {"text": text_turn_tools, "workflow_task": workflow_task_tools}
    for entry in filter(None, (e.strip() for e in settings.extra_toolsets.split(","))):
        name, _, spec = entry.partition("=")
        table[name.strip()] = _import(spec.strip())

    def resolve(name: str) -> Toolset:
        try:
            return table[name]
        except KeyError:
            raise UnknownToolset(f"unknown toolset {name!r}; this worker has: {', '.join(sorted(table))}") from None

    return resolve
