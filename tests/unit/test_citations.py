"""No file of the repository cites a document that is not in it.

Code and docs cite the project's own files (``docs/``, modules, tests); a design decision
the code relies on is written in ``docs/`` or stated where it applies. A reference to
notes or a specification kept outside the repository fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "var", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "node_modules"}
TEXT_SUFFIXES = {".py", ".md", ".txt", ".toml", ".yaml", ".yml", ".json", ".cfg", ".ini", ".sh", ".html", ".js", ""}

# Built from parts so that this file does not cite them itself.
OUTSIDE = re.compile(
    "|".join(
        [
            "DESIGN" + r"-NOTES",
            r"\.\./" + "shared",
            "/work/" + "shared",
            "shared/" + "spec",
            "tools-runtime" + r"\.txt",
            "CONTAINERS" + r"\.md",
            "REAL-MODEL" + r"\.md",
            # "the spec" as a source: (spec, "...") / (spec: ...) / Spec, "..." / the spec's ...
            r"(?i:\bthe " + r"spec\b)",
            r"(?i:\b" + r"spec's\b)",
            r"(?i:\b" + r'spec, ")',
            r"\(" + r'spec:\s*("|$)',
        ]
    )
)

# The checks themselves: they name what they look for.
CHECKERS = {"tests/unit/test_citations.py", "tests/unit/test_docs.py"}


def _files() -> list[Path]:
    out = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        if rel.as_posix() in CHECKERS:
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in ("Makefile", "Dockerfile"):
            out.append(path)
    return out


def citations(text: str) -> list[str]:
    """The lines of ``text`` that cite a document outside the repository."""
    return [line.strip() for line in text.splitlines() if OUTSIDE.search(line)]


def test_no_citation_of_documents_outside_the_repository():
    found = []
    for path in _files():
        rel = path.relative_to(ROOT).as_posix()
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{rel}: {line[:120]}" for line in citations(text)]
    assert not found, "\n".join(found)


def test_the_rule_sees_each_form_of_citation():
    cited = [
        "(see DESIGN" + "-NOTES section 3)",
        "copied from `../" + "shared/`",
        "spec, as in (" + 'spec, "Workflow task tools")',
        "Fields mirror the " + "spec's contract table.",
        "Spec" + ', "How the tool set is assembled per turn": ...',
        "validates it again (" + 'spec: "the control plane ...")',
        "the persisted schema (" + "spec:",
    ]
    assert all(citations(line) for line in cited), [line for line in cited if not citations(line)]
    own = [
        "see docs/arguments.md",
        "the OpenAPI spec of the service",
        "spec = importlib.util.find_spec(name)",
        "def _import(spec: str) -> Toolset:",
    ]
    assert not any(citations(line) for line in own)
