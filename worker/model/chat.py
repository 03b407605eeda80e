"""The Chat Completions API as a wire format: ``CHAT`` (``worker.model.wire_format.WireFormat``).

For servers that speak only ``POST /chat/completions`` (llama.cpp's server, LM Studio, vLLM,
Ollama, most proxies). The turn keeps its history in the Responses item format; this module maps
it at the edge, both ways (docs/architecture.md, "Model clients"):

Request (``chat_body``):
- ``instructions`` and ``system``/``developer`` messages -> ``system`` messages (open servers'
  chat templates know ``system``; not all know ``developer``);
- ``message`` items -> ``user``/``assistant`` messages (text parts joined; ``input_image`` ->
  an ``image_url`` part);
- consecutive ``function_call`` items (with the assistant text before them) -> one ``assistant``
  message with ``tool_calls`` (``id`` = ``call_id``, ``arguments`` verbatim);
- ``function_call_output`` -> a ``tool`` message (``tool_call_id`` = ``call_id``);
- ``reasoning`` items are dropped (Chat has no place for them);
- function tools -> ``{"type": "function", "function": {name, description, parameters, strict}}``
  (``parameters`` left out when the tool has none: Chat reads that as a function without arguments);
  a namespace's tools are flattened into top-level functions (tool names are unique per turn);
  any other tool type raises ``ChatMappingError``;
- ``max_output_tokens`` -> ``max_tokens`` (the name llama.cpp, vLLM, Ollama and OpenAI all
  accept); ``metadata`` is not sent (Chat stores it only with ``store``, and strict servers refuse
  unknown fields).

Reply (``reply_from_completion``): ``choices[0].message`` -> a ``message`` item (text) then one
``function_call`` item per ``tool_calls`` entry (``call_id`` = its ``id``, ``arguments`` kept as
sent, for the repair ladder; an object is JSON-encoded); ``usage`` ``prompt_tokens`` /
``completion_tokens`` / ``total_tokens`` (and their ``*_details``) -> the Responses names;
``finish_reason: "length"`` -> status ``incomplete``, reason ``max_output_tokens``
(``content_filter`` -> reason ``content_filter``), so the output-token limit rule holds.

Streaming: ``stream: true`` with ``stream_options.include_usage``; chunks are
``chat.completion.chunk`` objects whose ``choices[0].delta`` carries ``content`` pieces and
``tool_calls`` fragments keyed by ``index`` (``id`` and ``function.name`` in the first fragment,
``function.arguments`` in pieces), then a chunk with ``finish_reason``, a usage chunk with empty
(or null) ``choices``, and ``data: [DONE]``. Output items are numbered in order of first
appearance; each piece goes to ``on_delta`` as the Responses client reports it.

Failures (``GatewayError``): as ``worker.model.responses``; a stream that ends without a
``finish_reason`` is retryable, an ``error`` object in the stream is retryable unless its type
says the request is wrong.
"""

from __future__ import annotations

from typing import Any

import orjson

from worker.model.interface import Delta, GatewayError, ModelReply, ModelRequest, OnDelta
from worker.model.wire_format import WireFormat

_TEXT_PARTS = ("input_text", "output_text", "text", "refusal")
_FATAL_TYPES = {"invalid_request_error", "authentication_error", "BadRequestError", "NotFoundError"}


class ChatMappingError(ValueError):
    """A request item or tool has no Chat Completions form (the message names it)."""


# ---- request: Responses items -> Chat messages ------------------------------------------------


def _parts_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") in _TEXT_PARTS)


def _user_content(content: Any) -> str | list[dict[str, Any]]:
    if isinstance(content, str) or not isinstance(content, list):
        return _parts_text(content)
    if not any(isinstance(p, dict) and p.get("type") == "input_image" for p in content):
        return _parts_text(content)
    parts: list[dict[str, Any]] = []
    for p in content:
        if not isinstance(p, dict):
            continue
        if p.get("type") == "input_image":
            url = p.get("image_url")
            if not url:
                raise ChatMappingError("an input_image without image_url has no Chat Completions form")
            parts.append({"type": "image_url", "image_url": {"url": url, "detail": p.get("detail", "auto")}})
        elif p.get("type") in _TEXT_PARTS:
            parts.append({"type": "text", "text": str(p.get("text", ""))})
        else:
            raise ChatMappingError(f"a {p.get('type')!r} content part has no Chat Completions form")
    return parts


