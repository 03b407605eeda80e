"""Running a bench script as a user would, in a temporary folder of its own (for the tests that
check a bench leaves nothing behind)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

# What a bench sets up itself: a value from the test run's environment would point it elsewhere.
OWN_SETTINGS = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_BASE_URL", "AGENT_HOMES_ROOT", "AGENT_EXTRA_TOOLSETS")


def run_bench(script: str, args: list[str], tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``bench/<script>`` with ``args`` from the project's root, ``TMPDIR`` set to ``tmp`` (an
    empty folder: what the run leaves behind is what ``tmp`` holds after it), the bench's own
    settings unset. Returns the finished process, its output as text."""
    env = {k: v for k, v in os.environ.items() if k not in OWN_SETTINGS}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
