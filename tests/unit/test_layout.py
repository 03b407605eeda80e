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

ROOT = Path(__file__).resolve().parents[2]
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


@pytest.mark.slow
def test_contracts_kept_on_the_tree(tmp_path):
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.slow
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


DEFAULT_MAX_LINES = 500
"""A module of the packages stays within this many lines unless SIZE_BUDGETS names it."""

SIZE_BUDGETS: dict[str, int] = {
    # a workflow task's record and all its transitions (start, launch, cancel, retry, commit)
    "worker/records/workflow.py": 600
}
"""Modules allowed over the default, each with its own ceiling and the reason it is one concept."""

SHRUNK_BELOW = 0.8
"""A budgeted module under this share of its budget gets a lower budget (or none)."""


def _lines(path: Path) -> int:
    return path.read_text().count("\n")


def test_modules_stay_small():
    """No module over DEFAULT_MAX_LINES, or over its own budget when SIZE_BUDGETS has one."""
    over = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            limit = SIZE_BUDGETS.get(rel, DEFAULT_MAX_LINES)
            if _lines(path) > limit:
                over.append(f"{rel}: {_lines(path)} lines, limit {limit}")
    assert not over, over


@pytest.mark.parametrize("module", sorted(SIZE_BUDGETS))
def test_size_budgets_stay_honest(module):
    """A budget names a module that exists, needs the budget, and is not far below it."""
    path = ROOT / module
    assert path.is_file(), f"{module} has a size budget but no longer exists: drop its entry"
    lines, budget = _lines(path), SIZE_BUDGETS[module]
    assert lines > DEFAULT_MAX_LINES, f"{module} has {lines} lines, within the default: drop its budget"
    assert lines >= budget * SHRUNK_BELOW, f"{module} has {lines} lines, far below its budget {budget}: lower it"


def test_size_rule_catches_an_oversized_module(tmp_path, monkeypatch):
    """The size rule fails on a module over the default, and on a budgeted one over its budget."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
    (tmp_path / "worker" / "big.py").write_text("x = 1\n" * (DEFAULT_MAX_LINES + 1))
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="worker/big.py"):
        test_modules_stay_small()
    monkeypatch.setitem(SIZE_BUDGETS, "worker/big.py", DEFAULT_MAX_LINES + 10)
    test_modules_stay_small()
    monkeypatch.setitem(SIZE_BUDGETS, "worker/big.py", DEFAULT_MAX_LINES)
    with pytest.raises(AssertionError, match="worker/big.py"):
        test_modules_stay_small()


def test_the_code_cites_no_tracker_outside_the_repository():
    """ "issue 19" pointed to a tracker that is not in the repository: the code says what it meant, or
    names a document of docs/. An external project's issue cited as a source keeps its owner/name
    ("vllm-project/vllm issue 32587")."""
    import re

    found = []
    for pkg in (*PACKAGES, "bench"):
        for path in (ROOT / pkg).rglob("*.py"):
            for line_no, line in enumerate(path.read_text().splitlines(), 1):
                for m in re.finditer(r"\bissues?\s+#?\d+", line, re.I):
                    before = line[: m.start()].split()
                    if not before or "/" not in before[-1]:
                        found.append(f"{path.relative_to(ROOT)}:{line_no}: {line.strip()[:100]}")
    assert found == []


# The test tree: tests/unit (pure Python, mirroring the packages) beside tests/integration.

TEST_TIERS = ("unit", "integration")


def _misplaced_tests(tests: Path) -> list[str]:
    """Test modules of ``tests`` outside its tiers, and unit modules in a folder that mirrors no
    package (``tests/unit/<folder>/`` must be ``worker/<folder>``, or a top-level package)."""
    bad = []
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests)
        if rel.parts[0] not in TEST_TIERS:
            bad.append(f"{rel}: not under {' or '.join(f'tests/{t}/' for t in TEST_TIERS)}")
        elif rel.parts[0] == "unit" and len(rel.parts) > 2:
            folder = "/".join(rel.parts[1:-1])
            if not ((tests.parent / "worker" / folder).is_dir() or (tests.parent / folder).is_dir()):
                bad.append(f"{rel}: tests/unit/{folder}/ mirrors no package")
    return bad


def test_every_test_module_is_a_unit_or_an_integration_test():
    """A newcomer finds a module's unit tests where the module is (``worker/tooling/repair.py``:
    ``tests/unit/tooling/``) and the end-to-end tests in ``tests/integration/``; no test module
    sits at the root of ``tests/`` or in a folder of its own."""
    assert _misplaced_tests(ROOT / "tests") == []


def test_the_tree_rule_catches_a_misplaced_test(tmp_path):
    for rel in ("tests/test_root.py", "tests/unit/nowhere/test_x.py", "tests/unit/tooling/test_ok.py",
                "tests/integration/test_ok.py", "tests/support/test_helper.py"):  # fmt: skip
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    (tmp_path / "worker" / "tooling").mkdir(parents=True)
    assert _misplaced_tests(tmp_path / "tests") == [
        "support/test_helper.py: not under tests/unit/ or tests/integration/",
        "test_root.py: not under tests/unit/ or tests/integration/",
        "unit/nowhere/test_x.py: tests/unit/nowhere/ mirrors no package",
    ]
