"""API tokens: created and revoked by an operator (``agent-runtime token ...``), stored hashed in
Redis, scoped to a list of agents or to all agents, each with its own rate limit.

A token is ``atr_<id>_<secret>`` (``id``: 8 hex characters, for listing and revoking; ``secret``:
32 random bytes, URL-safe base64). Only its SHA-256 is stored: the token is high-entropy, so a
fast hash is enough (no password stretching) and a lookup by hash leaks nothing useful through
timing. The clear token is shown once, at creation.

Keys (the control plane's Redis):

- ``api:token:<sha256 hex>`` hash: ``id``, ``name``, ``agents`` (JSON list, or ``*`` for all),
  ``rate``/``burst`` (empty: the API's defaults), ``created_at``, ``lower_approval`` (``1``: its
  turn requests may ask for less approval than the server's ``AGENT_APPROVAL_MODE``).
- ``api:tokens`` hash: ``id`` -> sha256 hex (listing, revoking).
- ``api:rate:<id>``: the token's GCRA state (theoretical arrival time, ms), expiring when idle.
- ``api:authfail:<client address>``: failed authentications from that address in the current
  window (a counter expiring with the window); at the limit, the address is refused with 429
  before any token is looked up, until the window ends.

``authenticate`` is one Lua script: the token lookup, the rate limit and (optionally) the agent
owning a turn, in one round trip per request. ``AuthenticatedScript`` runs the same checks and,
when they pass, another script in the same call (an enqueue: the turn's creation), for a token
this process has already seen (``TokenStore.known``).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from worker.redis_connection import RedisEndpoint, redis_endpoint
from worker.turn.keys import AGENT_FIELD, hash_key
from worker.turn.request import is_valid_id

PREFIX = "atr_"
TOKENS_KEY = "api:tokens"
ALL_AGENTS = "*"


def token_key(digest: str) -> str:
    return f"api:token:{digest}"


def rate_key(token_id: str) -> str:
    return f"api:rate:{token_id}"


def auth_fail_key(address: str) -> str:
    return f"api:authfail:{address[:100]}"


def digest(token: str) -> str:
    """SHA-256 hex of the clear token."""
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Token:
    """An authenticated token: ``agents`` is None for all agents, else the agent ids it covers."""

    id: str
    name: str
    agents: frozenset[str] | None
    rate: float | None = None
    burst: int | None = None
    created_at: float = 0.0
    lower_approval: bool = False  # may ask for less approval than AGENT_APPROVAL_MODE (an operator's grant)

    def covers(self, agent_id: str | None) -> bool:
        """True when this token may read and decide for ``agent_id``'s turns."""
        return agent_id is not None and (self.agents is None or agent_id in self.agents)

    def public(self) -> dict[str, Any]:
        """The record as listed (never the secret nor its hash)."""
        return {
            "id": self.id,
            "name": self.name,
            "agents": ALL_AGENTS if self.agents is None else sorted(self.agents),
            "rate": self.rate,
            "burst": self.burst,
            "created_at": self.created_at,
            "lower_approval": self.lower_approval,
        }

    @classmethod
    def from_fields(
        cls, tid: str, name: str, agents: str, rate: str, burst: str, created: str = "0", lower: str = ""
    ) -> "Token":
        scope = None if agents == ALL_AGENTS else frozenset(orjson.loads(agents))
        rate_, burst_ = float(rate) if rate else None, int(burst) if burst else None
        return cls(tid, name, scope, rate_, burst_, float(created or 0), lower == "1")


@dataclass(frozen=True)
class AuthResult:
    """What ``TokenStore.authenticate`` found: no ``token`` (unknown or revoked, or the client
    address is throttled: ``throttled_ms``, the time left); ``retry_after_ms`` above 0 when the
    token is over its rate; ``turn_agent``: the agent of the turn asked about (None: unknown turn,
    or none asked)."""

    token: Token | None
    retry_after_ms: int = 0
    turn_agent: str | None = None
    throttled_ms: int = 0  # above 0: the client address is over its failed authentications


