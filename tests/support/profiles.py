"""Test fixtures: run a test under one provider wire profile (``AGENT_MODEL_PROVIDER``).

Tools are checked against the profile in use when they are defined, so a test that defines a
tool only one provider can take (a recursive schema: Gemini has no ``$ref``) runs under that
provider's profile, as a deployment would."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from worker.settings import get_settings


@pytest.fixture
def openai_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``AGENT_MODEL_PROVIDER=openai`` for the test (the process settings are re-read around it)."""
    monkeypatch.setenv("AGENT_MODEL_PROVIDER", "openai")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def any_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``AGENT_MODEL_PROVIDER=any`` for the test: one copy for several providers (Gemini's rules too)."""
    monkeypatch.setenv("AGENT_MODEL_PROVIDER", "any")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.fixture
def default_profile(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No ``AGENT_MODEL_PROVIDER`` for the test: the profile the runtime chooses by itself."""
    monkeypatch.delenv("AGENT_MODEL_PROVIDER", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()