def chat_messages(items: list[dict[str, Any]], instructions: str | None = None) -> list[dict[str, Any]]:
    """The Chat ``messages`` for Responses input ``items`` (module docstring gives the rules).

    Raises ``ChatMappingError`` for an item type that has no Chat form."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    open_assistant: dict[str, Any] | None = None  # the assistant message that later calls join

    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role == "assistant":
                open_assistant = {"role": "assistant", "content": _parts_text(item.get("content"))}
                messages.append(open_assistant)
                continue
            open_assistant = None
            if role in ("system", "developer"):
                messages.append({"role": "system", "content": _parts_text(item.get("content"))})
            else:
                messages.append({"role": "user", "content": _user_content(item.get("content"))})
        elif kind == "function_call":
            if open_assistant is None:
                open_assistant = {"role": "assistant", "content": None}
                messages.append(open_assistant)
            call = {"name": item.get("name", ""), "arguments": item.get("arguments", "")}
            open_assistant.setdefault("tool_calls", []).append(
                {"id": item.get("call_id", ""), "type": "function", "function": call}
            )
        elif kind == "function_call_output":
            open_assistant = None
            output = item.get("output", "")
            text = output if isinstance(output, str) else _parts_text(output)
            messages.append({"role": "tool", "tool_call_id": item.get("call_id", ""), "content": text})
        elif kind == "reasoning":
            continue
        else:
            raise ChatMappingError(f"a {kind!r} input item has no Chat Completions form")
    return messages


def chat_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses function tools -> Chat ``tools``; namespaces flattened. Raises ``ChatMappingError``
    for another tool type (a hosted tool only the Responses API runs)."""
    out: list[dict[str, Any]] = []
    for tool in tools:
        if tool.get("type") == "namespace":
            out.extend(chat_tools(list(tool.get("tools") or [])))
            continue
        if tool.get("type") != "function":
            raise ChatMappingError(
                f"a {tool.get('type')!r} tool has no Chat Completions form; use OPENAI_API_STYLE=responses"
            )
        function: dict[str, Any] = {"name": tool["name"]}
        if tool.get("parameters") is not None:  # absent: a function without arguments (G10 under gemini)
            function["parameters"] = tool["parameters"]
        if tool.get("description"):
            function["description"] = tool["description"]
        if tool.get("strict") is not None:
            function["strict"] = bool(tool["strict"])
        out.append({"type": "function", "function": function})
    return out


