"""A turn task's result, what Flower shows and Celery writes with ``saferepr`` for every task: a
short text naming what the task did, not a dict (``tasks.turns._result``)."""

from __future__ import annotations

from celery.utils.saferepr import saferepr

from tasks.turns import _result
from worker.turn.outcome import StepOutcome


def test_the_result_names_the_action_and_its_detail():
    assert _result(StepOutcome("dispatched", "1 call(s) of step 0")) == "dispatched: 1 call(s) of step 0"
    assert _result(StepOutcome("completed")) == "completed"


def test_celery_writes_it_as_the_text_itself():
    text = _result(StepOutcome("waiting", "model call in flight"))
    assert saferepr(text, 1024) == repr(text)
