"""The scripted gateway's Chat Completions side: a Chat request read as Responses items, and a
scripted Responses body written as a ``chat.completion`` or as its ``chat.completion.chunk`` stream.

Wire shapes follow the OpenAI Chat Completions reference (the completion object, the chunk object,
``stream_options.include_usage``), which llama.cpp's server and vLLM's OpenAI-compatible server
also emit:

- a completion: ``id``, ``object: "chat.completion"``, ``created``, ``model``, ``choices`` (one:
  ``index``, ``message`` with ``role``, ``content`` (null when the model only calls tools),
  ``tool_calls`` (``id``, ``type: "function"``, ``function.name``, ``function.arguments``
  a string), ``refusal``; ``finish_reason`` ``stop`` | ``tool_calls`` | ``length``; ``logprobs``),
  ``usage`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and their ``*_details``);
- a stream: chunks with ``object: "chat.completion.chunk"`` and the same ``id``; the first delta
  carries ``role``; text comes as ``content`` pieces; each tool call's first fragment carries
  ``index``, ``id``, ``type`` and ``function.name`` with empty ``arguments``, the next fragments
  only ``index`` and ``function.arguments`` pieces; a chunk with an empty delta and the
  ``finish_reason``; with ``include_usage`` every chunk has ``usage: null`` and a last chunk has
  empty ``choices`` and the usage; the stream ends with ``data: [DONE]``.
"""

from __future__ import annotations

from typing import Any, Iterator


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def assistant_turns(messages: list[dict[str, Any]]) -> int:
    """How many assistant messages the request holds: the scripted step to answer (every step the
    gateway played comes back as exactly one assistant message)."""
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "assistant")


def history_problem(messages: list[dict[str, Any]]) -> str | None:
    """The error a real server gives for broken tool-call pairing, or None."""
    pending: list[str] = []
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role == "tool":
            cid = m.get("tool_call_id")
            if cid not in pending:
                return "Invalid parameter: messages with role 'tool' must be a response to a preceding message with 'tool_calls'."
            pending.remove(cid)
            continue
        if pending:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
                f"'tool_call_id'. The following tool_call_ids did not have response messages: {', '.join(pending)}"
            )
        if role == "assistant":
            pending = [str(c.get("id")) for c in m.get("tool_calls") or [] if isinstance(c, dict)]
    if pending:
        return f"The following tool_call_ids did not have response messages: {', '.join(pending)}"
    return None


def responses_view(body: dict[str, Any]) -> dict[str, Any]:
    """A Chat request body seen as a Responses request (``model``, ``instructions``, ``input``
    items, function ``tools``, ``stream``, ``max_output_tokens``, and ``wire: "chat"``), so scripts
    and tests read one format whichever wire the client spoke."""
    items: list[dict[str, Any]] = []
    system: list[str] = []
    for m in body.get("messages") or []:
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text(m.get("content")))
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id"), "output": m.get("content")})
        elif role == "assistant":
            if m.get("content"):
                items.append({"type": "message", "role": "assistant", "content": _text(m["content"])})
            for c in m.get("tool_calls") or []:
                fn = c.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": c.get("id"),
                        "name": fn.get("name"),
                        "arguments": fn.get("arguments"),
                    }
                )
        else:
            items.append({"type": "message", "role": "user", "content": m.get("content")})
    tools = [{"type": "function", **(t.get("function") or {})} for t in body.get("tools") or []]
    return {
        "wire": "chat",
        "model": body.get("model"),
        "instructions": "\n\n".join(system) or None,
        "input": items,
        "tools": tools,
        "stream": body.get("stream"),
        "max_output_tokens": body.get("max_completion_tokens") or body.get("max_tokens"),
    }


def _usage(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)},
        "completion_tokens_details": {
            "reasoning_tokens": (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
        },
    }


def _parts(response: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], str]:
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in response.get("output") or []:
        if item.get("type") == "function_call":
            fn = {"name": item.get("name"), "arguments": item.get("arguments", "")}
            calls.append({"id": item.get("call_id"), "type": "function", "function": fn})
        elif item.get("type") == "message":
            texts.append(_text(item.get("content")))
    if response.get("status") == "incomplete":
        finish = "length"
    else:
        finish = "tool_calls" if calls else "stop"
    return ("".join(texts) or None), calls, finish


def _completion_id(response: dict[str, Any]) -> str:
    return "chatcmpl-" + str(response.get("id", "")).removeprefix("resp_")


def chat_completion(response: dict[str, Any]) -> dict[str, Any]:
    """A scripted Responses body as a ``chat.completion`` object."""
    text, calls, finish = _parts(response)
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": _completion_id(response),
        "object": "chat.completion",
        "created": response.get("created_at", 0),
        "model": response.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": _usage(response.get("usage") or {}),
    }


def _pieces(text: str, size: int) -> list[str]:
    size = max(1, size)
    return [text[i : i + size] for i in range(0, len(text), size)]


def chat_chunks(response: dict[str, Any], *, chunk: int = 12) -> Iterator[tuple[bool, dict[str, Any]]]:
    """The stream of ``response`` as ``(is_delta, chunk)`` pairs (``is_delta`` for a chunk carrying
    a text or arguments piece), text and arguments cut into ``chunk``-character pieces."""
    text, calls, finish = _parts(response)
    head = {"id": _completion_id(response), "object": "chat.completion.chunk", "created": response.get("created_at", 0),
            "model": response.get("model"), "system_fingerprint": None}  # fmt: skip

    def one(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**head, "choices": [choice], "usage": None}

    yield False, one({"role": "assistant", "content": ""})
    for piece in _pieces(text or "", chunk):
        yield True, one({"content": piece})
    for index, call in enumerate(calls):
        first = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        yield False, one({"tool_calls": [first]})
        for piece in _pieces(call["function"]["arguments"] or "", chunk):
            yield True, one({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield False, one({}, finish)
    yield False, {**head, "choices": [], "usage": _usage(response.get("usage") or {})}
