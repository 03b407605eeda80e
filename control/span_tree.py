"""A turn's trace as a tree, read from the JSON-lines span file a worker writes (``AGENT_OTEL_FILE``).

``turn_spans(path, traceparent)`` returns the spans of the turn's trace; ``span_tree`` renders
them (``rich.tree.Tree``): each span with its duration and the attributes that say what it did
(model and tokens, tool and outcome, status). Used by ``make run`` and ``agent-runtime trace``.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.tree import Tree

from worker.turn.telemetry import parse_traceparent


def turn_spans(path: Path, traceparent: str | None) -> list[dict[str, Any]]:
    """Spans of the turn's trace found in ``path`` (``ReadableSpan.to_json`` objects, one a line).

    Empty when the file or the turn's trace is missing; malformed lines are skipped.
    """
    ctx = parse_traceparent(traceparent)
    if ctx is None or not Path(path).exists():
        return []
    trace_id = f"0x{ctx.trace_id:032x}"
    spans = []
    for line in Path(path).read_text().splitlines():
        try:
            span = json.loads(line)
        except ValueError:
            continue
        if isinstance(span, dict) and span.get("context", {}).get("trace_id") == trace_id:
            spans.append(span)
    return spans


def _ms(span: dict[str, Any]) -> float:
    start, end = (datetime.fromisoformat(span[k].replace("Z", "+00:00")) for k in ("start_time", "end_time"))
    return (end - start).total_seconds() * 1000


def _label(span: dict[str, Any]) -> str:
    a = span.get("attributes", {})
    bits = []
    if "gen_ai.usage.input_tokens" in a:
        bits.append(f"{a['gen_ai.usage.input_tokens']} in / {a.get('gen_ai.usage.output_tokens', 0)} out tokens")
    if "agent.turn.status" in a:
        bits.append(f"status {a['agent.turn.status']}")
    if "agent.turn.step" in a and span["name"] in ("turn_step", "tool_call"):
        bits.append(f"step {a['agent.turn.step']}")
    if "agent.tool.batch" in a and span["name"].startswith("execute_tool"):
        bits.append(f"batch {a['agent.tool.batch']} ({a.get('agent.tool.mode')})")
    if a.get("agent.tool.repairs"):
        bits.append("repaired: " + ", ".join(a["agent.tool.repairs"]))
    if "agent.tool.outcome" in a:
        bits.append(a["agent.tool.outcome"])
    colour = "red" if span.get("status", {}).get("status_code") == "ERROR" else "cyan"
    extra = f" [dim]{escape('; '.join(str(b) for b in bits))}[/]" if bits else ""
    return f"[{colour}]{escape(span['name'])}[/] {_ms(span):.1f} ms{extra}"


def span_tree(spans: list[dict[str, Any]], title: str = "trace") -> Tree:
    """The spans as a tree under ``title``: children under their parent, in start order.
    A span whose parent is not among ``spans`` is shown at the top level."""
    ids = {s["context"]["span_id"] for s in spans}
    children: dict[str | None, list[dict[str, Any]]] = {}
    for s in sorted(spans, key=lambda s: s["start_time"]):
        parent = s.get("parent_id") if s.get("parent_id") in ids else None
        children.setdefault(parent, []).append(s)
    tree = Tree(escape(title))

    def add(node: Tree, span: dict[str, Any]) -> None:
        branch = node.add(_label(span))
        for child in children.get(span["context"]["span_id"], []):
            add(branch, child)

    for top in children.get(None, []):
        add(tree, top)
    return tree
