"""The README and docs/ say what the code does, and stay navigable.

- README.md is a front door: at most 15 KB, its first code block is the two commands, and it
  links every document in docs/.
- Every relative link in README.md and docs/*.md resolves to a file, and its #anchor to a heading.
- No document cites one outside the repository.
- docs/writing-a-tool.md: its first tool runs as written.
- docs/architecture.md's checklist ("Which files a change takes"): each entry lists as many files
  as it says, and the claims that can be read from the code are checked against it.
- docs/layout.md lists every module of every package, in its package's section.
- docs/operations.md documents every setting; every AGENT_* variable a document names exists.
- docs/deployment.md names exactly compose.yaml's services and published ports.
- docs/control-plane.md names every CLI command and every turn request field.
- docs/placement.md's and docs/isolation.md's lists of what a snapshot can and cannot do name, on
  every line, the tests that check it, and those tests exist.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer
import yaml

from worker.settings import Settings
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import AbortSignal, ToolContext
from worker.turn.context import TurnContext
from worker.turn.request import TurnRequest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MAX_README_BYTES = 15 * 1024
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1\s*$", re.S | re.M)


def _markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The text without its fenced code blocks (a `#` line in a shell block is no heading)."""
    return FENCE.sub("", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*)$", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _section(text: str, heading: str) -> str:
    """The body of the section whose heading line is exactly ``heading``, up to the next heading
    of the same or a higher level."""
    level = len(heading) - len(heading.lstrip("#"))
    lines = text.splitlines()
    start = lines.index(heading)
    end = next(
        (
            i
            for i in range(start + 1, len(lines))
            if re.match(r"^#{1,%d}\s" % level, lines[i]) and not lines[i].startswith("#" * (level + 1))
        ),
        len(lines),
    )
    return "\n".join(lines[start + 1 : end])


# README


def test_readme_is_a_front_door_under_15_kb():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move detail to docs/ (limit {MAX_README_BYTES})"


