"""Running the project's Python commands as a user would, from the project's root, in a process of
their own: a module's command line (``python -m devtools.host``...) or a bench script."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tests.conftest import ROOT

# What a bench sets up itself: a value from the test run's environment would point it elsewhere.
BENCH_OWN_SETTINGS = ("REDIS_URL", "CONTROL_REDIS_URL", "OPENAI_BASE_URL", "AGENT_HOMES_ROOT", "AGENT_EXTRA_TOOLSETS")


def run_python(args: list[str], env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python <args>`` (this interpreter) from the project's root with exactly ``env``; returns the
    finished process, its output as text. Raises ``subprocess.TimeoutExpired`` after ``timeout``
    seconds."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout
    )


def run_bench(script: str, args: list[str], tmp: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``bench/<script>`` with ``args`` (``run_python``), ``TMPDIR`` set to ``tmp`` (an empty
    folder: what the run leaves behind is what ``tmp`` holds after it), the bench's own settings
    unset."""
    env = {k: v for k, v in os.environ.items() if k not in BENCH_OWN_SETTINGS}
    env.update(TMPDIR=str(tmp), PYTHONPATH=str(ROOT))
    return run_python([str(ROOT / "bench" / script), *args], env, timeout)
