"""``Any`` in type annotations only goes down: each package has a budget, its count after the last
clean-up, and this test fails when a package's count goes above it.

An ``Any`` where the code knows the type turns ``mypy --strict`` off for that value. What is counted
(an AST walk, not a text search: docstrings, comments, imports and runtime expressions are not):
the annotations of parameters and returns, of variables and class attributes (TypedDict and
dataclass fields), a class's bases (``dict[str, Any]``), a type alias's value (``X: TypeAlias =
...``, ``type X = ...``, and a module- or class-level ``X = dict[str, Any]``), a ``TypeVar``'s
arguments and the type given to ``cast``. A string annotation is parsed and counted the same way. A
``dict[str, Any]`` behind an alias counts once, where the alias is written.

When it fails: give the value its real type (the class it always is, a Protocol, a TypedDict, a
callable's signature, ``object`` for a value only checked or passed on). What stays ``Any``: JSON
values from the wire and JSON Schema nodes, and what untyped libraries hand back. The message names
the package, its count and budget, and where the new ones are: the files whose count went above the
one recorded in ``FILE_COUNTS`` (a new file counts from zero), each ``Any`` with its line and
annotation. After removing some, lower the budget: ``python -m tests.unit.test_any_budget`` prints
the counts in the form of ``BUDGETS`` and ``FILE_COUNTS``.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOP_PACKAGES = ("worker", "tasks", "control", "devtools")
PACKAGES = (
    "worker/turn",
    "worker/model",
    "worker/tooling",
    "worker/records",
    "worker/placement",
    "worker/tools",
    "worker",
    "tasks",
    "control/api",
    "control",
    "devtools",
)
"""A module belongs to the longest of these that holds it (``worker`` is its top-level modules)."""

_TYPE_FACTORIES = {"TypeVar", "NewType", "ParamSpec", "TypeVarTuple"}


@dataclass(frozen=True)
class AnyUse:
    """One ``Any`` in an annotation: its file (relative to the repository), line, what it annotates
    (``parameter``, ``return``, ``variable``, ``attribute``, ``alias``, ``base``, ``typevar``,
    ``cast``) and
    the annotation's source."""

    path: str
    line: int
    kind: str
    annotation: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind} {self.annotation}"


