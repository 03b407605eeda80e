"""The wire styles a model server may speak, by name: ``WIRE_STYLES``, the one table.

``OPENAI_API_STYLE`` (a field of ``worker.settings.Settings``) names an entry; each entry is a wire API's
``WireFormat`` (``worker.model.wire_format``), which both model clients take
(``worker.model.sync_client.SyncModelClient``, ``worker.model.async_client.AsyncModelClient``).
The settings sit below the model layer and cannot import this table, so the name is checked
here, by ``wire_format``: where a process builds its clients (``worker.model.clients``) and when
a worker starts (``tasks.app``), which stops naming the table's entries.

A new wire style is one module (its ``WireFormat``: path, bodies, parse, stream reader) and one
entry below (docs/architecture.md, "Which files a change takes").
"""

from __future__ import annotations

from worker.errors import AgentRuntimeError
from worker.model.chat import CHAT
from worker.model.responses import RESPONSES
from worker.model.wire_format import WireFormat

WIRE_STYLES: dict[str, WireFormat] = {
    "responses": RESPONSES,  # POST /responses, the OpenAI Responses API (the turn store's own item format)
    "chat": CHAT,  # POST /chat/completions: llama.cpp's server, vLLM, LM Studio, Ollama, most proxies
}
"""Wire style name (a value of ``OPENAI_API_STYLE``) -> its ``WireFormat``."""


class UnknownWireStyle(AgentRuntimeError, ValueError):
    """``OPENAI_API_STYLE`` names no entry of ``WIRE_STYLES``; the message names the entries."""


def wire_format(style: str) -> WireFormat:
    """The ``WireFormat`` of wire style ``style`` (a ``WIRE_STYLES`` name, as ``OPENAI_API_STYLE``
    gives it). Raises ``UnknownWireStyle`` naming the table's entries for any other value."""
    try:
        return WIRE_STYLES[style]
    except KeyError:
        raise UnknownWireStyle(
            f"OPENAI_API_STYLE={style!r} is not a wire style: use one of {', '.join(WIRE_STYLES)}"
        ) from None
