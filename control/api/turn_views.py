"""What the pages show of a turn, read from the control plane (plain data for the templates, which
escape everything: model text and tool outputs are untrusted and rendered as text only).

- ``approval_card``: a waiting call with its whole context: the model's text of the reply that
  asked for it, its batch (every call of that reply: run with its output, waiting for a
  decision, approved and waiting, rejected, or to run after the decisions), the repaired
  arguments that will run and the raw ones the model sent, who enqueued the turn and when;
- ``transcript``: a turn's items in order (messages, tool calls with their outputs), the calls of
  its current step not yet in the items (run, running, waiting), its approvals and its usage.
"""

from __future__ import annotations

import json
from typing import Any

from control.client import ControlPlane
from worker.turn.approvals import ApprovalRecord
from worker.turn.dispatch import Plan

OUTPUT_SHOWN = 4000  # characters of a call's output shown (the transcript and the cards)
DESTRUCTIVE_HINT = "destructive"


def text_of(content: Any) -> str:
    """An item's ``content`` (a string, or a list of text parts) as plain text."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text") or p.get("refusal") or "") for p in content if isinstance(p, dict))
    return ""


def pretty(data: Any) -> str:
    """JSON pretty-printed (sorted keys, two-space indent, non-ASCII kept)."""
    return json.dumps(data, indent=2, ensure_ascii=False, sort_keys=True)


def turn_input(request: dict[str, Any]) -> str:
    """The user's input of a turn request, as text."""
    given = request.get("input")
    if isinstance(given, str):
        return given
    return "\n\n".join(text_of(i.get("content")) for i in given or [] if i.get("role") in ("user", None))


def asking_text(items: list[dict[str, Any]], call_id: str) -> str:
    """The model's text in the reply that emitted ``call_id``: the assistant messages between the
    previous tool output (or the start) and that call."""
    at = next(
        (n for n, i in enumerate(items) if i.get("type") == "function_call" and i.get("call_id") == call_id), None
    )
    if at is None:
        return ""
    texts: list[str] = []
    for item in reversed(items[:at]):
        kind = item.get("type", "message")
        if kind == "function_call_output" or (kind == "message" and item.get("role") == "user"):
            break
        if kind == "message" and item.get("role") == "assistant":
            texts.insert(0, text_of(item.get("content")))
    return "\n".join(t for t in texts if t)


def _raw_arguments(items: list[dict[str, Any]]) -> dict[str, str]:
    return {i["call_id"]: str(i.get("arguments", "")) for i in items if i.get("type") == "function_call"}


