"""The node's I/O pool (``devtools.workers.worker_commands``): solo by default, as compose and the
Kubernetes manifests run it; a threads pool when asked, with its size; nothing else."""

from __future__ import annotations

import pytest

from devtools.workers import worker_commands


def _pool(argv: list[str]) -> tuple[str, str | None]:
    return argv[argv.index("--pool") + 1], argv[argv.index("-c") + 1] if "-c" in argv else None


def test_the_io_pool_is_solo_by_default(monkeypatch):
    monkeypatch.delenv("AGENT_IO_POOL", raising=False)
    monkeypatch.setenv("AGENT_IO_CONCURRENCY", "8")  # a threads pool's size: not a solo pool's
    commands = worker_commands(tools_concurrency=3, tag="t")
    assert _pool(commands["worker-io"]) == ("solo", None)
    assert _pool(commands["worker-tools"]) == ("prefork", "3")


def test_a_threads_io_pool_has_its_size(monkeypatch):
    monkeypatch.setenv("AGENT_IO_POOL", "threads")
    monkeypatch.delenv("AGENT_IO_CONCURRENCY", raising=False)
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
