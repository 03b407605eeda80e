"""Celery tasks of a turn: ``turn_step`` (one model call) and ``tool_call`` (one tool call).

Messages carry ids and the step number only; everything else is read from the
turn store. Neither task ever waits on another (no ``.get()``).

The task during which a turn ends with a failure status (``TurnStatus.failure``) raises
``TurnFailed`` after everything is recorded, so that monitors see the failure (Flower's
FAILURE state and Failed filter, ``task-failed`` events). It is an expected exception
(``throws``): logged in one line, and the message is acknowledged, never retried.
"""

from __future__ import annotations

import logging
from typing import Callable, TypeVar

from tasks.app import app
from tasks.dispatcher import ended_as, ended_here
from tasks.placement import forward
from tasks.runtime import get_engine
from worker.model.client import GatewayError
from worker.settings import get_settings
from worker.turn.outage import OUTAGE_ERRORS, until_redis_answers
from worker.turn.request import TurnStatus

log = logging.getLogger("agent.tasks")
T = TypeVar("T")

MAX_MODEL_RETRIES = 5


class TurnFailed(Exception):
    """The turn this task worked on ended with a failure status; the message names the status and reason."""


def _report(turn_id: str, result: dict) -> dict:
    # Raise when this very task ended the turn with a failure status (ended_here is set by the dispatcher).
    if ended_here() != turn_id:
        return result
    told = ended_as()
    if told is not None:
        status, error = told
    else:
        state = get_engine().store.load(turn_id)
        status, error = (state.status, state.error) if state is not None else (None, None)
    if status is not None and status.failure:
        raise TurnFailed(f"turn {turn_id} ended {status.value}: {error or ''}".strip())
    return result


def _through_outages(run: Callable[[], T], what: str) -> T:
    """Run ``run()`` again while Redis does not answer (``worker.turn.outage.until_redis_answers``,
    bounded by ``Settings.redis_outage_timeout``): steps and calls are fenced and claimed, so running
    again is safe, and waiting here rather than queueing a Celery retry does not need the broker
    (the same Redis) to be up."""
    return until_redis_answers(run, what=what, timeout=get_settings().redis_outage_timeout)


@app.task(name="tasks.turns.turn_step", bind=True, acks_late=True, max_retries=MAX_MODEL_RETRIES, throws=(TurnFailed,))
def turn_step(self, turn_id: str, step: int) -> dict:
    """Run model step ``step`` of ``turn_id``; retried with backoff on retryable gateway errors."""
    engine = get_engine()
    ended_here()  # forget an end seen by an earlier task of this process
    try:
        outcome = _through_outages(lambda: engine.run_step(turn_id, step), f"turn {turn_id} step {step}")
    except GatewayError as exc:
        error = str(exc)
        if self.request.retries < MAX_MODEL_RETRIES:
            delay = min(60, 2**self.request.retries)

            def note_retry() -> None:
                engine.store.event(turn_id, "model_retry", step=step, error=error[:300], in_s=delay)
                # Still working: keep the watchdog from starting a second retry chain.
                engine.store.push_deadline(turn_id, delay + engine.settings.model_timeout + 60)

            _through_outages(note_retry, f"turn {turn_id} step {step}")
            raise self.retry(exc=exc, countdown=delay) from exc
        _through_outages(
            lambda: engine.fail_turn(turn_id, TurnStatus.failed, f"model gateway failed after retries: {error}"),
            f"turn {turn_id}",
        )
        return _report(turn_id, {"action": "failed"})
    except OUTAGE_ERRORS as exc:
        # Redis stayed away longer than redis_outage_timeout: the turn's state is fine; the
        # watchdog re-drives the step once Redis is back.
        log.error("turn %s step %s: Redis did not come back (%s)", turn_id, step, exc)
        raise
    except Exception as exc:  # never leave a turn hanging on a bug: end it with the reason
        log.exception("turn %s step %s crashed", turn_id, step)
        engine.fail_turn(turn_id, TurnStatus.failed, f"internal error in step {step}: {exc.__class__.__name__}: {exc}")
        return _report(turn_id, {"action": "failed"})
    return _report(turn_id, {"action": outcome.action, "detail": outcome.detail})


_limit = get_settings().tool_time_limit


@app.task(
    name="tasks.turns.tool_call",
    bind=True,
    acks_late=True,
    soft_time_limit=_limit,
    time_limit=_limit + 30,
    throws=(TurnFailed,),
)
def tool_call(self, turn_id: str, step: int, call_id: str) -> dict:
    """Run one tool call of step ``step``; the last call of a batch advances the turn. A Redis
    outage is waited out (the call's result is kept until stored: ``worker.turn.outage``). A call
    whose agent's home is on another node is forwarded there (``tasks.placement.forward``)."""
    ended_here()
    engine = get_engine()
    outcome = _through_outages(lambda: engine.run_call(turn_id, step, call_id), f"call {call_id} of turn {turn_id}")
    if outcome.action == "forwarded":
        return forward(self, outcome.detail)
    return _report(turn_id, {"action": outcome.action, "detail": outcome.detail})


@app.task(name="tasks.turns.turn_finished", acks_late=True)
def turn_finished(turn_id: str) -> dict:
    """Run the control-plane hooks of a turn that ended (workflow commit, background job status)."""
    from tasks.hooks import on_turn_finished

    engine = get_engine()
    state = engine.store.load(turn_id)
    if state is None or not state.status.terminal:
        return {"action": "dropped"}
    report = on_turn_finished(engine, state)  # idempotent: a re-sent hook changes nothing
    engine.store.hooks_done(turn_id)
    return report