def batch_of(control: ControlPlane, turn_id: str, step: int, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every call of step ``step`` in emitted order: ``call_id``, ``name``, ``activity``,
    ``state`` (``ran``, ``failed``, ``pending``, ``approved``, ``rejected``, ``waiting``, ``invalid``),
    ``output`` (text, cut at ``OUTPUT_SHOWN``), ``arguments`` (pretty repaired), ``raw`` (as the model
    sent them), ``repairs``, ``destructive``, ``by``, ``decided_at``, ``reason``."""
    plan: Plan | None = control.store.plan(turn_id, step)
    if plan is None:
        return []
    results = control.store.results(turn_id, step)
    records: dict[str, ApprovalRecord] = control.store.approvals.records(turn_id, step)
    raw = _raw_arguments(items)
    out = []
    for call in plan.calls:
        rec = records.get(call.call_id)
        result = results.get(call.call_id)
        row: dict[str, Any] = {
            "call_id": call.call_id,
            "name": call.name,
            "activity": call.activity,
            "arguments": pretty(call.data) if call.data is not None else "",
            "raw": raw.get(call.call_id, ""),
            "repairs": list(call.repairs),
            "destructive": call.destructive,
            "output": "",
            "by": rec.by if rec else None,
            "decided_at": rec.decided_at if rec else None,
            "reason": rec.reason if rec else None,
        }
        if not call.runnable:
            row.update(state="invalid", output=(call.output or "")[:OUTPUT_SHOWN])
        elif result is not None:
            row.update(state="failed" if result.is_error else "ran", output=result.output[:OUTPUT_SHOWN])
        elif rec is not None:
            row["state"] = rec.status  # pending, approved (waits for its batch), rejected
        else:
            row["state"] = "waiting"  # runs once the decisions before it are made
        out.append(row)
    return out


def approval_card(control: ControlPlane, rec: dict[str, Any], cache: dict[str, Any]) -> dict[str, Any]:
    """One card of the approvals page: the record (``ApprovalRecord.public``) plus ``key``,
    ``turn_input``, ``asking`` (the model's text of that reply), ``batch`` (``batch_of``, this call
    marked ``self``), ``pretty`` (the arguments that will run), ``raw``, ``enqueued_by``,
    ``created_at``, ``destructive``. ``cache`` holds one turn's reads across its cards."""
    tid, step = rec["turn_id"], rec["step"]
    if tid not in cache:
        state = control.store.load(tid)
        cache[tid] = {"state": state, "items": control.items(tid), "batches": {}}
    turn = cache[tid]
    state, items = turn["state"], turn["items"]
    if step not in turn["batches"]:
        turn["batches"][step] = batch_of(control, tid, step, items)
    batch = [{**row, "self": row["call_id"] == rec["call_id"]} for row in turn["batches"][step]]
    mine = next((row for row in batch if row["self"]), None)
    request = state.request if state else {}
    return {
        **rec,
        "key": f"{tid}/{rec['call_id']}",
        "pretty": pretty(rec["arguments"]),
        "raw": mine["raw"] if mine else "",
        "repairs": mine["repairs"] if mine else [],
        "destructive": bool(mine and mine["destructive"]),
        "turn_input": turn_input(request),
        "asking": asking_text(items, rec["call_id"]),
        "batch": batch,
        "others_pending": sum(1 for row in batch if not row["self"] and row["state"] == "pending"),
        "enqueued_by": str((request.get("metadata") or {}).get("enqueued_by") or ""),
        "created_at": state.created_at if state else 0.0,
    }


def transcript(control: ControlPlane, turn_id: str) -> dict[str, Any]:
    """A turn for the transcript page: ``state`` (``TurnState``), ``input``, ``entries`` (items in
    order: ``{"kind": "message"|"call", ...}``, a call with its output; a call of the current step
    without its output item yet also has ``state``, ``activity`` and any output from ``batch_of``),
    ``approvals`` (the records of every step, decided or pending), ``usage`` (totals and per model
    call). The last message is left out when it is the final answer (shown as such)."""
    state = control.store.load(turn_id)
    items = control.items(turn_id)
    outputs = {i.get("call_id"): i.get("output") for i in items if i.get("type") == "function_call_output"}
    entries: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in ("assistant", "user"):
            entries.append({"kind": "message", "role": item["role"], "text": text_of(item.get("content"))})
        elif kind == "function_call":
            output = outputs.get(item.get("call_id"))
            entries.append(
                {
                    "kind": "call",
                    "call_id": item.get("call_id"),
                    "name": item.get("name"),
                    "raw": str(item.get("arguments", "")),
                    "output": None if output is None else text_of(output)[:OUTPUT_SHOWN],
                }
            )
    approvals: list[dict[str, Any]] = []
    if state is not None:
        live = {c["call_id"]: c for c in batch_of(control, turn_id, state.step, items)}
        for entry in entries:  # a call of the current step without its output item yet: its state now
            if entry["kind"] == "call" and entry["output"] is None and entry["call_id"] in live:
                row = live[entry["call_id"]]
                entry.update(state=row["state"], activity=row["activity"], output=row["output"] or None)
        for step in range(state.step + 1):
            approvals += [r.public() for r in control.store.approvals.records(turn_id, step).values()]
        last = entries[-1] if entries else None
        if state.final_output and last and last["kind"] == "message" and last["text"] == state.final_output:
            entries.pop()  # shown as the final answer
    return {
        "state": state,
        "input": turn_input(state.request) if state else "",
        "entries": entries,
        "approvals": sorted(approvals, key=lambda r: r["requested_at"]),
        "usage": control.usage(turn_id) if state else {},
    }
