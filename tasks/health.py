"""A no-op task: worker health checks and the benchmark floor (one bare task round trip)."""

from __future__ import annotations

from tasks.app import app


@app.task(name="tasks.health.ping", acks_late=True, ignore_result=False)
def ping(value: object = None) -> object:
    """Return ``value`` unchanged."""
    return value
