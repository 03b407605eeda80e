"""``bench/step_chain.py`` runs, without arguments, the setting its README figures come from."""

from __future__ import annotations

import importlib.util
import re

from tests.conftest import ROOT


def _step_chain():
    spec = importlib.util.spec_from_file_location("step_chain", ROOT / "bench" / "step_chain.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_defaults_are_the_readme_setting():
    """bench/README.md's P1 figures are all "16 turns x 20 steps": a run without arguments is that run."""
    args = _step_chain().parser().parse_args([])
    assert (args.turns, args.steps) == (16, 20)
    assert args.rounds >= 6  # a median over enough alternated rounds: single rounds swing by 20-50%
    readme = (ROOT / "bench" / "README.md").read_text()
    section = readme[readme.index("#### P1: a step against the leanest bare-Celery step") :]
    assert re.search(r"16 turns x 20 steps", section)