# KEYS[1] token hash, KEYS[2] rate key, KEYS[3] the client address's failure counter, KEYS[4]
# (optional) turn hash (``worker.turn.keys.hash_key``). ARGV[1] default rate (per second), ARGV[2]
# default burst, ARGV[3] the turn hash's agent field, ARGV[4] failures allowed per window, ARGV[5]
# the window (ms). An address at its failures is refused before the lookup ({3, ms left}); an
# unknown token counts one failure ({0}).
# GCRA: each request moves the theoretical arrival time (tat) on by 1/rate; a request is allowed
# while tat - burst/rate <= now. Redis's clock (TIME) is the one clock of every API process.
_AUTH_BODY = """
local fails = tonumber(redis.call('GET', KEYS[3]) or '0')
if fails >= tonumber(ARGV[4]) then return {3, math.max(redis.call('PTTL', KEYS[3]), 1)} end
local rec = redis.call('HMGET', KEYS[1], 'id', 'name', 'agents', 'rate', 'burst', 'created_at', 'lower_approval')
if not rec[1] then
  if redis.call('INCR', KEYS[3]) == 1 then redis.call('PEXPIRE', KEYS[3], ARGV[5]) end
  return {0}
end
local rate = tonumber(rec[4]) or tonumber(ARGV[1])
local burst = tonumber(rec[5]) or tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local interval = 1000 / rate
local tat = tonumber(redis.call('GET', KEYS[2])) or now
if tat < now then tat = now end
local new_tat = tat + interval
local allow_at = new_tat - burst * interval
local owner = false
if #KEYS > 3 then owner = redis.call('HGET', KEYS[4], ARGV[3]) end
if allow_at > now then
  return {2, rec[1], rec[2], rec[3], rec[4] or '', rec[5] or '', rec[6] or '', math.ceil(allow_at - now), owner, rec[7] or ''}
end
redis.call('SET', KEYS[2], string.format('%.3f', new_tat), 'PX', math.ceil(new_tat - now) + 1000)
return {1, rec[1], rec[2], rec[3], rec[4] or '', rec[5] or '', rec[6] or '', 0, owner, rec[7] or ''}
"""
# As a Lua function of its own KEYS and ARGV (the names shadow the script's), for the scripts below.
_AUTH_FN = "local function authenticate(KEYS, ARGV)\n" + _AUTH_BODY + "end\n"
_AUTH_LUA = _AUTH_FN + "return authenticate(KEYS, ARGV)\n"

# ``authenticate``, then the script ``body`` (wrapped as a function of its own KEYS and ARGV) when
# the token passes and its record is the one the caller assumed. KEYS: the three of the auth
# script, then the body's. ARGV: the five of the auth script, the record's name, agents and
# lower_approval as assumed, then the body's. Returns the auth reply when it refuses (codes 0, 2,
# 3, as ``_AUTH_LUA``), {4, the auth reply...} when the record differs from the one assumed (the
# token passed and its request was counted against its rate; the body did not run), else
# {1, the body's reply...}.
_AUTHENTICATED = """
local auth = authenticate({KEYS[1], KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]})
if auth[1] ~= 1 then return auth end
if auth[3] ~= ARGV[6] or auth[4] ~= ARGV[7] or auth[10] ~= ARGV[8] then
  table.insert(auth, 1, 4)
  return auth
end
local bk, ba = {}, {}
for i = 4, #KEYS do bk[#bk + 1] = KEYS[i] end
for i = 9, #ARGV do ba[#ba + 1] = ARGV[i] end
local out = body(bk, ba)
table.insert(out, 1, 1)
return out
"""

KNOWN_TOKENS = 4096  # records kept per process (``TokenStore.known``); the oldest go first


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else ("" if v is None or v is False else str(v))


@dataclass(frozen=True)
class Known:
    """A token's record as last authenticated here (``TokenStore.known``): the ``token``, and its
    ``agents`` and ``lower_approval`` fields as stored (what ``AuthenticatedScript`` compares)."""

    token: Token
    agents: str
    lower_approval: str