def chat_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` (a ``CompletionCreateParams``) for ``request``.

    Raises ``ChatMappingError``."""
    body: dict[str, Any] = {"model": request.model, "messages": chat_messages(request.input, request.instructions)}
    if request.tools:
        body["tools"] = chat_tools(request.tools)
        body["parallel_tool_calls"] = True
    if request.max_output_tokens:
        body["max_tokens"] = request.max_output_tokens
    return body


# ---- reply: Chat completion -> ModelReply -----------------------------------------------------


def responses_usage(usage: Any) -> dict[str, Any]:
    """A Chat ``usage`` object in the Responses names (``{}`` when the server sent none)."""
    if not isinstance(usage, dict):
        return {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    prompt_details = usage.get("prompt_tokens_details") or {}
    completion_details = usage.get("completion_tokens_details") or {}
    return {
        "input_tokens": prompt,
        "output_tokens": completion,
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
        "input_tokens_details": {"cached_tokens": int(prompt_details.get("cached_tokens") or 0)},
        "output_tokens_details": {"reasoning_tokens": int(completion_details.get("reasoning_tokens") or 0)},
    }


def _arguments(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()  # a server that sends an object (Ollama) sent valid JSON


def _message_item(reply_id: str, text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {"type": "message", "id": f"msg_{reply_id}", "role": "assistant", "status": "completed", "content": content}


def _call_item(reply_id: str, n: int, call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    if not isinstance(name, str):
        raise GatewayError(f"model gateway sent a malformed tool call: name is {type(name).__name__}", retryable=True)
    item = {"type": "function_call", "id": f"fc_{reply_id}_{n}", "name": name, "arguments": _arguments(arguments)}
    item["status"] = "completed"
    if call_id:
        item["call_id"] = str(call_id)  # a missing id gets a placeholder (worker.model.items.normalize_reply_calls)
    return item


def _finish(reply_id: str, output: list[dict[str, Any]], finish_reason: Any, usage: Any) -> ModelReply:
    reason = {"length": "max_output_tokens", "content_filter": "content_filter"}.get(str(finish_reason))
    return ModelReply(
        id=reply_id,
        status="incomplete" if reason else "completed",
        output=output,
        usage=responses_usage(usage),
        incomplete_reason=reason,
    )


def reply_from_completion(data: Any) -> ModelReply:
    """A ``chat.completion`` body as a ``ModelReply`` (module docstring gives the mapping).

    Raises ``GatewayError`` (retryable) for a body that is not a completion with a choice."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GatewayError("model gateway sent a malformed chat completion: no choices", retryable=True)
    reply_id = str(data.get("id") or "chatcmpl")
    message = choices[0].get("message") or {}
    output: list[dict[str, Any]] = []
    text = message.get("content")
    if isinstance(text, list):
        text = _parts_text(text)
    if text:
        output.append(_message_item(reply_id, str(text)))
    for n, call in enumerate(message.get("tool_calls") or []):
        if not isinstance(call, dict):
            raise GatewayError("model gateway sent a malformed tool call: not an object", retryable=True)
        function = call.get("function") or {}
        output.append(_call_item(reply_id, n, call.get("id"), function.get("name"), function.get("arguments")))
    return _finish(reply_id, output, choices[0].get("finish_reason"), data.get("usage"))


class _StreamAssembly:
    """The reply being assembled from chunks; output items numbered by first appearance."""

    def __init__(self, on_delta: OnDelta):
        self.on_delta = on_delta
        self.reply_id = "chatcmpl"
        self.order: list[tuple[str, int]] = []  # ("text", 0) | ("call", tool index)
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None

    def _index(self, key: tuple[str, int]) -> int:
        if key not in self.order:
            self.order.append(key)
        return self.order.index(key)

    def add(self, chunk: dict[str, Any]) -> None:
        self.reply_id = str(chunk.get("id") or self.reply_id)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:  # vLLM sends "choices": null on the usage chunk
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self.text.append(str(delta["content"]))
                self.on_delta(Delta("text", self._index(("text", 0)), str(delta["content"])))
            for fragment in delta.get("tool_calls") or []:
                self._call_fragment(fragment)
            if choice.get("finish_reason"):
                self.finish_reason = str(choice["finish_reason"])

    def _call_fragment(self, fragment: dict[str, Any]) -> None:
        n = int(fragment.get("index", len(self.calls)))
        call = self.calls.setdefault(n, {"id": None, "name": "", "arguments": ""})
        output_index = self._index(("call", n))
        function = fragment.get("function") or {}
        call["id"] = fragment.get("id") or call["id"]
        call["name"] += function.get("name") or ""
        piece = function.get("arguments")
        if piece:
            piece = _arguments(piece)
            call["arguments"] += piece
            self.on_delta(Delta("arguments", output_index, piece, call["id"], call["name"] or None))

    def reply(self) -> ModelReply:
        output: list[dict[str, Any]] = []
        for kind, n in self.order:
            if kind == "text":
                output.append(_message_item(self.reply_id, "".join(self.text)))
            else:
                call = self.calls[n]
                output.append(_call_item(self.reply_id, n, call["id"], call["name"], call["arguments"]))
        return _finish(self.reply_id, output, self.finish_reason, self.usage)


class ChatStream:
    """A ``StreamReader`` (``worker.model.wire_format``) of a Chat Completions chunk stream: the
    reply at ``data: [DONE]``, or at the stream's end when a ``finish_reason`` came."""

    def __init__(self, on_delta: OnDelta):
        self.assembly = _StreamAssembly(on_delta)

    def feed(self, event: str, data: str) -> ModelReply | None:
        """One chunk; the reply at ``[DONE]``. Raises ``GatewayError``."""
        if not data:
            return None
        if data.strip() == "[DONE]":
            return self.end()
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise GatewayError("model stream sent a non-JSON chunk", retryable=True) from exc
        if isinstance(chunk, dict) and chunk.get("error"):
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            kind = str(err.get("type") or err.get("code") or "")
            raise GatewayError(
                f"model stream error {kind}: {err.get('message', '')}"[:500], retryable=kind not in _FATAL_TYPES
            )
        if isinstance(chunk, dict):
            self.assembly.add(chunk)
        return None

    def end(self) -> ModelReply:
        """The reply, when a ``finish_reason`` came; else raises ``GatewayError`` (retryable)."""
        if self.assembly.finish_reason is None:
            raise GatewayError("model stream ended before a finish_reason", retryable=True)
        return self.assembly.reply()


def _parse_body(content: bytes) -> ModelReply:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError as exc:
        raise GatewayError("model gateway sent a non-JSON body", retryable=True) from exc
    return reply_from_completion(data)


def chat_wire_body(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for ``request`` (``chat_body``); a request Chat
    cannot express raises ``GatewayError`` (not retryable) naming why."""
    try:
        return chat_body(request)
    except ChatMappingError as exc:
        raise GatewayError(f"request cannot be sent as Chat Completions: {exc}", retryable=False) from exc


def _stream_body(request: ModelRequest) -> dict[str, Any]:
    return {**chat_wire_body(request), "stream": True, "stream_options": {"include_usage": True}}


CHAT = WireFormat("/chat/completions", chat_wire_body, _stream_body, _parse_body, ChatStream)
"""Chat Completions as a ``WireFormat`` (``WIRE_STYLES["chat"]``; both transports drive it)."""
