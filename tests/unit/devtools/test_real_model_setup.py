"""The real-model tier's setup that runs without the model (docs/real-model.md): the chat template
derivation, and the tier's folder left out of a run over the whole suite."""

from __future__ import annotations

import pytest

from devtools.real_model import TEMPLATE_EDITS, derive_tool_template

SHIPPED = "".join(f"<before {n}>{theirs}" for n, (theirs, _) in enumerate(TEMPLATE_EDITS)) + "<end>"


def test_the_derived_template_writes_calls_as_bare_json():
    derived = derive_tool_template(SHIPPED)
    assert derived == "".join(f"<before {n}>{ours}" for n, (_, ours) in enumerate(TEMPLATE_EDITS)) + "<end>"
    assert "<tool_call>" not in derived and "{{\\" not in derived


@pytest.mark.parametrize("n", range(len(TEMPLATE_EDITS)))
def test_a_template_without_one_markup_or_with_it_twice_is_refused(n):
    theirs = TEMPLATE_EDITS[n][0]
    with pytest.raises(ValueError, match="chat template has changed"):
        derive_tool_template(SHIPPED.replace(theirs, ""))
    with pytest.raises(ValueError, match="chat template has changed"):
        derive_tool_template(SHIPPED + theirs)


def test_the_tier_is_not_collected_by_default(pytestconfig):
    from tests.conftest import REAL_MODEL_TESTS, pytest_ignore_collect

    assert pytest_ignore_collect(REAL_MODEL_TESTS, pytestconfig) is True
