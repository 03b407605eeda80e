"""The layout's rules hold, and `make lint`'s import contracts catch each kind of breach.

Each breach is planted in a copy of the packages (never in the tree itself) and
``lint-imports`` must fail on it, naming the broken contract.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("worker", "tasks", "control", "devtools")
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def _copy(tmp_path: Path) -> Path:
    for pkg in PACKAGES:
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(tree: Path) -> subprocess.CompletedProcess:
    assert LINT_IMPORTS.exists(), f"{LINT_IMPORTS} is missing: import-linter comes with the project's test extras"
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_contracts_kept_on_the_tree(tmp_path):
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("worker/settings.py", "import celery", "worker never imports Celery"),
        ("worker/turn/request.py", "import kombu", "worker never imports Celery"),
        ("worker/tools/todo.py", "import tasks.app", "worker never imports Celery"),
        ("worker/tooling/errors.py", "from worker.turn import engine", "is not allowed to import worker.turn"),
        ("tasks/app.py", "import control.client", "tasks is not allowed to import control"),
        ("worker/turn/state.py", "from worker.turn import store", "No cycles are allowed in worker.turn"),
    ],
)
def test_planted_breach_fails(tmp_path, module, line, contract):
    tree = _copy(tmp_path)
    target = tree / module
    target.write_text(target.read_text() + f"\n{line}  # planted by the test\n")
    result = _lint(tree)
    assert result.returncode != 0, result.stdout
    assert contract in result.stdout, result.stdout


def test_modules_stay_small():
    """No module over about 500 lines unless its docstring says why it is one concept."""
    over = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            if text.count("\n") > 520 and "Size: one concept" not in text:
                over.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert not over, over
