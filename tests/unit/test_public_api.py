"""The public API: ``worker.api`` (tool authors) and ``control.client`` (embedders) say what they
export, ship ``py.typed``, raise errors under one root, and the docs import only from them."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from worker.errors import AgentRuntimeError

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {"worker.api": "docs/writing-a-tool.md", "control.client": "docs/control-plane.md"}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_modules_say_what_they_export(module):
    mod = importlib.import_module(module)
    assert len(set(mod.__all__)) == len(mod.__all__), "a name is exported twice"
    missing = [name for name in mod.__all__ if not hasattr(mod, name)]
    assert missing == []


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_every_exported_error_derives_from_the_one_root(module):
    mod = importlib.import_module(module)
    errors = [getattr(mod, n) for n in mod.__all__ if inspect.isclass(getattr(mod, n))]
    errors = [e for e in errors if issubclass(e, BaseException)]
    assert AgentRuntimeError in errors and len(errors) > 1
    assert [e.__name__ for e in errors if not issubclass(e, AgentRuntimeError)] == []


def test_the_public_errors_keep_their_standard_bases():
    # ``except ValueError`` written before the root existed still catches them.
    from control.errors import ControlPlaneError
    from worker.api import ToolDefinitionError
    from worker.model.interface import GatewayError
    from worker.turn.approvals import ApprovalConflict
    from worker.turn.request import TurnRefused

    assert issubclass(ToolDefinitionError, ValueError) and issubclass(TurnRefused, ValueError)
    assert issubclass(GatewayError, RuntimeError) and issubclass(ControlPlaneError, RuntimeError)
    assert issubclass(ApprovalConflict, AgentRuntimeError) and issubclass(ApprovalConflict, ValueError)


def test_errors_raised_across_the_control_plane_derive_from_the_root():
    """What ``ControlPlane``'s methods document they raise (their ``Raises`` lines), and what a
    tool's arguments or definition raise, is an ``AgentRuntimeError`` (pydantic's own
    ``ValidationError`` aside: the request model's, documented as such)."""
    import control.client

    raised = set()
    for _, fn in inspect.getmembers(control.client.ControlPlane, inspect.isfunction):
        raised |= set(re.findall(r"``(\w+Error|\w+Conflict|NotFound|Refused)``", fn.__doc__ or ""))
    raised -= {"ValidationError"}
    assert raised, "ControlPlane documents no error"
    for name in raised:
        cls = getattr(control.client, name, None) or getattr(importlib.import_module("control.errors"), name)
        assert issubclass(cls, AgentRuntimeError), name


@pytest.mark.parametrize("package", ["worker", "control"])
def test_the_public_packages_ship_py_typed(package):
    assert (ROOT / package / "py.typed").is_file()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(rf'^"{package}" = \[[^\]]*"py\.typed"', pyproject, re.M), "not in the package data"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def _imports(code: str) -> list[tuple[str, list[str]]]:
    """``(module, names)`` of each import statement (``import m``: ``(m, [])``)."""
    out = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom):
            out.append((node.module or "", [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names]
    return out


@pytest.mark.parametrize(("module", "doc"), sorted(PUBLIC.items()))
def test_the_docs_import_only_from_the_public_api(module, doc):
    """Every import of the project that the document shows (code blocks, and ``from ... import``
    written inline) is from its public module, and names what that module exports."""
    text = (ROOT / doc).read_text()
    exported = set(importlib.import_module(module).__all__)
    found = []
    for block in _python_blocks(text):
        found += _imports(block)
    for inline in re.findall(r"`(from [\w.]+ import [\w, ]+)`", text):
        found += _imports(inline)
    ours = [(m, names) for m, names in found if m.split(".")[0] in ("worker", "control", "tasks", "devtools")]
    assert ours, f"{doc} shows no import of the project"
    for m, names in ours:
        assert m == module, f"{doc} imports from {m}; its public API is {module}"
        assert set(names) <= exported, set(names) - exported
