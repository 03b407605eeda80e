"""Settings of the HTTP control plane, from the environment (prefix ``AGENT_API_``).

Redis comes from ``CONTROL_REDIS_URL`` (else ``REDIS_URL``), as for ``control.client.ControlPlane``.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ApiSettings(BaseSettings):
    """Knobs of ``control.api``. Units: bytes, seconds, requests per second. Variables:
    ``AGENT_API_HOST``, ``AGENT_API_PORT``, ``AGENT_API_MAX_BODY_BYTES``, ``AGENT_API_RATE``,
    ``AGENT_API_BURST``, ``AGENT_API_MAX_STREAMS_PER_TOKEN``, ``AGENT_API_AUTH_FAILURES``,
    ``AGENT_API_AUTH_FAILURE_WINDOW``, ``AGENT_API_HEARTBEAT``, ``AGENT_API_RETRY_AFTER``."""

    model_config = SettingsConfigDict(env_prefix="AGENT_API_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8700, ge=0, le=65535)
    # A request body over this is refused with 413 before it is parsed (the turn request's own
    # cap, AGENT_MAX_INPUT_BYTES, applies after parsing).
    max_body_bytes: int = Field(2_000_000, ge=1024)
    # Per token: a sustained rate and a burst (GCRA, one Redis script with the token lookup).
    # A token created with its own rate/burst uses those.
    rate: float = Field(20.0, gt=0)
    burst: int = Field(40, ge=1)
    # Event streams (turns' events and approvals feeds together) one token may hold open in one
    # API process.
    max_streams_per_token: int = Field(32, ge=1)
    # Failed authentications (unknown tokens) one client address may make per window (seconds)
    # before every request from it answers 429 until the window ends.
    auth_failures: int = Field(60, ge=1)
    auth_failure_window: float = Field(60.0, gt=0)
    # Seconds between keep-alive comments on an idle event stream (proxies close silent ones).
    heartbeat: float = Field(15.0, gt=0)
    # Retry-After (seconds) sent with 503 while Redis does not answer.
    retry_after: int = Field(2, ge=1)
