"""A worker tunes Python's garbage collector at start (``tasks.app.tune_gc``): start-up objects
frozen, generation 0 collected every ``GC_THRESHOLDS[0]`` allocations instead of 700."""

from __future__ import annotations

import subprocess
import sys


def test_tune_gc_freezes_start_up_objects_and_raises_the_thresholds():
    code = (
        "import gc; from tasks.app import GC_THRESHOLDS, tune_gc; "
        "assert gc.get_threshold() == (700, 10, 10); tune_gc(); "
        "assert gc.get_threshold() == GC_THRESHOLDS, gc.get_threshold(); "
        "assert gc.get_freeze_count() > 10_000, gc.get_freeze_count(); print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
