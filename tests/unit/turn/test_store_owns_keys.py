"""The turn store owns its keys: no module outside it names a turn key or reaches its client.

A turn's keys (``worker.turn.keys``) are read and written by the store's modules only
(``STORE_MODULES``); everything else calls their methods, so a change to a key's layout touches the
store and its tests only (docs/architecture.md, "Who owns which keys"). The rule is read from the
code (its syntax tree), over every module of the product's packages, and each kind of breach is
planted in a copy to show the check catches it.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("worker", "tasks", "control", "devtools", "bench")

STORE_MODULES = frozenset(
    {
        "worker/turn/store.py",
        "worker/turn/keys.py",
        "worker/turn/guard.py",
        "worker/turn/moves.py",
        "worker/turn/claims.py",
        "worker/turn/barrier.py",
        "worker/turn/memo.py",
        "worker/turn/approvals.py",
        "worker/turn/usage.py",
        "worker/turn/async_reads.py",
        "worker/turn/listing.py",
    }
)
"""The store: ``TurnStore`` and the parts it builds on its client, the key scheme, and the asyncio
reads of the HTTP control plane."""

READER_NAMES = frozenset({"hash_key", "events_key", "AGENT_FIELD", "PENDING_APPROVALS_KEY"})
"""What ``worker.turn.keys`` gives readers outside the store: a key as an opaque name to follow or
to pass to a script, never a layout to build on."""

# A turn key's text as the store writes it: ``turn:{<id>}...``, the turn-wide sets, idempotency keys.
TURN_KEY = re.compile(r"turn:\{|turns:(watch|finishing|index)\b|approvals:pending|turn-idem:")


def _docstrings(tree: ast.AST) -> set[int]:
    """``id`` of every docstring node (they may describe keys; they name none)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def _store_reach(node: ast.Attribute) -> bool:
    """``x._r`` on anything but ``self``, or ``<...>.store.r``: the store's client (or a part's)."""
    if node.attr == "_r":
        return not (isinstance(node.value, ast.Name) and node.value.id == "self")
    if node.attr == "r":
        inner = node.value
        name = inner.attr if isinstance(inner, ast.Attribute) else inner.id if isinstance(inner, ast.Name) else ""
        return name in {"store", "moves", "claims", "barrier", "memo", "approvals", "usage"}
    return False


def breaches(source: str, path: str) -> list[str]:
    """What module ``path`` (``source``) does that only the store may do, one line per breach."""
    tree = ast.parse(source, path)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        where = f"{path}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if TURN_KEY.search(node.value):
                found.append(f"{where}: names a turn key ({node.value!r})")
        elif isinstance(node, ast.JoinedStr):
            parts = [v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
            if parts and parts[0].startswith("agent:") and parts[-1].endswith(":turns"):
                found.append(f"{where}: names an agent's turn list")
        elif isinstance(node, ast.ImportFrom) and node.module in ("worker.turn.keys", "worker.turn.state"):
            names = {a.name for a in node.names}
            if node.module == "worker.turn.keys" and names - READER_NAMES:
                found.append(f"{where}: imports {sorted(names - READER_NAMES)} from the key scheme")
            if node.module == "worker.turn.state" and "key" in names:
                found.append(f"{where}: imports the key scheme")
        elif isinstance(node, ast.Import) and any(a.name == "worker.turn.keys" for a in node.names):
            found.append(f"{where}: imports the key scheme whole")
        elif isinstance(node, ast.Attribute) and _store_reach(node):
            found.append(f"{where}: reaches the store's client (.{node.attr})")
    return found


def tree_breaches(root: Path) -> list[str]:
    """Every breach in the product's packages under ``root``."""
    out = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel not in STORE_MODULES:
                out += breaches(path.read_text(), rel)
    return out


def test_no_module_outside_the_store_names_a_turn_key():
    assert tree_breaches(ROOT) == []


def test_the_store_modules_exist():
    # A renamed store module would silently leave the rule (its breaches then count as the store's).
    assert [m for m in sorted(STORE_MODULES) if not (ROOT / m).is_file()] == []


@pytest.mark.parametrize(
    ("line", "what"),
    [
        ("x = engine.store._r.get('a')", "reaches the store's client (._r)"),
        ("x = self.rt.store.r", "reaches the store's client (.r)"),
        ("x = store.claims._r", "reaches the store's client (._r)"),
        ("K = 'turns:watch'", "names a turn key"),
        ("K = 'turns:index'", "names a turn key"),
        ("def f(t):\n    return f'turn:{{{t}}}:items'", "names a turn key"),
        ("def f(a):\n    return f'agent:{a}:turns'", "names an agent's turn list"),
        ("from worker.turn.keys import key", "from the key scheme"),
        ("import worker.turn.keys", "imports the key scheme whole"),
        ("from worker.turn.state import key", "imports the key scheme"),
    ],
)
def test_planted_breach_is_caught(tmp_path, line, what):
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "worker" / "turn" / "gate.py"
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    found = tree_breaches(tmp_path)
    assert len(found) == 1 and found[0].startswith("worker/turn/gate.py:") and what in found[0], found


def test_what_readers_may_take_exists():
    from worker.turn import keys

    assert all(hasattr(keys, name) for name in READER_NAMES)
