"""The turn key scheme: the name of every Redis key a turn's state lives in.

Part of the store (``worker.turn.store`` and its parts ``claims``, ``memo``, ``approvals``,
``usage``, ``guard``): only those modules read or write these keys, so a change to a key's layout
touches the store and its tests only (``tests/unit/turn/test_store_owns_keys.py`` fails when another module
names a turn key or reaches the store's client).

The keys (``{id}`` is the turn id; the braces keep a turn's keys in one Redis Cluster slot):

- ``turn:{id}`` hash: ``status``, ``step``, ``phase`` (``model`` | ``tools``),
  ``model_calls``, ``request`` (JSON), ``agent_id``, ``final_output``,
  ``error``, ``terminate``, ``invalid_counts`` (JSON), ``loaded_tools``
  (JSON), ``created_at``/``updated_at`` (epoch seconds), ``deadline`` (the progress deadline
  the last transition set in ``turns:watch``, epoch seconds; other writers only push the watch's
  later, so a step's claim need not push it when its lease ends before), ``redrives``,
  ``traceparent`` (the turn's trace, ``worker.turn.telemetry``), ``layout`` (the layout mark,
  below), and in layout 2: ``usage:{n}`` (step n's usage record, what ``turn:{id}:usage`` holds
  for a turn of layout 1) and ``memo`` (the number of the step whose reply is memoized in
  ``turn:{id}:reply:{n}``, written only when the reply did not move the turn on in its own script),
  ``plan`` and ``plan_step`` (the plan of the last step that moved to its tools asking no approval,
  and that step's number: ``turn:{id}:plan:{n}`` holds the others'), ``results_step`` (a one-call
  step some of whose results are stored in ``turn:{id}:results:{n}``: it is not closed without them;
  a one-call step closed by its result, without one stored, keeps none there).
- The layout mark, the hash's ``layout``, written at creation and never changed: absent (layout 1)
  for a turn created by an earlier version, ``2`` (``LAYOUT``) since. Every script that reads a step's
  memo or usage reads the mark with the hash it reads anyway and keeps a layout-1 turn on its own
  keys: a turn in flight across an upgrade finishes as it started. ``AGENT_TURN_LAYOUT=1`` makes a
  process create layout-1 turns (while workers of an earlier version still run: they know layout 1
  only; docs/architecture.md, "Commands per turn").
- ``turn:{id}:usage`` (layout 1) hash step -> token usage of that model call (``worker.turn.usage``,
  ``UsageLedger``, held as ``store.usage``); it expires with the turn's hash, when the turn ends
  (a step's record no longer sets its expiry).
- ``turn:{id}:items`` list: the Responses input items (JSON), in order.
- ``turn:{id}:reply:{n}``: the memoized model reply of step n (a crash
  never pays for the same tokens twice; written by ``worker.turn.memo``, held as ``store.memo``).
  In layout 2 it is written only when the reply's own script did not move the turn on (then the
  hash's ``memo`` names the step, and a step's claim reads the key only when it does): a reply
  whose move (to the tools phase, or the turn's end) is applied with it needs no memo, since every
  later delivery of the step is fenced out by the move.
- ``turn:{id}:response:{n}``: the id of the background response step n's call started
  (``worker.model.background``; written by ``worker.turn.memo``), so that a re-driven step
  fetches it instead of paying for a new one.
- ``turn:{id}:plan:{n}``: the dispatch plan of step n (calls and batches); in layout 2 only for a
  step that asks approvals (the others' plan is the hash's ``plan``).
- ``turn:{id}:results:{n}`` hash ``call_id`` -> result JSON (first write wins).
- ``turn:{id}:claims:{n}`` hash ``call_id`` -> claim JSON (owner, lease end).
- ``turn:{id}:start:{n}`` hash ``call_id`` -> the end of its ``call_started`` event: written by
  earlier versions for the calls a tool-call task claims with its first read, now carried by each
  call's message (``Plan.started_at_once``); read only for a message that carries nothing.
- ``turn:{id}:stepclaim:{n}``: the owner making step n's model call (one model call per step).
- ``turn:{id}:adv:{n}:{b}``: set once by whoever completes batch b (the barrier); not written when
  a one-call batch's result is stored with the step's closing writes (nothing can close it twice).
- ``turn:{id}:events`` stream: activity events for the control plane.
- ``turn:{id}:cancel``: the cancel flag (tools' abort probe); also the turn hash's ``cancel``
  field (``1``), which the step and call scripts read with the hash, and ``turns:cancels``.
- ``turns:cancels`` sorted set: turn id scored by when its cancel was asked, kept
  ``CANCELS_KEPT`` seconds: a node's watch over its model calls in flight reads it once for all.
- ``turns:watch`` sorted set: turn id scored by its progress deadline (watchdog).
- ``turn:{id}:approvals:{n}``, ``turn:{id}:gate:{n}:{b}``, ``approvals:pending``: approvals,
  written by ``worker.turn.approvals`` (``ApprovalRecords``, held as ``store.approvals``).
- ``turns:finishing`` sorted set: ended turns whose end hooks (workflow attempt, background job)
  have not reported done.
- ``turn-idem:<agent_id>:<key>``: an agent's idempotency key -> turn id (per agent: agent ids
  cannot contain ``:``, so two agents never share a key).
- ``turns:index`` and ``turns:index:<agent_id>`` sorted sets: every turn id (of every agent, of
  one agent) scored by its ``created_at``, for listing turns (``worker.turn.listing``) and an
  agent's most recent turns; added at creation. Entries older than twice the retention are pruned
  by the watchdog's sweep (every turn's) and at one creation in ``guard.PRUNE_EVERY`` (the agent's,
  which expires twice the retention after its newest turn). Earlier versions also kept an agent's
  turns in a list ``agent:<agent_id>:turns``, no longer written nor read (a leftover one never
  expired: it may be deleted).

Readers outside the store that need a key as an opaque name (the HTTP control plane's asyncio
client follows a turn's event stream; its token check reads a turn's owner in its own script) take
it from the functions below marked "for readers", never by building it.
"""

