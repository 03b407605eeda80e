"""Background agent job records, kept in Redis (plain Python, no Celery).

A background agent job is a separate agent turn loop with its own
instructions, started by a main turn (``job_start``) and run on the
``background`` queue. The turn's ``metadata.background_job_id`` ties it to
its record; when the turn ends, the control-plane hook
(``tasks.hooks.on_turn_finished``) calls ``JobStore.record_finished`` with
the turn's final status and output, and the parent agent reads them on a
later turn (``job_status`` / ``job_list``).

Keys (orjson values, never pickle):

- ``job:<id>``: the record (JSON object).
- ``agent:<agent_id>:jobs``: sorted set of the agent's job ids by creation time (epoch s).
- ``agent:<agent_id>:jobs:active``: set of the agent's unfinished job ids (the cap).

Record fields: ``job_id``, ``agent_id``, ``title``, ``instructions``,
``input``, ``turn_id`` (the job's turn), ``parent_turn_id``, ``status``,
``created_at`` / ``finished_at`` / ``cancel_requested_at`` (ISO 8601 UTC),
``output`` (the job turn's final answer, or ``null``), ``error``.

``status``: ``queued`` (record written, turn enqueued), ``cancel_requested``,
then the job turn's terminal status (``completed``, ``terminated``,
``failed``, ``cancelled``, ``max_model_calls``, ``invalid_arguments``, see
``worker.turn.request.TurnStatus``). ``running`` is not stored: readers derive it
from the turn store (``live_status``).

Limit (this module's rule): ``MAX_ACTIVE_JOBS_PER_AGENT = 5`` unfinished jobs
per agent; job turns cannot start jobs themselves (``supports.spawn_jobs`` is
false in their request), so jobs never fan out recursively.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Any, Callable

import redis

from worker.errors import AgentRuntimeError
from worker.records.agent_records import AT_CAP, EXISTED, AgentRecords

MAX_ACTIVE_JOBS_PER_AGENT = 5
FINISHED = ("completed", "terminated", "failed", "cancelled", "max_model_calls", "invalid_arguments")


class JobError(AgentRuntimeError, ValueError):
    """A job request that cannot be honoured; the message is shown to the model as is."""


def _now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def job_id_for(turn_id: str, call_id: str) -> str:
    """Deterministic id for the job started by one call: a re-run of the call finds the same job."""
    return "job_" + hashlib.sha1(f"{turn_id}:{call_id}".encode()).hexdigest()[:16]


class JobStore:
    """Job records over a ``redis.Redis`` client (``worker.records.agent_records`` holds the keys and the cap)."""

    def __init__(self, client: redis.Redis):
        self.r = client
        self._records = AgentRecords(client, "job", lambda rec: rec["status"] not in FINISHED)

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The job record, or None."""
        return self._records.get(job_id)

    def list(self, agent_id: str, limit: int = 50) -> list[dict[str, Any]]:
        """The agent's jobs, newest first."""
        return self._records.list(agent_id, limit)

    def active_count(self, agent_id: str) -> int:
        """How many of the agent's jobs are unfinished (the cap is ``MAX_ACTIVE_JOBS_PER_AGENT``)."""
        return self._records.active_count(agent_id)

    def create(
        self,
        *,
        job_id: str,
        agent_id: str,
        title: str,
        instructions: str,
        input: str,
        turn_id: str,
        parent_turn_id: str,
        cap: int = MAX_ACTIVE_JOBS_PER_AGENT,
    ) -> tuple[dict[str, Any], bool]:
        """Store a ``queued`` record. Returns ``(record, created)``; ``created`` is False when the
        record already existed (the same call ran again). Raises ``JobError`` at the cap."""
        rec = {
            "job_id": job_id,
            "agent_id": agent_id,
            "title": title,
            "instructions": instructions,
            "input": input,
            "turn_id": turn_id,
            "parent_turn_id": parent_turn_id,
            "status": "queued",
            "created_at": _now_iso(),
            "finished_at": None,
            "output": None,
            "error": None,
        }
        res = self._records.create(job_id, agent_id, rec, cap)
        if res == EXISTED:
            return self.get(job_id) or rec, False
        if res == AT_CAP:
            raise JobError(
                f"this agent already has {cap} unfinished background jobs (the maximum): wait for one to "
                "finish (job_status) or cancel one (job_cancel)."
            )
        return rec, True

    def update(self, job_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]) -> dict[str, Any] | None:
        """Apply ``change(record) -> fields`` atomically; a finished status leaves the active set.
        Returns the new record, or None (no record, or ``change`` returned None)."""
        return self._records.update(job_id, change)

    def remove(self, job_id: str) -> None:
        """Forget a record whose turn could not be enqueued."""
        self._records.remove(job_id)

    def record_finished(self, job_id: str, status: str, output: str | None, error: str | None) -> dict[str, Any] | None:
        """Record the job turn's end (first call wins; a repeat returns None)."""
        return self.update(
            job_id,
            lambda r: (
                None
                if r["status"] in FINISHED
                else {"status": status, "output": output, "error": error, "finished_at": _now_iso()}
            ),
        )

    def request_cancel(self, job_id: str) -> dict[str, Any] | None:
        """Mark an unfinished job ``cancel_requested``; None if it had already finished."""
        return self.update(
            job_id,
            lambda r: (
                None if r["status"] in FINISHED else {"status": "cancel_requested", "cancel_requested_at": _now_iso()}
            ),
        )


def live_status(rec: dict[str, Any], turn_status: str | None) -> str:
    """A record's status for readers: ``running`` while its turn runs, else the stored one."""
    if rec["status"] == "queued" and turn_status in ("running", "awaiting_approval"):
        return "running"
    status: str = rec["status"]
    return status