class TokenStore:
    """Tokens in the Redis of ``client`` (a ``redis.Redis``; ``redis.asyncio.Redis`` for ``authenticate``)."""

    def __init__(self, client: Any):
        self.r = client
        self._auth = client.register_script(_AUTH_LUA)
        self._known: dict[str, Known] = {}  # token key (its digest) -> its record (``known``)

    # ----- operator side (sync) ----------------------------------------------
    def create(
        self,
        name: str,
        agents: list[str] | None,
        *,
        rate: float | None = None,
        burst: int | None = None,
        lower_approval: bool = False,
    ) -> tuple[str, Token]:
        """Create a token for ``agents`` (None: all agents). Returns ``(clear_token, record)``; the
        clear token is not stored anywhere. ``lower_approval``: its turn requests may ask for less
        approval than the server's ``AGENT_APPROVAL_MODE`` (an operator's explicit grant). Raises ``ValueError`` for an empty name, an invalid agent
        id, an empty agent list, or a non-positive rate/burst."""
        if not name or not name.strip() or len(name) > 100:
            raise ValueError("a token needs a name of 1-100 characters (who or what uses it)")
        if agents is not None:
            if not agents:
                raise ValueError("give at least one agent, or all agents")
            bad = [a for a in agents if not is_valid_id(a)]
            if bad:
                raise ValueError(f"invalid agent id {bad[0]!r}")
        if (rate is not None and rate <= 0) or (burst is not None and burst < 1):
            raise ValueError("rate must be > 0 and burst >= 1")
        tid = secrets.token_hex(4)
        clear = f"{PREFIX}{tid}_{secrets.token_urlsafe(32)}"
        h = digest(clear)
        scope = ALL_AGENTS if agents is None else orjson.dumps(sorted(set(agents))).decode()
        now = time.time()
        fields = {
            "id": tid,
            "name": name.strip(),
            "agents": scope,
            "rate": "" if rate is None else repr(float(rate)),
            "burst": "" if burst is None else str(int(burst)),
            "created_at": repr(now),
            "lower_approval": "1" if lower_approval else "",
        }
        with self.r.pipeline(transaction=True) as p:
            p.hset(token_key(h), mapping=fields)
            p.hset(TOKENS_KEY, tid, h)
            p.execute()
        return clear, Token.from_fields(
            tid, fields["name"], scope, fields["rate"], fields["burst"], fields["created_at"], fields["lower_approval"]
        )

    def revoke(self, token_id: str) -> bool:
        """Revoke the token with this id (effective on the next request). False if unknown."""
        h = self.r.hget(TOKENS_KEY, token_id)
        if h is None:
            return False
        with self.r.pipeline(transaction=True) as p:
            p.delete(token_key(_s(h)), rate_key(token_id))
            p.hdel(TOKENS_KEY, token_id)
            p.execute()
        return True

    def list(self) -> list[Token]:
        """Every token's record, oldest first."""
        out = []
        for _tid, h in self.r.hgetall(TOKENS_KEY).items():
            f = self.r.hmget(token_key(_s(h)), "id", "name", "agents", "rate", "burst", "created_at", "lower_approval")
            if f[0] is not None:
                out.append(Token.from_fields(*map(_s, f)))
        return sorted(out, key=lambda t: t.created_at)

    # ----- request side (async) ----------------------------------------------
    async def authenticate(
        self,
        token: str,
        *,
        rate: float,
        burst: int,
        turn_id: str | None = None,
        address: str = "unknown",
        failures: int = 60,
        window: float = 60.0,
    ) -> AuthResult:
        """Look the token up, apply its rate limit and, given ``turn_id``, read the turn's agent;
        one round trip. A token that is unknown (or not even shaped like one) counts a failure
        for the client ``address``; once it has ``failures`` within ``window`` seconds, every
        request from it is refused (``throttled_ms``) until the window ends. Raises
        ``redis.RedisError`` when Redis fails."""
        keys = _auth_keys(token, address)
        if turn_id is not None:
            keys.append(hash_key(turn_id))
        res = await self._auth(keys=keys, args=[rate, burst, AGENT_FIELD, failures, int(window * 1000)])
        found = _auth_result(res)
        if found.token is not None:
            self._remember(keys[0], Known(found.token, _s(res[3]), _s(res[9]) if len(res) > 9 else ""))
        return found

    def known(self, token: str) -> Known | None:
        """The record of ``token`` as this process last authenticated it, or None (never seen,
        or forgotten: at most ``KNOWN_TOKENS`` are kept). Only a guess: the token may have been
        revoked since; ``AuthenticatedScript`` checks it in Redis."""
        return self._known.get(_auth_keys(token, "")[0])

    def _remember(self, key: str, known: Known) -> None:
        if key not in self._known and len(self._known) >= KNOWN_TOKENS:
            del self._known[next(iter(self._known))]
        self._known[key] = known

    def forget(self, token: str) -> None:
        """Drop ``token``'s remembered record (``known``)."""
        self._known.pop(_auth_keys(token, "")[0], None)


