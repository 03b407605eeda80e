"""The example alert rules (deploy/alerts.yml) are valid, fire on the series they are meant for
and stay quiet otherwise (deploy/alerts-test.yml), checked by promtool (``make promtool``, a
prerequisite of ``make test``); and Prometheus's config loads them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"


def _promtool() -> str:
    found = shutil.which("promtool")
    assert found, "promtool is missing: run `make promtool` (Debian's prometheus package)"
    return found


def test_alert_rules_are_valid_and_their_unit_tests_pass():
    check = subprocess.run([_promtool(), "check", "rules", "alerts.yml"], cwd=DEPLOY, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    test = subprocess.run([_promtool(), "test", "rules", "alerts-test.yml"], cwd=DEPLOY, capture_output=True, text=True)
    assert test.returncode == 0, test.stdout + test.stderr
    assert "SUCCESS" in test.stdout


def test_every_alert_has_a_unit_test_and_prometheus_loads_the_rules():
    rules = yaml.safe_load((DEPLOY / "alerts.yml").read_text())
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    tested = {
        t["alertname"]
        for case in yaml.safe_load((DEPLOY / "alerts-test.yml").read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert names <= tested, sorted(names - tested)
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/alerts.yml"]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert "./deploy/alerts.yml:/etc/prometheus/alerts.yml:ro" in compose["services"]["prometheus"]["volumes"]
