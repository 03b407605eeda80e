"""The asynchronous client's pool fits the open-files limit (``worker.model.open_files``): the soft
limit is raised toward what the pool wants, and the pool is cut to what the hard limit leaves.
Each case runs in a child process with its own limits (they are per process)."""

from __future__ import annotations

import json
import resource
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.slow

CHILD = """
import json, resource, sys
from worker.model.open_files import connection_cap
cap = connection_cap(int(sys.argv[1]))
print(json.dumps({"cap": cap, "soft": resource.getrlimit(resource.RLIMIT_NOFILE)[0]}))
"""


def _cap_with_limits(wanted: int, soft: int, hard: int) -> dict[str, int]:
    def limits() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(wanted)],
        cwd=ROOT,
        preexec_fn=limits,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_soft_limit_is_raised_for_the_pool():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the hard open-files limit here is {hard}")
    # A soft limit of 1,024 used to stay: past it, every new model connection failed with EMFILE.
    assert _cap_with_limits(2000, 1024, 4096) == {"cap": 2000, "soft": 3024}


def test_the_pool_is_cut_to_what_the_hard_limit_leaves():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 3000:
        pytest.skip(f"the hard open-files limit here is {hard}")
    assert _cap_with_limits(10_000, 1024, 3000) == {"cap": 3000 - 1024, "soft": 3000}


def test_the_default_pool_holds_ten_thousand_calls():
    from worker.settings import Settings

    assert Settings().model_max_connections >= 10_000
