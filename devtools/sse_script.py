"""A complete Responses API body replayed as the server-sent events the real API streams.

Used by the scripted gateway. Names and shapes follow the OpenAI Responses API reference,
"Streaming events": ``response.created`` and ``response.in_progress`` (the response with
``status: in_progress`` and no output), then per output item ``response.output_item.added``,
for a message ``response.content_part.added`` / ``response.output_text.delta`` (``item_id``,
``output_index``, ``content_index``, ``delta``, ``logprobs``) / ``response.output_text.done``
/ ``response.content_part.done``, for a function call
``response.function_call_arguments.delta`` / ``response.function_call_arguments.done``, then
``response.output_item.done``; last ``response.completed`` or ``response.incomplete`` with the
whole response. Every event has ``type`` and a ``sequence_number`` counting from 0.
"""

from __future__ import annotations

import copy
from typing import Any, Iterator


def _chunks(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def sse_events(response: dict[str, Any], *, chunk: int = 12) -> Iterator[dict[str, Any]]:
    """The events of ``response`` (a Responses API body), text and arguments cut into ``chunk``-character deltas."""
    seq = 0

    def ev(kind: str, **fields: Any) -> dict[str, Any]:
        nonlocal seq
        out = {"type": kind, "sequence_number": seq, **fields}
        seq += 1
        return out

    started = {**copy.deepcopy(response), "status": "in_progress", "output": [], "incomplete_details": None}
    yield ev("response.created", response=started)
    yield ev("response.in_progress", response=started)
    for idx, item in enumerate(response.get("output") or []):
        item_id = item.get("id", f"item_{idx}")
        if item.get("type") == "function_call":
            yield ev(
                "response.output_item.added", output_index=idx, item={**item, "arguments": "", "status": "in_progress"}
            )
            for piece in _chunks(item.get("arguments") or "", chunk):
                yield ev("response.function_call_arguments.delta", item_id=item_id, output_index=idx, delta=piece)
            yield ev(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=idx,
                name=item.get("name"),
                arguments=item.get("arguments", ""),
            )
        elif item.get("type") == "message":
            yield ev(
                "response.output_item.added", output_index=idx, item={**item, "content": [], "status": "in_progress"}
            )
            for ci, part in enumerate(item.get("content") or []):
                text = part.get("text", "")
                empty = {**part, "text": ""}
                yield ev("response.content_part.added", item_id=item_id, output_index=idx, content_index=ci, part=empty)
                for piece in _chunks(text, chunk):
                    yield ev(
                        "response.output_text.delta",
                        item_id=item_id,
                        output_index=idx,
                        content_index=ci,
                        delta=piece,
                        logprobs=[],
                    )
                yield ev(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=idx,
                    content_index=ci,
                    text=text,
                    logprobs=[],
                )
                yield ev("response.content_part.done", item_id=item_id, output_index=idx, content_index=ci, part=part)
        else:
            yield ev("response.output_item.added", output_index=idx, item=item)
        yield ev("response.output_item.done", output_index=idx, item=item)
    final = "response.incomplete" if response.get("status") == "incomplete" else "response.completed"
    yield ev(final, response=response)
