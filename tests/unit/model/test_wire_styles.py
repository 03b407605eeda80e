"""The wire-style table is the one list of wire styles: ``WIRE_STYLES``
(``worker.model.wire_styles``).

A style registered there is accepted by the settings and builds both model clients on its
``WireFormat``; a name it does not have is refused by both, naming the table's entries; each
entry is the ``WireFormat`` of one module of ``worker/model/``. The checklist entry "A new wire
style" of docs/architecture.md is checked against the code in tests/unit/test_docs.py.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from worker.model.async_client import AsyncModelClient
from worker.model.chat import CHAT
from worker.model.clients import async_model_client, model_client
from worker.model.sync_client import SyncModelClient
from worker.model.wire_styles import WIRE_STYLES, UnknownWireStyle, wire_format
from worker.settings import Settings


def test_a_style_registered_in_the_table_is_accepted_and_builds_both_clients(monkeypatch):
    # A new wire style: a WireFormat of its own (here Chat's parts at another path) and one entry.
    other = dataclasses.replace(CHAT, path="/other/completions")
    monkeypatch.setitem(WIRE_STYLES, "other", other)
    monkeypatch.setenv("OPENAI_API_STYLE", "other")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    settings = Settings()
    assert settings.openai_api_style == "other"

    sync = model_client(settings)
    assert isinstance(sync, SyncModelClient) and sync.wire is other
    sync.close()
    asynchronous = async_model_client(settings)
    assert isinstance(asynchronous, AsyncModelClient) and asynchronous.wire is other
    assert asynchronous.url == "http://127.0.0.1:9/v1/other/completions"


@pytest.mark.parametrize("style", sorted(WIRE_STYLES))
def test_every_style_of_the_table_builds_both_clients_on_its_wire(monkeypatch, style):
    monkeypatch.setenv("OPENAI_API_STYLE", style)
    settings = Settings()
    assert model_client(settings).wire is WIRE_STYLES[style]
    assert async_model_client(settings).wire is WIRE_STYLES[style]


def test_a_name_the_table_does_not_have_is_refused_naming_its_entries(monkeypatch):
    monkeypatch.setenv("OPENAI_API_STYLE", "completions")
    settings = Settings()
    for build in (model_client, async_model_client, lambda s: wire_format(s.openai_api_style)):
        with pytest.raises(UnknownWireStyle) as refused:
            build(settings)
        message = str(refused.value)
        assert "OPENAI_API_STYLE='completions'" in message
        assert all(name in message for name in WIRE_STYLES), message
    assert issubclass(UnknownWireStyle, ValueError)  # a worker's start-up check stops on it (tasks/app.py)


def test_each_entry_is_the_wire_format_of_one_module():
    """A wire style is one module of ``worker/model/``: its path, bodies, parse and stream reader
    are defined there, and so is its ``WireFormat``."""
    for name, wire in WIRE_STYLES.items():
        parts = (wire.body, wire.stream_body, wire.parse, wire.reader)
        homes = {part.__module__ for part in parts}
        assert len(homes) == 1, (name, homes)
        module = importlib.import_module(homes.pop())
        assert module.__name__.startswith("worker.model.") and any(v is wire for v in vars(module).values()), name
    assert len({id(w) for w in WIRE_STYLES.values()}) == len(WIRE_STYLES)  # no two names for one wire
