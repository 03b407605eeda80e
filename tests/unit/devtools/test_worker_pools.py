"""The node's I/O pool (``devtools.workers.worker_commands``): solo by default, as compose and the
Kubernetes manifests run it; a threads pool when asked, with its size; nothing else. The tools
pool: prefork, one process per core or ``AGENT_TOOLS_CONCURRENCY``. A setting it
refuses (another pool, a malformed size, inline model calls on solo) is one line from ``make
run``/``make stack``/``make worker``, not a traceback, and the stack's console names the pool it runs."""

from __future__ import annotations

import os

import pytest

from devtools.devstack import workers_line
from devtools.workers import check_pool_settings, describe_io_pool, worker_commands
from tests.support.runs import run_python

POOL_SETTINGS = ("AGENT_IO_POOL", "AGENT_IO_CONCURRENCY", "AGENT_TOOLS_CONCURRENCY", "AGENT_MODEL_CALLS")


def _pool(argv: list[str]) -> tuple[str, str | None]:
    return argv[argv.index("--pool") + 1], argv[argv.index("-c") + 1] if "-c" in argv else None


@pytest.fixture(autouse=True)
def _no_pool_settings(monkeypatch):
    for name in POOL_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def test_the_io_pool_is_solo_by_default(monkeypatch):
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", "8")  # a threads pool's size: not a solo pool's
    commands = worker_commands(tools_concurrency=3, tag="t")
    # No -c for solo: one task at a time whatever it says (Celery's banner shows the prefetch size).
    assert _pool(commands["worker-io"]) == ("solo", None)
    assert _pool(commands["worker-tools"]) == ("prefork", "3")


def test_a_threads_io_pool_has_its_size(monkeypatch):
    monkeypatch.setenv("AGENT_IO_POOL", "threads")
    assert _pool(worker_commands(tag="t")["worker-io"]) == ("threads", "32")
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", "8")
    assert _pool(worker_commands(tag="t")["worker-io"]) == ("threads", "8")
    assert _pool(worker_commands(io_pool="solo", tag="t")["worker-io"]) == ("solo", None)


@pytest.mark.parametrize("pool", ["prefork", "gevent", ""])
def test_an_io_pool_that_would_call_the_model_inline_is_refused(monkeypatch, pool):
    """A prefork child makes its model calls inline, one at a time: not an I/O pool."""
    monkeypatch.setenv("AGENT_IO_POOL", pool)
    if pool == "":
        assert _pool(worker_commands(tag="t")["worker-io"]) == ("solo", None)  # unset: the default
        return
    with pytest.raises(ValueError, match="AGENT_IO_POOL must be solo or threads"):
        worker_commands(tag="t")


@pytest.mark.parametrize("pool", ["solo", "threads"])
@pytest.mark.parametrize("size", ["0", "-4", "abc", "1.5", "8 threads"])
def test_a_malformed_io_concurrency_is_refused_not_replaced(monkeypatch, pool, size):
    """A size that is set must be a whole number of at least 1 (0 used to become 32 in silence)."""
    monkeypatch.setenv("AGENT_IO_POOL", pool)
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", size)
    with pytest.raises(ValueError, match=r"AGENT_IO_CONCURRENCY must be a whole number of threads, at least 1, not"):
        worker_commands(tag="t")
    with pytest.raises(ValueError, match="at least 1 thread"):
        worker_commands(io_pool="threads", io_concurrency=-1, tag="t")


def test_the_tools_pool_has_one_process_per_core_unless_told(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert _pool(worker_commands(tag="t")["worker-tools"]) == ("prefork", "6")
    monkeypatch.setenv("AGENT_TOOLS_CONCURRENCY", " 3 ")
    assert _pool(worker_commands(tag="t")["worker-tools"]) == ("prefork", "3")
    assert _pool(worker_commands(tools_concurrency=2, tag="t")["worker-tools"]) == ("prefork", "2")
    assert _pool(worker_commands(tag="t", env={"AGENT_TOOLS_CONCURRENCY": "5"})["worker-tools"]) == ("prefork", "5")


@pytest.mark.parametrize("size", ["0", "-4", "abc", "1.5", "8 processes", "\u00b2"])
def test_a_malformed_tools_concurrency_is_refused_not_replaced(monkeypatch, size):
    """Set, it must be a whole number of at least 1 (0 used to become the number of cores in
    silence, and ``abc`` was a traceback)."""
    monkeypatch.setenv("AGENT_TOOLS_CONCURRENCY", size)
    match = r"^AGENT_TOOLS_CONCURRENCY must be a whole number of processes, at least 1, not"
    with pytest.raises(ValueError, match=match):
        worker_commands(tag="t")
    with pytest.raises(ValueError, match=match):
        check_pool_settings()
    with pytest.raises(ValueError, match="at least 1 process"):
        worker_commands(tools_concurrency=0, tag="t")


def test_inline_model_calls_need_a_threads_pool(monkeypatch):
    """An inline call holds its thread while the model answers: on solo, the node's only one."""
    monkeypatch.setenv("AGENT_MODEL_CALLS", "inline")
    with pytest.raises(ValueError, match="AGENT_MODEL_CALLS=inline needs AGENT_IO_POOL=threads"):
        worker_commands(tag="t")
    monkeypatch.setenv("AGENT_IO_POOL", "threads")
    assert _pool(worker_commands(tag="t")["worker-io"]) == ("threads", "32")
    monkeypatch.setenv("AGENT_MODEL_CALLS", "async")
    monkeypatch.delenv("AGENT_IO_POOL")
    assert _pool(worker_commands(tag="t")["worker-io"]) == ("solo", None)


def test_the_stack_names_the_pool_it_runs(monkeypatch):
    assert "workflow on a solo pool;" in workers_line(describe_io_pool())
    monkeypatch.setenv("AGENT_IO_POOL", "threads")
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", "8")
    assert "workflow on a threads pool of 8;" in workers_line(describe_io_pool())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "needle"),
    [
        ({"AGENT_IO_POOL": "prefork"}, "AGENT_IO_POOL must be solo or threads, not 'prefork'"),
        ({"AGENT_MODEL_CALLS": "inline"}, "AGENT_MODEL_CALLS=inline needs AGENT_IO_POOL=threads"),
        ({"AGENT_IO_POOL": "threads", "AGENT_IO_CONCURRENCY": "0"}, "AGENT_IO_CONCURRENCY must be a whole number"),
        ({"AGENT_TOOLS_CONCURRENCY": "0"}, "AGENT_TOOLS_CONCURRENCY must be a whole number of processes"),
        ({"AGENT_TOOLS_CONCURRENCY": "four"}, "AGENT_TOOLS_CONCURRENCY must be a whole number of processes"),
    ],
)
@pytest.mark.parametrize("module", ["devtools.devstack", "devtools.workers"])
def test_make_run_stack_and_worker_refuse_a_pool_setting_in_one_line(setting, needle, module):
    """``make run``/``make stack`` (devstack) and ``make worker`` (workers): one ``error:`` line and
    exit 1, before anything is started (no Redis is reached: REDIS_URL is a closed port here)."""
    env = {k: v for k, v in os.environ.items() if k not in POOL_SETTINGS}
    args = ["-m", module, *(["--demo", "demo"] if module == "devtools.devstack" else [])]
    run = run_python(args, {**env, **setting, "REDIS_URL": "redis://127.0.0.1:1/0"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], out
    assert "Traceback" not in out and len(out.strip().splitlines()) == 1, out
