"""The model clients a process uses, chosen by ``OPENAI_API_STYLE`` (``worker.settings``).

``responses`` -> ``POST /responses``; ``chat`` -> ``POST /chat/completions``. ``model_client``
gives the synchronous client (``ResponsesClient`` or ``ChatClient``, a ``ModelClient``);
``async_model_client`` the asynchronous one (``AsyncModelClient`` on that wire format). Both take
the same connection settings.
"""

from __future__ import annotations

from worker.model.async_client import AsyncModelClient
from worker.model.chat import CHAT, ChatClient
from worker.model.interface import ModelClient
from worker.model.responses import RESPONSES, ResponsesClient
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
        max_reply_bytes=settings.model_max_reply_bytes,
    )


def async_model_client(settings: Settings) -> AsyncModelClient:
    """An ``AsyncModelClient`` for ``settings.openai_base_url`` in ``settings.openai_api_style``,
    its whole call bounded by ``Settings.model_call_lease`` (seconds)."""
    return AsyncModelClient(
        CHAT if settings.openai_api_style == "chat" else RESPONSES,
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        timeout=settings.model_timeout,
        connect_timeout=settings.model_connect_timeout,
        # A call that outlives its step's claim may be made again elsewhere (paid twice), and its
        # turn is re-driven at that point anyway: the claim's lease bounds the call.
        deadline=settings.model_call_lease,
        max_connections=settings.model_max_connections,
        max_reply_bytes=settings.model_max_reply_bytes,
    )
