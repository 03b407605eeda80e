"""The model clients a process uses, in the wire style ``OPENAI_API_STYLE`` names (``worker.settings``).

The style is a name of ``worker.model.wire_styles.WIRE_STYLES`` (``responses`` -> ``POST
/responses``; ``chat`` -> ``POST /chat/completions``); ``model_client`` gives the synchronous
client on its ``WireFormat`` (``SyncModelClient``, a ``ModelClient``), ``async_model_client`` the
asynchronous one (``AsyncModelClient``). Both take the same connection settings, and both raise
``UnknownWireStyle`` (naming the table's entries) for a style the table does not have.
"""

from __future__ import annotations

from worker.model.async_client import AsyncModelClient
from worker.model.open_files import connection_cap
from worker.model.sync_client import SyncModelClient
from worker.model.wire_styles import wire_format
from worker.settings import Settings


def model_client(settings: Settings) -> SyncModelClient:
    """A ``SyncModelClient`` for ``settings.openai_base_url`` in ``settings.openai_api_style``.
    Raises ``UnknownWireStyle``."""
    return SyncModelClient(
        wire_format(settings.openai_api_style),
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        timeout=settings.model_timeout,
        connect_timeout=settings.model_connect_timeout,
        max_connections=settings.model_max_connections,
        max_reply_bytes=settings.model_max_reply_bytes,
    )


def async_model_client(settings: Settings) -> AsyncModelClient:
    """An ``AsyncModelClient`` for ``settings.openai_base_url`` in ``settings.openai_api_style``,
    its whole call bounded by ``Settings.model_call_lease`` (seconds), its pool by
    ``AGENT_MODEL_MAX_CONNECTIONS`` and the open-files limit (``open_files.connection_cap``, which
    raises the soft limit first). Raises ``UnknownWireStyle``."""
    return AsyncModelClient(
        wire_format(settings.openai_api_style),
        settings.openai_base_url,
        settings.openai_api_key.get_secret_value(),
        timeout=settings.model_timeout,
        connect_timeout=settings.model_connect_timeout,
        # A call that outlives its step's claim may be made again elsewhere (paid twice), and its
        # turn is re-driven at that point anyway: the claim's lease bounds the call.
        deadline=settings.model_call_lease,
        # One socket per call in flight: the pool is cut to what the open-files limit allows.
        max_connections=connection_cap(settings.model_max_connections),
        max_reply_bytes=settings.model_max_reply_bytes,
    )


def check_background(settings: Settings) -> None:
    """Raises ``ValueError`` when ``AGENT_MODEL_BACKGROUND`` is on for a wire style without a
    background mode (only the Responses API has one: ``worker.model.background``)."""
    if settings.model_background and settings.openai_api_style != "responses":
        raise ValueError(
            f"AGENT_MODEL_BACKGROUND needs OPENAI_API_STYLE=responses ({settings.openai_api_style} has no background mode)"
        )
