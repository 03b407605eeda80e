"""The model client a process uses, chosen by ``OPENAI_API_STYLE`` (``worker.settings``).

``responses`` -> ``ResponsesClient`` (``POST /responses``); ``chat`` -> ``ChatClient``
(``POST /chat/completions``). Both implement ``ModelClient`` and take the same connection settings.
"""

from __future__ import annotations

from worker.model.chat import ChatClient
from worker.model.interface import ModelClient
from worker.model.responses import ResponsesClient
from worker.settings import Settings


def model_client(settings: Settings) -> ModelClient:
    """A client for ``settings.openai_base_url`` in ``settings.openai_api_style``."""
    cls = ChatClient if settings.openai_api_style == "chat" else ResponsesClient
    return cls(
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        timeout=settings.model_timeout,
        connect_timeout=settings.model_connect_timeout,
        max_connections=settings.model_max_connections,
    )