from __future__ import annotations

import os
from typing import Final

WATCH_KEY: Final = "turns:watch"
"""Sorted set: turn id scored by its progress deadline (the watchdog's re-drives)."""
CANCELS_KEY: Final = "turns:cancels"
"""Sorted set: turns whose cancel was asked, scored by when (epoch s), for ``CANCELS_KEPT`` s."""
CANCELS_KEPT: Final = 600
"""Seconds a cancel stays in ``CANCELS_KEY``: far more than a node's watch takes between two reads
(a second); a call that missed it still ends at its step boundary, which reads the flag."""
FINISHING_KEY: Final = "turns:finishing"
"""Sorted set: ended turns whose end hooks have not reported done, scored by their deadline."""
PENDING_APPROVALS_KEY: Final = "approvals:pending"
"""Sorted set: turns parked on approvals, scored by their earliest approval deadline. For readers
(the approvals change feed)."""
LAYOUT: Final = 2
"""The key layout of the turns this version creates (the hash's ``layout``; see the module docstring)."""
AGENT_FIELD: Final = "agent_id"
"""The field of a turn's hash naming its agent. For readers (the HTTP API's token check)."""


def key(turn_id: str, *parts: str | int) -> str:
    """A turn's key: ``turn:{<id>}`` plus ``:``-joined parts (the braces keep a turn's keys in
    one Redis Cluster slot). For the store's modules only."""
    return ":".join([f"turn:{{{turn_id}}}", *map(str, parts)])


def idem_key(agent_id: str, idempotency_key: str) -> str:
    """An agent's idempotency key -> turn id (per agent: agent ids cannot contain ``:``)."""
    return f"turn-idem:{agent_id}:{idempotency_key}"


def index_key(agent_id: str | None) -> str:
    """The index of turns by creation time: of one agent, or (None) of every agent."""
    return "turns:index" if agent_id is None else f"turns:index:{agent_id}"


def hash_key(turn_id: str) -> str:
    """For readers: the turn's hash (``status``, ``step``, ``phase``, ``agent_id``...)."""
    return key(turn_id)


def events_key(turn_id: str) -> str:
    """For readers: the turn's event stream (entries ``{"e": <event JSON>}``)."""
    return key(turn_id, "events")


def creation_layout() -> int:
    """The layout a turn created now gets: ``LAYOUT``, or 1 with ``AGENT_TURN_LAYOUT=1`` (a
    deployment whose workers of an earlier version still run)."""
    return 1 if os.environ.get("AGENT_TURN_LAYOUT", "").strip() == "1" else LAYOUT


def usage_field(step: int) -> str:
    """The turn hash's field of step ``step``'s usage record (layout 2)."""
    return f"usage:{step}"
