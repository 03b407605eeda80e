"""The Grafana dashboard of the runtime, generated with ``grafanalib`` (PyPI) from ``PANELS``, never
written by hand: ``python -m devtools.dashboard`` (``make dashboard``) writes
``deploy/grafana/agent-runtime.json``; ``tests/unit/devtools/test_dashboard.py`` checks that the
committed file is what this module generates and ``tests/integration/test_dashboard.py``, against
a real Prometheus scraping a real stack, that every panel's queries return data (docs/operations.md, "Dashboard").

Queries read the series of ``worker/turn/metrics.py``, ``tasks/queue_metrics.py``,
``tasks/metrics.py`` and ``control/api/metrics.py``. Gauges read from Redis are served by every
worker alike: they are aggregated with ``max``; counters and histograms with ``sum``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import Dashboard, GridPos, Target, Time, TimeSeries

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "deploy" / "grafana" / "agent-runtime.json"
DATASOURCE = "${DS_PROMETHEUS}"
RATE = "$__rate_interval"
"""Grafana's rate window; a direct Prometheus query replaces it (``queries(window)``)."""


@dataclass(frozen=True)
class Panel:
    """One panel: its title, unit (Grafana's), and queries as ``(legend, PromQL)``."""

    title: str
    unit: str
    queries: tuple[tuple[str, str], ...]
    description: str = ""


def _p95(metric: str, by: str) -> str:
    return f"histogram_quantile(0.95, sum by (le, {by}) (rate({metric}_bucket[{RATE}])))"


PANELS: tuple[Panel, ...] = (
    Panel("Turns started", "ops", (("{{queue}}", f"sum by (queue) (rate(agent_turns_started_total[{RATE}]))"),)),
    Panel(
        "Turns ended, by status",
        "ops",
        (("{{status}}", f"sum by (status) (rate(agent_turns_ended_total[{RATE}]))"),),
        "Every terminal transition once, wherever it happened (a parked turn cancelled included).",
    ),
    Panel(
        "Turns ended without completing, by reason",
        "ops",
        (
            (
                "{{status}} {{reason}}",
                f'sum by (status, reason) (rate(agent_turns_ended_total{{status!="completed"}}[{RATE}]))',
            ),
        ),
    ),
    Panel("Turns in flight", "short", (("in flight", "max(agent_turns_in_flight)"),)),
    Panel("Turn duration (p95)", "s", (("{{status}}", _p95("agent_turn_seconds", "status")),)),
    Panel("Time to first token (p95)", "s", (("{{model}}", _p95("agent_model_first_token_seconds", "model")),)),
    Panel("Model call latency (p95)", "s", (("{{model}}", _p95("agent_model_call_seconds", "model")),)),
    Panel(
        "Model calls, by outcome",
        "ops",
        (("{{outcome}} {{error_class}}", f"sum by (outcome, error_class) (rate(agent_model_calls_total[{RATE}]))"),),
    ),
    Panel("Tool call latency (p95)", "s", (("{{tool}}", _p95("agent_tool_call_seconds", "tool")),)),
    Panel(
        "Tool call errors, by class",
        "ops",
        (
            (
                "{{tool}} {{error_class}}",
                f'sum by (tool, error_class) (rate(agent_tool_calls_total{{outcome="error"}}[{RATE}]))',
            ),
        ),
        "rejected and expired approvals, a tool's own errors (tool_error), exceptions...",
    ),
    Panel("Argument repairs", "ops", (("{{kind}}", f"sum by (kind) (rate(agent_argument_repairs_total[{RATE}]))"),)),
    Panel("Tokens", "short", (("{{kind}}", f"sum by (kind) (rate(agent_tokens_total[{RATE}]))"),)),
    Panel(
        "Approvals waiting",
        "short",
        (("waiting", "max(agent_approvals_waiting)"), ("oldest wait (s)", "max(agent_approval_oldest_wait_seconds)")),
    ),
    Panel(
        "Approval decision time (p95)",
        "s",
        (("{{decision}}", _p95("agent_approval_decision_seconds", "decision")),),
        "From the request to the decision: approved, rejected, expired (the deadline).",
    ),
    Panel(
        "Queue backlog",
        "short",
        (
            ("{{queue}}", "max by (queue) (agent_queue_backlog)"),
            ("{{queue}} oldest (s)", "max by (queue) (agent_queue_oldest_age_seconds)"),
        ),
    ),
    Panel("Watchdog re-drives", "ops", (("re-drives", f"sum(rate(agent_watchdog_redrives_total[{RATE}]))"),)),
    Panel(
        "API requests, by status",
        "reqps",
        (("{{status}}", f"sum by (status) (rate(agent_api_requests_total[{RATE}]))"),),
    ),
    Panel(
        "API requests over a rate or stream limit (429)",
        "reqps",
        (("{{route}}", f'sum by (route) (rate(agent_api_requests_total{{status="429"}}[{RATE}]))'),),
    ),
    Panel("API open event streams", "short", (("{{route}}", "sum by (route) (agent_api_open_streams)"),)),
    Panel(
        "API latency (p95, event streams excluded)",
        "s",
        (
            (
                "{{route}}",
                "histogram_quantile(0.95, sum by (le, route) "
                f'(rate(agent_api_request_seconds_bucket{{route!~".*/events"}}[{RATE}])))',
            ),
        ),
    ),
)


def queries(window: str = RATE) -> list[tuple[str, str]]:
    """Every panel's queries as ``(panel title, PromQL)``, the rate window replaced by ``window``
    (e.g. ``"1m"`` for a query sent to Prometheus itself)."""
    return [(p.title, expr.replace(RATE, window)) for p in PANELS for _, expr in p.queries]


def dashboard() -> Dashboard:
    """The dashboard: ``PANELS`` two per row, on the datasource chosen at import (``DS_PROMETHEUS``)."""
    panels = []
    for i, p in enumerate(PANELS):
        targets = [
            Target(expr=expr, legendFormat=legend, refId=chr(ord("A") + n), datasource=DATASOURCE)
            for n, (legend, expr) in enumerate(p.queries)
        ]
        panels.append(
            TimeSeries(
                title=p.title,
                description=p.description or None,
                dataSource=DATASOURCE,
                targets=targets,
                unit=p.unit,
                gridPos=GridPos(h=8, w=12, x=12 * (i % 2), y=8 * (i // 2)),
            )
        )
    return Dashboard(
        title="Agent tools runtime",
        uid="agent-runtime",
        description="Turns, model and tool calls, approvals, queues and the HTTP API (docs/operations.md).",
        tags=["agent-runtime"],
        timezone="browser",
        time=Time("now-1h", "now"),
        refresh="30s",
        schemaVersion=39,
        inputs=[
            {
                "name": "DS_PROMETHEUS",
                "label": "Prometheus",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        panels=panels,
    ).auto_panel_ids()


def render() -> str:
    """The dashboard as the JSON text written to ``OUTPUT`` (sorted keys, two-space indent, final newline)."""
    data: dict[str, Any] = json.loads(json.dumps(dashboard().to_json_data(), cls=DashboardEncoder))
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def main() -> int:
    """Write ``OUTPUT``; with ``--check``, exit 1 when the committed file differs instead."""
    text = render()
    if "--check" in sys.argv[1:]:
        same = OUTPUT.exists() and OUTPUT.read_text() == text
        print(f"{OUTPUT.relative_to(ROOT)} {'is' if same else 'is NOT'} what devtools/dashboard.py generates")
        return 0 if same else 1
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)} ({len(PANELS)} panels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
