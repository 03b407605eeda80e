"""The Grafana dashboard (``devtools/dashboard.py``, grafanalib) and the metrics documentation:
the committed ``deploy/grafana/agent-runtime.json`` is what the module generates, and
docs/operations.md names exactly the series the workers and the API export. That every panel
returns data from a real Prometheus is ``tests/integration/test_dashboard.py``."""

from __future__ import annotations

import re
from pathlib import Path

from devtools import dashboard

ROOT = Path(__file__).resolve().parents[3]


def test_committed_dashboard_is_the_generated_one():
    assert dashboard.OUTPUT.read_text() == dashboard.render(), "run `make dashboard` and commit the result"


def test_every_panel_has_queries_and_a_unique_title():
    titles = [p.title for p in dashboard.PANELS]
    assert len(titles) == len(set(titles)) and all(p.queries for p in dashboard.PANELS)


def test_the_operations_doc_names_exactly_the_metrics_exported():
    """docs/operations.md, "Metrics": every series a worker or the API exports is named there, and
    nothing else is (the gauges read from Redis at scrape time are ``tasks/metrics.py``'s and
    ``tasks/queue_metrics.py``'s collectors)."""
    from prometheus_client import REGISTRY

    from control.api import metrics as api_metrics
    from worker.turn import metrics  # noqa: F401  (registers the turn loop's metrics)

    def names(registry) -> set[str]:
        out = set()
        for family in registry.collect():
            if family.name.startswith("agent_"):
                out.add(family.name + ("_total" if family.type == "counter" else ""))
        return out

    scraped = {
        "agent_turns_in_flight",
        "agent_queue_backlog",
        "agent_queue_oldest_age_seconds",
        "agent_approvals_waiting",
        "agent_approval_oldest_wait_seconds",
    }
    exported = names(REGISTRY) | names(api_metrics.REGISTRY) | scraped
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text.split("## Metrics (Prometheus)", 1)[1].split("\n## Dashboard", 1)[0]
    documented = set(re.findall(r"`(agent_[a-z_]+)", section))
    assert documented == exported, (documented - exported, exported - documented)
