"""Token usage of a turn, per model step and in total, and the turn's token budgets.

The Responses API reports ``usage`` on every reply: ``input_tokens``, ``output_tokens``,
``total_tokens``, ``input_tokens_details.cached_tokens`` and
``output_tokens_details.reasoning_tokens`` (OpenAI API reference, "The response object").
``UsageLedger`` keeps one record per step, in the hash ``turn:{id}:usage`` (field = step
number) for a turn created before the layout mark, in the turn hash's ``usage:{n}`` fields for
one created since (``worker.turn.keys``); first write wins, like the memoized reply it comes
from (or the step's move, written with it once), so a redelivered step never counts its tokens
twice; totals are the sum of the steps.
"""

from __future__ import annotations

from typing import Any

import orjson
import redis

from worker.turn.keys import key as _k
from worker.turn.keys import usage_field
from worker.turn.request import TokenBudget

USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "cached_tokens", "reasoning_tokens")
RETENTION_SECONDS = 7 * 24 * 3600


def _count(value: Any) -> int:
    # A gateway may omit a count or send null: that is 0, never an error (usage is advisory).
    return value if isinstance(value, int) and value >= 0 else 0


def normalize_usage(raw: dict[str, Any] | None) -> dict[str, int]:
    """The five counts of a Responses ``usage`` object, flattened: ``input_tokens``, ``output_tokens``,
    ``total_tokens`` (``input + output`` when absent), ``cached_tokens``, ``reasoning_tokens``.

    A missing or malformed count reads as 0.
    """
    raw = raw if isinstance(raw, dict) else {}
    in_details = raw.get("input_tokens_details")
    out_details = raw.get("output_tokens_details")
    in_details = in_details if isinstance(in_details, dict) else {}
    out_details = out_details if isinstance(out_details, dict) else {}
    inp, out = _count(raw.get("input_tokens")), _count(raw.get("output_tokens"))
    return {
        "input_tokens": inp,
        "output_tokens": out,
        "total_tokens": _count(raw.get("total_tokens")) or inp + out,
        "cached_tokens": _count(in_details.get("cached_tokens")),
        "reasoning_tokens": _count(out_details.get("reasoning_tokens")),
    }


def add_usage(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Field-wise sum of two normalized usages."""
    return {f: a.get(f, 0) + b.get(f, 0) for f in USAGE_FIELDS}


def budget_exceeded(totals: dict[str, int], budget: TokenBudget | None) -> str | None:
    """The error text when ``totals`` reached a limit of ``budget`` (``>=``: a turn at its budget
    may not start another model call), else None."""
    if budget is None:
        return None
    for field in ("input_tokens", "output_tokens", "total_tokens"):
        limit = getattr(budget, field)
        if limit is not None and totals.get(field, 0) >= limit:
            return (
                f"token budget exceeded: {totals.get(field, 0)} {field.replace('_', ' ')} used, "
                f"budget {limit} (token_budget.{field})"
            )
    return None


# Record step ARGV[1]'s usage once and read the turn's records back, in the layout the turn hash's
# mark names (``keys``): layout 2, the hash's ``usage:{n}`` fields (only on a turn that exists);
# layout 1, the usage hash (which expires with the turn; a record made after its end sets it).
# KEYS: turn hash, usage hash; ARGV: step, row, ttl ('' as row: read only). Returns {stored, rows}.
_RECORD_LUA = """
local layout = redis.call('HGET', KEYS[1], 'layout')
if layout == '2' then
  local stored = 0
  if ARGV[2] ~= '' then stored = redis.call('HSETNX', KEYS[1], 'usage:' .. ARGV[1], ARGV[2]) end
  local h, rows = redis.call('HGETALL', KEYS[1]), {}
  for i = 1, #h, 2 do
    if string.sub(h[i], 1, 6) == 'usage:' then rows[#rows + 1] = h[i + 1] end
  end
  return {stored, rows}
end
local stored = 0
if ARGV[2] ~= '' then
  stored = redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return {stored, redis.call('HVALS', KEYS[2])}
"""


class UsageLedger:
    """Per-step usage records of turns in Redis (``client``: a ``redis.Redis``, bytes responses):
    the usage hash of a layout-1 turn, the turn hash's ``usage:{n}`` fields of a layout-2 one
    (``worker.turn.keys``)."""

    def __init__(self, client: redis.Redis):
        self._r = client
        self._record = client.register_script(_RECORD_LUA)

    def record_and_total(
        self, turn_id: str, step: int, usage: dict[str, int], model: str = ""
    ) -> tuple[bool, dict[str, int]]:
        """Record the usage of model step ``step`` once, and read the turn's totals after it (as
        ``totals``), in one round trip. Returns ``(stored, totals)``: ``stored`` is False for a
        redelivery, already counted."""
        _, row = self.row(step, usage, model)
        stored, rows = self._record(keys=[_k(turn_id), _k(turn_id, "usage")], args=[step, row, RETENTION_SECONDS])
        return self.totals_of(bool(stored), rows)

    @staticmethod
    def row(step: int, usage: dict[str, int], model: str = "", *, layout: int = 1) -> tuple[str, bytes]:
        """Step ``step``'s record as its field and value: in the turn's usage hash (layout 1), or in
        the turn hash (layout 2, ``keys.usage_field``), for ``ReplyMemo.save_and_check``."""
        field = usage_field(step) if layout >= 2 else str(step)
        return field, orjson.dumps({"step": step, "model": model, **usage})

    @staticmethod
    def totals_of(stored: bool, rows: list[bytes]) -> tuple[bool, dict[str, int]]:
        """``(stored, totals)`` from a record's outcome and the turn's usage rows read after it."""
        return stored, _sum([orjson.loads(v) for v in rows])

    def steps(self, turn_id: str) -> list[dict[str, Any]]:
        """``[{"step", "model", input_tokens, output_tokens, total_tokens, cached_tokens, reasoning_tokens}]``
        ordered by step."""
        _, raw = self._record(keys=[_k(turn_id), _k(turn_id, "usage")], args=[0, "", RETENTION_SECONDS])
        rows = [orjson.loads(v) for v in raw]
        return sorted(rows, key=lambda r: r["step"])

    def totals(self, turn_id: str) -> dict[str, int]:
        """The turn's total usage so far (all five counts, plus ``model_calls`` counted)."""
        return _sum(self.steps(turn_id))


def _sum(rows: list[dict[str, Any]]) -> dict[str, int]:
    total = {f: 0 for f in USAGE_FIELDS}
    for row in rows:
        total = add_usage(total, row)
    return {**total, "model_calls": len(rows)}
