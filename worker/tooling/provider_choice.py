"""Which provider profile is in force, and why (``AGENT_MODEL_PROVIDER``, else a guess said aloud).

The runtime speaks the OpenAI Responses API by default, so the default profile is that API's own
rules (``openai``): a tool's ``strict`` is copied to the wire as it is defined, and a workflow
task's ``submit_result`` is strict whenever its schema can be. A deployment whose requests reach
several providers (one copy for all, behind a proxy) or Gemini says so with
``AGENT_MODEL_PROVIDER`` (``any``, ``gemini``, ``anthropic``).

When the variable is unset, the only guess is from the model endpoint's host (``OPENAI_BASE_URL``):
the OpenAI-compatible endpoints of Gemini and Anthropic, whose own rules then apply. Whatever the
choice, ``describe()`` says it and why, and both the worker's start log and ``make run`` print it.

| endpoint host (``OPENAI_BASE_URL``) | profile | source |
|---|---|---|
| ``generativelanguage.googleapis.com`` | ``gemini`` | Gemini's OpenAI compatibility (``/v1beta/openai/``), per Google's Gemini API docs |
| ``*-aiplatform.googleapis.com``, ``aiplatform.googleapis.com`` | ``gemini`` | Vertex AI's OpenAI-compatible Chat Completions endpoint |
| ``api.anthropic.com`` | ``anthropic`` | Anthropic's OpenAI SDK compatibility (``/v1/``), per Anthropic's docs |
| anything else | ``openai`` | the Responses API, the wire the runtime speaks |
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from worker.settings import Settings, get_settings

STRICT_PROFILES = frozenset({"openai", "anthropic"})
"""Profiles whose copy carries OpenAI strict mode (``worker.tooling.wire_profiles.strict_refusal``)."""

_HOSTS = (
    ("generativelanguage.googleapis.com", "gemini", "Gemini's OpenAI-compatible endpoint"),
    ("aiplatform.googleapis.com", "gemini", "Vertex AI's OpenAI-compatible endpoint"),
    ("api.anthropic.com", "anthropic", "Anthropic's OpenAI-compatible endpoint"),
)


@dataclass(frozen=True)
class ProviderChoice:
    """The profile in force (``provider``: ``openai``, ``anthropic``, ``gemini`` or ``any``) and
    ``why``: ``"AGENT_MODEL_PROVIDER=<p>"``, a guess naming the endpoint host, or the default."""

    provider: str
    why: str

    @property
    def strict(self) -> bool:
        """Whether tools defined ``strict=True`` are sent strict under this profile."""
        return self.provider in STRICT_PROFILES


def choose(settings: Settings) -> ProviderChoice:
    """The profile ``settings`` put in force (see the module docstring)."""
    if settings.model_provider is not None:
        return ProviderChoice(settings.model_provider, f"AGENT_MODEL_PROVIDER={settings.model_provider}")
    host = (urlsplit(settings.openai_base_url).hostname or "").lower()
    for suffix, provider, what in _HOSTS:
        if host == suffix or host.endswith("-" + suffix) or host.endswith("." + suffix):
            return ProviderChoice(
                provider, f"guessed: OPENAI_BASE_URL's host {host} is {what}; AGENT_MODEL_PROVIDER overrides it"
            )
    return ProviderChoice(
        "openai",
        "the default: the OpenAI Responses API's own rules (set AGENT_MODEL_PROVIDER=any when one copy "
        "reaches several providers, =gemini for Gemini)",
    )


_LAST: list[tuple[Settings, ProviderChoice]] = []


def current_choice() -> ProviderChoice:
    """``choose`` for the process's settings (computed once per settings object: tool assembly asks
    for it on every definition)."""
    settings = get_settings()
    if _LAST and _LAST[0][0] is settings:
        return _LAST[0][1]
    choice = choose(settings)
    _LAST[:] = [(settings, choice)]
    return choice


def describe(choice: ProviderChoice, strict_tools: tuple[str, ...] = ()) -> list[str]:
    """What the start log and ``make run`` print: the profile and why, and, when the profile carries
    no strict mode, which of ``strict_tools`` (the product's tools defined strict that fall back to
    ``strict: false``) lost it, and that a tool of one's own defined strict is refused at definition."""
    lines = [f"model provider profile {choice.provider} ({choice.why})"]
    if not choice.strict:
        names = ", ".join(strict_tools) if strict_tools else "none of the built-in tools"
        lines.append(
            f"strict mode is off under profile {choice.provider} (Gemini refuses the additionalProperties: false "
            f"it needs, rule G4): sent with strict: false instead: {names}; a tool of your own defined with "
            "strict=True is refused at definition"
        )
    return lines