def test_readme_starts_with_the_two_commands():
    first_block = re.search(r"```\w*\n(.*?)```", README.read_text(), re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["make run", "make test"]


def test_readme_links_every_document():
    linked = {target.split("#")[0] for target in LINK.findall(README.read_text())}
    missing = [f"docs/{p.name}" for p in sorted(DOCS.iterdir()) if p.is_file() and f"docs/{p.name}" not in linked]
    assert not missing, f"README.md does not link {missing}"


# every document


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in LINK.findall(_prose(path.read_text())):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, broken


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_cites_one_outside_the_repository(path):
    text = path.read_text()
    for phrase in ("DESIGN-NOTES", "../shared", "/work/shared", "CONTAINERS.md", "REAL-MODEL.md"):
        assert phrase not in text, f"{path.name} cites {phrase!r}: write the decision in docs/ instead"
    assert not re.search(r"\bthe spec\b", text, re.I), f"{path.name} cites 'the spec'"


# docs/writing-a-tool.md


def test_the_first_tool_runs_as_written(tmp_path):
    doc = (DOCS / "writing-a-tool.md").read_text()
    code = re.search(r"```python\n(.*?)```", _section(doc, "## A first tool"), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/writing-a-tool.md", "exec"), namespace)
    (tmp_path / "a.txt").write_text("one two three")
    tools = namespace["create_word_tools"](TurnContext(turn_id="t", agent_id="a", home=tmp_path, settings=Settings()))
    tool = tools[0]
    outcome = validate_tool_arguments(tool, '{"path": "a.txt"}')
    result = tool.execute(outcome.params, ToolContext(turn_id="t", call_id="c", home=tmp_path, abort=AbortSignal()))
    assert result.content == {"path": "a.txt", "words": 3}
    assert tool.completed_activity(outcome.params, result) == "Counted 3 words in a.txt"


def test_the_category_checklist_names_the_files_a_category_takes():
    """The checklist's files are where today's code adds a category (the creators are called in
    ``assembly.text_turn_tools``, and the ``text`` toolset resolves to it), as many as it says,
    and as many as docs/architecture.md says."""
    doc = _section((DOCS / "writing-a-tool.md").read_text(), "## Adding a category: the checklist")
    assembly = (ROOT / "worker/tools/assembly.py").read_text()
    assert "def text_turn_tools(ctx: TurnContext)" in assembly and "def workflow_task_tools" in assembly
    assert "assembly.text_turn_tools" in (ROOT / "worker/tools/toolsets.py").read_text()
    assert "TEXT_TURN_CATEGORIES" in assembly
    listed = re.findall(r"^\d+\. \*\*`([^`]+)`\*\*", doc, re.M)
    assert listed == [
        "worker/tools/<category>.py",
        "worker/tools/assembly.py",
        "tests/integration/test_tools_<category>.py",
    ]
    said = re.search(r"\b(\w+) files, and no other file of the project changes", doc)
    assert said and NUMBERS[said.group(1).lower()] == len(listed), said
    assert _checklist()["A new tool category"].files == listed
    assert "TEXT_TURN_CATEGORIES" in doc and "workflow_task_tools" in doc


# docs/architecture.md, "Which files a change takes"

NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}
PATH = re.compile(r"`([\w.<>-]+(?:/[\w.<>-]+)+\.\w+)`")


class Entry:
    """One entry of the checklist: its title, the files listed before its count, and the count."""

    def __init__(self, title: str, text: str):
        self.title, self.text = title, text
        said = re.search(r":\s+(\w+)\s+files?\b", text)
        assert said and said.group(1).lower() in NUMBERS, f"{title!r} does not say how many files it takes"
        self.count = NUMBERS[said.group(1).lower()]
        self.files = list(dict.fromkeys(PATH.findall(text[: said.start()])))


def _checklist() -> dict[str, Entry]:
    body = _section((DOCS / "architecture.md").read_text(), "## Which files a change takes")
    out = {}
    for para in re.split(r"\n\s*\n", body):
        m = re.match(r"\*\*([^*]+)\*\*", para.strip())
        if m:
            out[m.group(1).strip()] = Entry(m.group(1).strip(), " ".join(para.split()))
    return out


def test_each_checklist_entry_lists_as_many_files_as_it_says():
    entries = _checklist()
    titles = {"A new tool category", "A change to one approval rule", "A new approval mode", "A new HTTP route"}
    assert titles | {"A new wire style"} <= set(entries)
    for entry in entries.values():
        assert len(entry.files) == entry.count, (entry.title, entry.files, entry.count)
        for f in entry.files:  # a file that exists, or (a placeholder) one in a folder that does
            target = ROOT / f
            assert target.is_file() if "<" not in f else target.parent.is_dir(), (entry.title, f)


def test_the_approval_rule_entry_names_the_rules_functions():
    import worker.turn.approval_policy as policy

    entry = _checklist()["A change to one approval rule"]
    for name in re.findall(r"`(\w+)`", entry.text):
        if name.startswith(("call_", "approval_")):
            assert callable(getattr(policy, name, None)), name


def _names_every(text: str, words: tuple[str, ...]) -> bool:
    return all(re.search(rf"[\"`']{w}[\"`']", text) for w in words)


def test_a_new_approval_mode_takes_the_files_the_entry_lists():
    """The modes are named in the entry's files only (the product and its docs), and each of those
    lists exactly ``ApprovalMode``'s modes."""
    import json
    import typing

    from worker.settings import ApprovalMode

    modes = typing.get_args(ApprovalMode)
    entry = _checklist()["A new approval mode"]
    naming = set()
    for top in ("worker", "tasks", "control", "devtools", "bench", "docs"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".py", ".md", ".json") and _names_every(path.read_text(), modes):
                naming.add(path.relative_to(ROOT).as_posix())
    if _names_every(README.read_text(), modes):
        naming.add("README.md")
    assert naming <= set(entry.files), naming - set(entry.files)
    schema = json.loads((DOCS / "turn-request.schema.json").read_text())
    enums = [n.get("enum") for n in _walk_json(schema) if isinstance(n, dict) and "enum" in n]
    assert list(modes) in enums
    row = next(line for line in (DOCS / "control-plane.md").read_text().splitlines() if line.startswith("| `approval`"))
    assert tuple(re.findall(r"`(\w+)`", row.split("`mode`", 1)[1].split(")", 1)[0])) == modes


def _walk_json(node):
    yield node
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        yield from _walk_json(child)


def test_a_new_http_route_takes_the_files_the_entry_lists():
    """Every ``/v1`` route is defined in the entry's routes module and has its row in the route
    table of docs/control-plane.md, and every row is a route (the auth test enumerates the app's
    routes itself: ``tests/integration/test_api.py``)."""
    from tests.support.api_server import declared_routes

    entry = _checklist()["A new HTTP route"]
    assert entry.files[0] == "control/api/routes.py" and "docs/control-plane.md" in entry.files
    v1 = [r for r in declared_routes() if r.path.startswith("/v1/")]
    assert v1 and {r.module for r in v1} == {"control.api.routes"}

    def shape(path: str) -> str:
        return re.sub(r"\{[^}]+\}", "{}", path)

    table = _section((DOCS / "control-plane.md").read_text(), "## The HTTP API")
    rows = {(m, shape(p)) for m, p in re.findall(r"^\| `(GET|POST|PUT|PATCH|DELETE) (/v1/[^` ]+)`", table, re.M)}
    assert rows == {(r.method, shape(r.path)) for r in v1}


def test_a_new_wire_style_takes_the_files_the_entry_lists():
    """The styles are the entries of ``WIRE_STYLES`` (the entry's table), the setting is read by
    ``worker/model/clients.py`` only (no other module chooses a wire by the style's name; the
    settings declare it, a worker's start checks it), and the ``OPENAI_API_STYLE`` row of
    docs/operations.md names exactly the table's styles."""
    from worker.model.wire_styles import WIRE_STYLES

    entry = _checklist()["A new wire style"]
    assert entry.files[:2] == ["worker/model/<style>.py", "worker/model/wire_styles.py"], entry.files
    assert {"devtools/scripted_gateway.py", "docs/operations.md"} <= set(entry.files)
    reading = set()
    for top in ("worker", "tasks", "control", "devtools", "bench"):
        for path in (ROOT / top).rglob("*.py"):
            if re.search(r"\.openai_api_style\b", path.read_text()):
                reading.add(path.relative_to(ROOT).as_posix())
    assert reading == {"worker/model/clients.py", "tasks/app.py"}, reading
    row = next(
        line for line in (DOCS / "operations.md").read_text().splitlines() if line.startswith("| `OPENAI_API_STYLE`")
    )
    assert re.findall(r"`(\w+)` \(`POST /", row) == list(WIRE_STYLES), row


# docs/layout.md


def _package_dirs() -> list[Path]:
    dirs = set()
    for top in ("worker", "tasks", "control", "devtools", "bench"):
        for module in (ROOT / top).rglob("*.py"):
            if "__pycache__" not in module.parts:
                dirs.add(module.parent)
    return sorted(dirs)


def _category_modules() -> set[str]:
    """File names of the top-level ``worker/tools`` modules whose creators are text-turn categories."""
    from worker.tools.assembly import TEXT_TURN_CATEGORIES

    names = {create.__module__ for create in TEXT_TURN_CATEGORIES}
    return {n.rsplit(".", 1)[1] + ".py" for n in names if n.count(".") == 2 and n.startswith("worker.tools.")}


@pytest.mark.parametrize("package", _package_dirs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_layout_lists_every_module(package):
    layout = (DOCS / "layout.md").read_text()
    rel = package.relative_to(ROOT).as_posix()
    heading = f"## `{rel}/`"
    assert heading in layout.splitlines(), f"docs/layout.md has no section {heading!r}"
    section = _section(layout, heading)
    modules = sorted(p.name for p in package.glob("*.py") if p.name != "__init__.py")
    # A text-turn category module is covered by the section's note on TEXT_TURN_CATEGORIES: adding a
    # category takes no layout row (docs/writing-a-tool.md, "Adding a category").
    categories = _category_modules() if rel == "worker/tools" else set()
    missing = [m for m in modules if f"| `{m}` |" not in section and m not in categories]
    assert not missing, f"docs/layout.md, section {heading}: add a row for {missing}"
    listed = re.findall(r"^\| `([\w]+\.py)` \|", section, re.M)
    gone = [m for m in listed if m not in modules]
    assert not gone, f"docs/layout.md, section {heading}: {gone} no longer exist"


# settings


def _env_names() -> set[str]:
    names = set()
    for name, field in Settings.model_fields.items():
        alias = field.validation_alias
        if isinstance(alias, str):
            names.add(alias)
        elif alias is not None:
            names.add(str(alias.choices[0]))
        else:
            names.add(f"AGENT_{name.upper()}")
    return names


def test_every_setting_is_documented():
    config = _section((DOCS / "operations.md").read_text(), "## Configuration")
    missing = sorted(n for n in _env_names() if f"`{n}`" not in config)
    assert not missing, f"docs/operations.md, Configuration: document {missing}"


def test_every_agent_variable_a_document_names_exists():
    code = "\n".join(
        p.read_text()
        for top in ("worker", "tasks", "control", "devtools", "bench")
        for p in (ROOT / top).rglob("*.py")
        if "__pycache__" not in p.parts
    )
    code += (ROOT / "Makefile").read_text() + (ROOT / "compose.yaml").read_text() + (ROOT / "Dockerfile").read_text()
    code += (ROOT / "deploy" / "tools-node").read_text()  # the tools container's entry
    known = _env_names()
    unknown = set()
    for path in _markdown_files():
        for name in set(re.findall(r"\bAGENT_[A-Z0-9_]*[A-Z0-9]\b", path.read_text())):
            if name not in known and name not in code:
                unknown.add(f"{path.name}: {name}")
    assert not unknown, sorted(unknown)


# docs/deployment.md


def test_deployment_names_the_compose_services_and_published_ports():
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    doc = (DOCS / "deployment.md").read_text()
    documented = set(re.findall(r"^\| `([\w-]+)` \|", _section(doc, "## Compose"), re.M))
    assert documented == set(compose), "docs/deployment.md's service table differs from compose.yaml"
    # a port given by a variable with a default (`${REDIS_HOST_PORT:-6380}`) is documented by its default
    published = {
        re.sub(r"\$\{\w+:-(\d+)\}", r"\1", p.rsplit(":", 1)[0]) for s in compose.values() for p in s.get("ports", [])
    }
    documented_ports = set(re.findall(r"^\| `(127\.0\.0\.1:\d+)` \|", _section(doc, "## What is published"), re.M))
    assert documented_ports == published, "docs/deployment.md's published ports differ from compose.yaml"
    nets = {n for s in compose.values() for n in s.get("networks", [])}
    documented_nets = set(re.findall(r"^\| `([\w-]+)` \|", _section(doc, "## Networks"), re.M))
    assert documented_nets == nets


# docs/control-plane.md


def test_control_plane_names_every_cli_command():
    from control.cli import app
    from control.workflow_cli import app as workflow_app

    doc = (DOCS / "control-plane.md").read_text()
    commands = typer.main.get_command(app).commands
    missing = [c for c in commands if f"agent-runtime {c}" not in doc]
    assert not missing, f"docs/control-plane.md does not show agent-runtime {missing}"
    subcommands = list(typer.main.get_command(workflow_app).commands)
    assert {"start", "show", "list", "wait", "retry", "cancel", "brain-add"} <= set(subcommands)
    missing = [c for c in subcommands if f"control.workflow_cli {c}" not in doc]
    assert not missing, f"docs/control-plane.md does not show workflow_cli {missing}"


def test_control_plane_lists_every_turn_request_field():
    section = _section((DOCS / "control-plane.md").read_text(), "## The turn request")
    documented = set(re.findall(r"^\| `(\w+)` \|", section, re.M))
    assert documented == set(TurnRequest.model_fields)


SNAPSHOT_CLAIMS = (
    (DOCS / "placement.md", "### What a snapshot can and cannot do"),
    (DOCS / "isolation.md", "## Snapshots"),
)


def _test_functions(module: str) -> set[str]:
    import ast

    (path,) = (ROOT / "tests").rglob(module)  # a test module's name is unique in the tree
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}


@pytest.mark.parametrize("doc,heading", SNAPSHOT_CLAIMS, ids=lambda x: getattr(x, "name", x))
def test_every_snapshot_claim_names_a_test_that_exists(doc, heading):
    claims: list[str] = []
    for line in _section(doc.read_text(), heading).splitlines():
        if line.startswith("- "):
            claims.append(line)
        elif line.startswith("  ") and claims:
            claims[-1] += "\n" + line
    assert len(claims) >= 5, claims
    for claim in claims:
        named = re.findall(r"`(test_\w+\.py)::(test_\w+)`", claim)
        assert named, f"{doc.name}: this claim names no test: {claim[:200]!r}"
        for module, function in named:
            assert function in _test_functions(module), f"{doc.name}: {module}::{function} does not exist"


def test_architecture_lists_every_event_kind_a_reader_may_ask_for():
    """The kinds ``GET /v1/turns/{id}/events?kinds=`` accepts (``worker.turn.events.EVENT_KINDS``)
    are the ones docs/architecture.md's "Events" lists, and every typed event record's kind is one."""
    from worker.turn import events

    section = _section((DOCS / "architecture.md").read_text(), "## Events")
    listed = set(re.findall(r"`([a-z]+(?:_[a-z]+)+)`", section.split("The main ones", 1)[0]))
    assert listed == set(events.EVENT_KINDS)
    typed = {cls.KIND for cls in vars(events).values() if isinstance(cls, type) and getattr(cls, "KIND", "")}
    assert typed and typed <= events.EVENT_KINDS, typed - events.EVENT_KINDS