def _auth_keys(token: str, address: str) -> list[str]:
    """The auth script's first three keys for a presented ``token`` (one not even shaped like a
    token looks up nothing and still counts a failure) from client ``address``."""
    parts = token[len(PREFIX) :].split("_", 1) if token.startswith(PREFIX) else []
    well_formed = len(parts) == 2 and len(token) <= 200
    return [
        token_key(digest(token) if well_formed else "-"),
        rate_key(parts[0] if well_formed else "-"),
        auth_fail_key(address),
    ]


def _auth_result(res: Any) -> AuthResult:
    """The auth script's reply (``_AUTH_LUA``) as an ``AuthResult``."""
    if res and res[0] == 3:
        return AuthResult(None, throttled_ms=int(res[1]))
    if not res or res[0] == 0:
        return AuthResult(None)
    tid, name, agents, rate_, burst_, created = (_s(x) for x in res[1:7])
    tok = Token.from_fields(tid, name, agents, rate_, burst_, created, _s(res[9]) if len(res) > 9 else "")
    owner = _s(res[8]) or None
    return AuthResult(tok, int(res[7]) if res[0] == 2 else 0, owner)


class AuthenticatedScript:
    """A script run in the same call as a token's checks (``TokenStore.authenticate``: failed
    authentications per address, the token, its rate): one round trip where the two took two.
    ``body``: the script's Lua text (it reads its own ``KEYS`` and ``ARGV``), registered on
    ``client`` (a ``redis.asyncio.Redis``)."""

    def __init__(self, client: Any, body: str):
        self._script = client.register_script(
            _AUTH_FN + "local function body(KEYS, ARGV)\n" + body + "\nend\n" + _AUTHENTICATED
        )

    async def run(
        self,
        token: str,
        assumed: Known,
        keys: list[str],
        args: list[Any],
        *,
        rate: float,
        burst: int,
        address: str = "unknown",
        failures: int = 60,
        window: float = 60.0,
    ) -> tuple[AuthResult | None, Any]:
        """Check ``token`` as ``TokenStore.authenticate`` does (the same arguments), and when it
        passes and its record is ``assumed`` (``TokenStore.known``'s), run the body with ``keys``
        and ``args``. Returns ``(None, the body's reply)`` when it ran; else ``(the refusal, None)``
        (an ``AuthResult`` without token, or over its rate), or ``(the token's check, None)`` when
        the record differs from ``assumed``: an ``AuthResult`` that passed (its token as stored
        now, this request already counted against its rate: do not authenticate it again), the
        body not run. Raises ``redis.RedisError``."""
        auth_args = [rate, burst, AGENT_FIELD, failures, int(window * 1000)]
        expected = [assumed.token.name, assumed.agents, assumed.lower_approval]
        res = await self._script(keys=[*_auth_keys(token, address), *keys], args=[*auth_args, *expected, *args])
        if res and res[0] == 4:
            return _auth_result(res[1:]), None
        if res and res[0] == 1:
            return None, res[1:]
        return _auth_result(res), None


def sync_client(endpoint: RedisEndpoint | str) -> redis.Redis:
    """A Redis client for the operator side (the CLI), on ``endpoint`` (a URL: through the settings'
    Sentinels and TLS files, ``worker.redis_connection``). Raises ``ValueError`` for a bad URL."""
    if isinstance(endpoint, str):
        endpoint = redis_endpoint(url=endpoint)
    return endpoint.client(socket_connect_timeout=5, socket_timeout=30)
