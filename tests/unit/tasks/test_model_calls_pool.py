"""A worker refuses ``AGENT_MODEL_CALLS=inline`` on a solo pool that runs steps, at start
(``tasks.app.check_model_calls_pool``, from ``worker_init``): an inline call would hold the solo
pool's only thread while the model answers. Compose and Kubernetes start ``celery worker --pool
solo`` themselves, so the check is on the pool the worker runs, not on ``AGENT_IO_POOL``."""

from __future__ import annotations

import pytest
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadPool

from tasks.app import check_model_calls_pool


@pytest.mark.parametrize("pool", [SoloPool, "solo"])
@pytest.mark.parametrize("queues", [["turns"], ["background"], ["workflow"], ["turns", "tools"]])
def test_inline_model_calls_on_a_solo_step_worker_are_refused(pool, queues):
    with pytest.raises(ValueError, match=r"AGENT_MODEL_CALLS=inline needs a threads pool \(--pool threads"):
        check_model_calls_pool(pool, queues, "inline")


@pytest.mark.parametrize(
    ("pool", "queues", "calls"),
    [
        (ThreadPool, ["turns"], "inline"),
        ("threads", ["turns", "background", "workflow"], "inline"),
        (PreforkPool, ["turns"], "inline"),  # prefork children always call inline
        (SoloPool, ["tools"], "inline"),  # no step runs here: no model call
        (SoloPool, ["turns"], "async"),
    ],
)
def test_what_inline_model_calls_may_run_on(pool, queues, calls):
    check_model_calls_pool(pool, queues, calls)
