"""Celery tasks of a turn: ``turn_step`` (one model call) and ``tool_call`` (one tool call).

Messages carry ids and the step number only; everything else is read from the
turn store. Neither task ever waits on another (no ``.get()``).

The task during which a turn ends with a failure status (``TurnStatus.failure``) raises
``TurnFailed`` after everything is recorded, so that monitors see the failure (Flower's
FAILURE state and Failed filter, ``task-failed`` events). The engine says so in the step's
return value (``StepOutcome.ended``). ``TurnFailed`` is an expected exception (``throws``):
logged in one line, and the message is acknowledged, never retried.

A retryable model-gateway error is retried with exponential backoff and jitter
(``retry_delay``: docs/architecture.md, "Retries").
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar, assert_never

from celery import Task

from tasks.app import app
from tasks.dispatcher import STARTED_HEADER
from tasks.placement import forward
from tasks.runtime import get_engine
from worker.errors import AgentRuntimeError
from worker.model.interface import GatewayError
from worker.settings import get_settings
from worker.turn.call_runner import DEFERRALS
from worker.turn.outage import OUTAGE_ERRORS, until_redis_answers
from worker.turn.outcome import StepOutcome
from worker.turn.request import TurnStatus
from worker.turn.retries import MAX_MODEL_RETRIES, note_retry, retry_delay

log = logging.getLogger("agent.tasks")
T = TypeVar("T")


class TurnFailed(AgentRuntimeError):
    """The turn this task worked on ended with a failure status; the message names the status and reason."""


def _result(outcome: StepOutcome) -> str:
    """The task's result (what Flower shows): ``"<action>: <detail>"``, or the action alone. Text,
    not a dict: Celery writes every task's result with its pure-Python ``saferepr`` (for the
    worker's log and the ``task-succeeded`` event), and a dict of two strings cost it five times
    what one string does (bench/README.md, "Worker CPU per turn, second pass")."""
    return f"{outcome.action}: {outcome.detail}" if outcome.detail else outcome.action


def _report(task: Task[Any, Any], turn_id: str, outcome: StepOutcome) -> str:
    """What the task does with what the engine did (every ``Action``, matched exhaustively): a
    forwarded call is sent to its node's queue; otherwise the task's result (``_result``), and
    ``TurnFailed`` when this very work ended the turn with a failure status (whatever the action:
    a model step, a call closing the last batch, a re-drive)."""
    match outcome.action:
        case "forwarded":  # the agent's home is on another node: the call runs there
            forward(task, outcome.detail)  # replaces this task (Celery's Ignore ends it)
            return _result(outcome)
        case "deferred":  # a destructive call's claim reached no replica: sent again later, holding nothing
            raise task.retry(countdown=DEFERRALS[task.request.retries], max_retries=len(DEFERRALS))
        case (
            "dropped"
            | "waiting"
            | "dispatched"
            | "parked"
            | "repair_instruction"
            | "completed"
            | "incomplete"
            | "ended"
            | "cancelled"
            | "ran"
            | "advanced"
            | "redriven"
            | "failed"
        ):
            if outcome.ended is not None and outcome.ended.status.failure:
                _fail_task(turn_id, outcome.ended.status, outcome.ended.error)
            return _result(outcome)
        case unknown:
            assert_never(unknown)


def _fail_task(turn_id: str, status: TurnStatus, error: str | None) -> None:
    raise TurnFailed(f"turn {turn_id} ended {status.value}: {error or ''}".strip())


def _through_outages(run: Callable[[], T], what: str) -> T:
    """Run ``run()`` again while Redis does not answer (``worker.turn.outage.until_redis_answers``,
    bounded by ``Settings.redis_outage_timeout``): steps and calls are fenced and claimed, so running
    again is safe, and waiting here rather than queueing a Celery retry does not need the broker
    (the same Redis) to be up."""
    return until_redis_answers(run, what=what, timeout=get_settings().redis_outage_timeout)


def _fail_turn(turn_id: str, error: str) -> str:
    """End the turn ``failed`` with ``error``; raises ``TurnFailed`` when it ended here."""
    engine = get_engine()
    if _through_outages(lambda: engine.fail_turn(turn_id, TurnStatus.failed, error), f"turn {turn_id}"):
        _fail_task(turn_id, TurnStatus.failed, error)
    return "failed"


@app.task(name="tasks.turns.turn_step", bind=True, acks_late=True, max_retries=MAX_MODEL_RETRIES, throws=(TurnFailed,))
def turn_step(self: Any, turn_id: str, step: int) -> str:
    """Run model step ``step`` of ``turn_id``; retried with backoff on retryable gateway errors."""
    engine = get_engine()
    try:
        outcome = _through_outages(lambda: engine.run_step(turn_id, step), f"turn {turn_id} step {step}")
    except GatewayError as exc:
        error = str(exc)
        if self.request.retries < MAX_MODEL_RETRIES:
            delay = retry_delay(self.request.retries)

            _through_outages(
                lambda: note_retry(engine.store, engine.settings, turn_id, step, error, delay),
                f"turn {turn_id} step {step}",
            )
            raise self.retry(exc=exc, countdown=delay) from exc
        return _fail_turn(turn_id, f"model gateway failed after retries: {error}")
    except OUTAGE_ERRORS as exc:
        # Redis stayed away longer than redis_outage_timeout: the turn's state is fine; the
        # watchdog re-drives the step once Redis is back.
        log.error("turn %s step %s: Redis did not come back (%s)", turn_id, step, exc)
        raise
    except Exception as exc:  # never leave a turn hanging on a bug: end it with the reason
        log.exception("turn %s step %s crashed", turn_id, step)
        return _fail_turn(turn_id, f"internal error in step {step}: {exc.__class__.__name__}: {exc}")
    return _report(self, turn_id, outcome)


_limit = get_settings().tool_time_limit


# celery-types declares the time limits as int; Celery takes seconds as a float.
@app.task(  # type: ignore[call-overload,untyped-decorator]
    name="tasks.turns.tool_call",
    bind=True,
    acks_late=True,
    soft_time_limit=_limit,
    time_limit=_limit + 30,
    throws=(TurnFailed,),
)
def tool_call(self: Task[Any, Any], turn_id: str, step: int, call_id: str) -> str:
    """Run one tool call of step ``step``; the last call of a batch advances the turn. A Redis
    outage is waited out (the call's result is kept until stored: ``worker.turn.outage``). A call
    whose agent's home is on another node is forwarded there (``tasks.placement.forward``). A
    destructive call whose claim no replica acknowledged in time is sent again later (the task
    retried with a countdown: no thread waits; docs/failover.md)."""
    engine = get_engine()
    # What the message carries about claiming the call with its first read (None: a message without
    # it, e.g. from an earlier version; ``tasks.dispatcher.STARTED_HEADER``).
    started = self.request.get(STARTED_HEADER)
    outcome = _through_outages(
        lambda: engine.run_call(turn_id, step, call_id, self.request.retries, started),
        f"call {call_id} of turn {turn_id}",
    )
    return _report(self, turn_id, outcome)


@app.task(name="tasks.turns.turn_finished", acks_late=True)
def turn_finished(turn_id: str) -> dict[str, Any]:
    """Run the control-plane hooks of a turn that ended (workflow commit, background job status)."""
    from tasks.hooks import on_turn_finished

    engine = get_engine()
    state = engine.store.load(turn_id)
    if state is None or not state.status.terminal:
        return {"action": "dropped"}
    report = on_turn_finished(engine, state)  # idempotent: a re-sent hook changes nothing
    engine.store.hooks_done(turn_id)
    return report


@app.task(name="tasks.turns.count_ended")
def count_ended(turn_id: str) -> dict[str, Any]:
    """Count a turn a control plane ended (a parked or queued turn cancelled) in this worker's
    metrics: its status, reason class and duration (``worker.turn.metrics.turn_ended``). Acknowledged
    when received (not ``acks_late``): a crash loses a count rather than counting a turn twice."""
    from worker.turn import metrics

    state = get_engine().store.load(turn_id)
    if state is None or not state.status.terminal:
        return {"action": "dropped"}
    metrics.turn_ended(state.status.value, state.error, state.updated_at - state.created_at)
    return {"action": "counted", "status": state.status.value}
