"""Building blocks of scripted-gateway conversations for tests."""

from __future__ import annotations

from typing import Any

import orjson


def fc(name: str, arguments: Any = "{}", call_id: str | None = None) -> dict[str, Any]:
    """A scripted ``function_call``; ``arguments`` is sent as given when a string, else JSON-encoded."""
    item = {"type": "function_call", "name": name,
            "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()}
    if call_id:
        item["call_id"] = call_id
    return item


def msg(text: str) -> dict[str, Any]:
    """A scripted assistant message."""
    return {"type": "message", "text": text}