def _is_any(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")


def _anys(node: ast.AST | None) -> int:
    """How many ``Any`` the type expression ``node`` holds (a string annotation parsed first)."""
    if node is None:
        return 0
    count = 0
    for sub in ast.walk(node):
        if _is_any(sub):
            count += 1
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            try:
                count += _anys(ast.parse(sub.value, mode="eval").body)
            except SyntaxError:
                pass  # a Literal["..."] value, not a type
    return count


def _looks_like_type(node: ast.expr) -> bool:
    """A plain assignment's value that is a type expression: ``dict[str, Any]``, ``A | B``, ``Any``."""
    return isinstance(node, ast.Subscript | ast.BinOp) or _is_any(node)


def _call_name(node: ast.Call) -> str:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _typed_nodes(tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Every (kind, type expression) of the module that may hold an ``Any``."""
    scopes: dict[ast.AST, str] = {tree: "module"}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                scopes[child] = "class"
                for base in child.bases:
                    yield "base", base
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    yield "parameter", arg.annotation
            if node.returns is not None:
                yield "return", node.returns
        elif isinstance(node, ast.Call):
            name = _call_name(node)
            if name == "cast" and node.args:
                yield "cast", node.args[0]
            elif name in _TYPE_FACTORIES:
                yield "typevar", node
    seen: set[ast.AST] = set()
    for scope, where in scopes.items():
        for stmt in scope.body:  # type: ignore[attr-defined]
            yield from _declared(stmt, where, seen)
    for node in ast.walk(tree):  # a function's local variables
        if isinstance(node, ast.AnnAssign) and node not in seen:
            yield "variable", node.annotation


def _declared(stmt: ast.stmt, where: str, seen: set[ast.AST]) -> Iterator[tuple[str, ast.AST]]:
    """A module- or class-level statement's annotation or alias value (``seen`` gets the
    annotated assignments, so they are not counted again as a function's variables)."""
    kind = "attribute" if where == "class" else "variable"
    if isinstance(stmt, ast.AnnAssign):
        seen.add(stmt)
        ann = stmt.annotation
        if (isinstance(ann, ast.Name) and ann.id == "TypeAlias") or (
            isinstance(ann, ast.Attribute) and ann.attr == "TypeAlias"
        ):
            if stmt.value is not None:
                yield "alias", stmt.value
        else:
            yield kind, ann
    elif isinstance(stmt, ast.Assign) and _looks_like_type(stmt.value):
        yield "alias", stmt.value
    elif sys.version_info >= (3, 12) and isinstance(stmt, ast.TypeAlias):
        yield "alias", stmt.value
    elif isinstance(stmt, ast.If | ast.Try):  # `if TYPE_CHECKING:` and friends
        for sub in [*stmt.body, *stmt.orelse]:
            yield from _declared(sub, where, seen)


def uses_in_source(source: str, path: str) -> list[AnyUse]:
    """Every ``Any`` in the annotations of one module's source, in line order."""
    tree = ast.parse(source, filename=path)
    uses: list[AnyUse] = []
    for kind, node in _typed_nodes(tree):
        text = ast.unparse(node)
        line = getattr(node, "lineno", 0)
        uses.extend(AnyUse(path, line, kind, text) for _ in range(_anys(node)))
    return sorted(uses, key=lambda u: (u.line, u.kind))


def package_of(path: str) -> str:
    """The entry of ``PACKAGES`` that holds ``path`` (a path relative to the repository)."""
    return max((p for p in PACKAGES if path.startswith(p + "/")), key=len)


def scan(root: Path = ROOT) -> list[AnyUse]:
    """Every ``Any`` in the annotations of the four packages under ``root``."""
    uses: list[AnyUse] = []
    for top in TOP_PACKAGES:
        for file in sorted((root / top).rglob("*.py")):
            rel = file.relative_to(root).as_posix()
            uses.extend(uses_in_source(file.read_text(), rel))
    return uses


BUDGETS: dict[str, int] = {
    "worker/turn": 182,
    "worker/model": 106,
    "worker/tooling": 392,
    "worker/records": 74,
    "worker/placement": 18,
    "worker/tools": 34,
    "worker": 11,
    "tasks": 141,
    "control/api": 68,
    "control": 44,
    "devtools": 116,
}
"""The most ``Any`` each package may hold: its count after the last clean-up (lower it, never raise it)."""

FILE_COUNTS: dict[str, int] = {
    "control/api/app.py": 2,
    "control/api/errors.py": 5,
    "control/api/feed.py": 2,
    "control/api/hub.py": 6,
    "control/api/json_response.py": 1,
    "control/api/limits.py": 8,
    "control/api/metrics.py": 8,
    "control/api/page.py": 2,
    "control/api/routes.py": 10,
    "control/api/sse.py": 2,
    "control/api/streams.py": 1,
    "control/api/tokens.py": 7,
    "control/api/turn_views.py": 14,
    "control/cli.py": 2,
    "control/client.py": 17,
    "control/span_tree.py": 6,
    "control/transcript.py": 16,
    "control/workflow.py": 2,
    "control/workflow_cli.py": 1,
    "devtools/approval_demo.py": 1,
    "devtools/async_endpoint.py": 1,
    "devtools/background_responses.py": 19,
    "devtools/chat_wire.py": 18,
    "devtools/dashboard.py": 1,
    "devtools/deploy_check.py": 3,
    "devtools/deploy_failover.py": 1,
    "devtools/deploy_stack.py": 1,
    "devtools/deploy_turns.py": 2,
    "devtools/embedded_sentinel.py": 2,
    "devtools/hosted_endpoint.py": 6,
    "devtools/hosts_check.py": 1,
    "devtools/hosts_operator.py": 4,
    "devtools/jobs_demo.py": 6,
    "devtools/machines.py": 2,
    "devtools/object_store.py": 1,
    "devtools/podman.py": 1,
    "devtools/scripted_gateway.py": 42,
    "devtools/sse_script.py": 4,
    "tasks/app.py": 2,
    "tasks/beat.py": 8,
    "tasks/broker.py": 19,
    "tasks/dispatcher.py": 23,
    "tasks/hooks.py": 5,
    "tasks/liveness.py": 4,
    "tasks/metrics.py": 6,
    "tasks/model_calls.py": 2,
    "tasks/node.py": 1,
    "tasks/placement.py": 5,
    "tasks/queue_metrics.py": 6,
    "tasks/reconnect.py": 3,
    "tasks/recorded_publish.py": 8,
    "tasks/schedule_entries.py": 3,
    "tasks/scheduler.py": 4,
    "tasks/serialization.py": 6,
    "tasks/message_template.py": 12,
    "tasks/telemetry.py": 16,
    "tasks/turns.py": 7,
    "tasks/watchdog.py": 1,
    "worker/model/background.py": 2,
    "worker/model/call_loop.py": 3,
    "worker/model/chat.py": 34,
    "worker/model/input_items.py": 8,
    "worker/model/interface.py": 9,
    "worker/model/items.py": 20,
    "worker/model/responses.py": 4,
    "worker/model/streaming.py": 13,
    "worker/model/text_calls.py": 11,
    "worker/model/wire_format.py": 2,
    "worker/placement/entries.py": 2,
    "worker/placement/home_writer.py": 4,
    "worker/placement/homes.py": 2,
    "worker/placement/records.py": 2,
    "worker/placement/restorer.py": 3,
    "worker/placement/signing.py": 2,
    "worker/placement/snapshots.py": 3,
    "worker/records/agent_records.py": 8,
    "worker/records/brain.py": 2,
    "worker/records/jobs.py": 9,
    "worker/records/result_schema.py": 26,
    "worker/records/schedules.py": 11,
    "worker/records/workflow.py": 18,
    "worker/redis_connection.py": 11,
    "worker/tooling/arguments.py": 24,
    "worker/tooling/coercion.py": 18,
    "worker/tooling/contract.py": 19,
    "worker/tooling/function_tools.py": 10,
    "worker/tooling/gemini_objects.py": 7,
    "worker/tooling/json_checks.py": 9,
    "worker/tooling/json_repair_rung.py": 5,
    "worker/tooling/keys.py": 21,
    "worker/tooling/markup.py": 4,
    "worker/tooling/model_flags.py": 4,
    "worker/tooling/object_rungs.py": 42,
    "worker/tooling/outcome.py": 8,
    "worker/tooling/oversized.py": 9,
    "worker/tooling/param_validation.py": 10,
    "worker/tooling/repair.py": 8,
    "worker/tooling/schemas.py": 32,
    "worker/tooling/stream_rungs.py": 1,
    "worker/tooling/strict.py": 36,
    "worker/tooling/strict_limits.py": 11,
    "worker/tooling/strict_nulls.py": 17,
    "worker/tooling/text_rungs.py": 2,
    "worker/tooling/tool_search.py": 10,
    "worker/tooling/validators.py": 6,
    "worker/tooling/wire.py": 31,
    "worker/tooling/wire_profiles.py": 48,
    "worker/tools/assembly.py": 5,
    "worker/tools/background_jobs.py": 4,
    "worker/tools/brain.py": 2,
    "worker/tools/computer/catalog.py": 1,
    "worker/tools/computer/seccomp.py": 1,
    "worker/tools/schedule.py": 4,
    "worker/tools/skills.py": 1,
    "worker/tools/submit_result.py": 4,
    "worker/tools/todo.py": 1,
    "worker/tools/web/address_guard.py": 4,
    "worker/tools/web/catalog.py": 2,
    "worker/tools/web/common.py": 1,
    "worker/tools/workflow.py": 4,
    "worker/turn/approval_policy.py": 6,
    "worker/turn/approvals.py": 16,
    "worker/turn/async_calls.py": 4,
    "worker/turn/async_reads.py": 2,
    "worker/turn/barrier.py": 2,
    "worker/turn/call_runner.py": 6,
    "worker/turn/claims.py": 3,
    "worker/turn/completion.py": 1,
    "worker/turn/context.py": 2,
    "worker/turn/dispatch.py": 5,
    "worker/turn/durability.py": 12,
    "worker/turn/engine.py": 2,
    "worker/turn/events.py": 3,
    "worker/turn/gate.py": 3,
    "worker/turn/guard.py": 14,
    "worker/turn/intake.py": 4,
    "worker/turn/interfaces.py": 1,
    "worker/turn/listing.py": 7,
    "worker/turn/liveness.py": 2,
    "worker/turn/memo.py": 8,
    "worker/turn/metrics.py": 2,
    "worker/turn/model_step.py": 3,
    "worker/turn/moves.py": 15,
    "worker/turn/outage.py": 7,
    "worker/turn/planning.py": 4,
    "worker/turn/prepared.py": 5,
    "worker/turn/replies.py": 8,
    "worker/turn/request.py": 4,
    "worker/turn/state.py": 10,
    "worker/turn/store.py": 13,
    "worker/turn/telemetry.py": 3,
    "worker/turn/toolbox.py": 1,
    "worker/turn/usage.py": 4,
}
"""Each module's count when the budgets were set: only to say where new ones are."""


def over_budget(
    uses: list[AnyUse], budgets: dict[str, int] = BUDGETS, recorded: dict[str, int] = FILE_COUNTS
) -> list[str]:
    """One message per package whose count is above its budget, naming the files that gained some
    (their count above ``recorded``) and every ``Any`` in them."""
    by_package: dict[str, list[AnyUse]] = {}
    for use in uses:
        by_package.setdefault(package_of(use.path), []).append(use)
    messages = []
    for package, found in sorted(by_package.items()):
        budget = budgets.get(package, 0)
        if len(found) <= budget:
            continue
        per_file = Counter(u.path for u in found)
        grown = sorted(path for path, n in per_file.items() if n > recorded.get(path, 0))
        lines = [f"{package}: {len(found)} Any in annotations, budget {budget} (+{len(found) - budget})."]
        for path in grown:
            lines.append(f"  {path}: {per_file[path]}, was {recorded.get(path, 0)}:")
            lines.extend(f"    {u}" for u in found if u.path == path)
        if not grown:
            lines.append(
                "  no file grew past its recorded count: " + ", ".join(f"{p} {n}" for p, n in per_file.most_common(5))
            )
        lines.append("  Give them their real type (this module's docstring says how).")
        messages.append("\n".join(lines))
    return messages


def test_no_package_holds_more_any_than_its_budget():
    messages = over_budget(scan())
    assert not messages, "\n\n".join(messages)


def test_every_package_has_a_budget():
    assert set(BUDGETS) == set(PACKAGES)


SAMPLE = '''
"""Any in a docstring is not counted."""
from typing import Any, TypeAlias, TypeVar, cast  # nor in an import

Json: TypeAlias = dict[str, Any]
Plain = list[Any]
T = TypeVar("T", bound=Any)
LIMIT: int = 3


class Record(dict[str, Any]):
    field: Any
    other: "list[Any]"


def f(a: Any, *rest: int, key: Any = None, **kw: str) -> dict[str, Any]:
    local: Any = cast(Any, a)
    names = [Any]  # a runtime expression, not an annotation
    return {}
'''


def test_the_counter_counts_annotations_only():
    kinds = Counter(u.kind for u in uses_in_source(SAMPLE, "worker/sample.py"))
    assert kinds == {
        "alias": 2,
        "typevar": 1,
        "base": 1,
        "attribute": 2,
        "parameter": 2,
        "return": 1,
        "variable": 1,
        "cast": 1,
    }


def test_a_new_any_fails_and_the_message_says_where():
    kept = uses_in_source("def f(x: Any) -> int: ...\n", "worker/tooling/kept.py")
    planted = uses_in_source("def g(x: Any) -> Any: ...\n", "worker/tooling/planted.py")
    budgets, recorded = {"worker/tooling": 1}, {"worker/tooling/kept.py": 1}
    assert over_budget(kept, budgets, recorded) == []
    messages = over_budget(kept + planted, budgets, recorded)
    assert len(messages) == 1, messages
    assert messages[0].startswith("worker/tooling: 3 Any in annotations, budget 1 (+2)")
    assert "worker/tooling/planted.py: 2, was 0:" in messages[0] and "kept.py" not in messages[0]
    assert "worker/tooling/planted.py:1: parameter Any" in messages[0]
    assert "worker/tooling/planted.py:1: return Any" in messages[0]


if __name__ == "__main__":
    found = scan()
    by_package = Counter(package_of(u.path) for u in found)
    by_top = Counter(u.path.split("/")[0] for u in found)
    by_kind = Counter((u.path.split("/")[0], u.kind) for u in found)
    print("by top-level package:", dict(by_top), "total", len(found))
    print("by kind:", dict(sorted(by_kind.items())))
    print("BUDGETS = {")
    for p in PACKAGES:
        print(f'    "{p}": {by_package[p]},')
    print("}")
    print("FILE_COUNTS = {")
    for path, n in sorted(Counter(u.path for u in found).items()):
        print(f'    "{path}": {n},')
    print("}")
