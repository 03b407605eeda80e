"""Building blocks of scripted-gateway conversations for tests."""

from __future__ import annotations

from typing import Any

import orjson


def fc(name: str, arguments: Any = "{}", call_id: str | None = None) -> dict[str, Any]:
    """A scripted ``function_call``; ``arguments`` is sent as given when a string, else JSON-encoded."""
    item = {
        "type": "function_call",
        "name": name,
        "arguments": arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
    }
    if call_id:
        item["call_id"] = call_id
    return item


def msg(text: str) -> dict[str, Any]:
    """A scripted assistant message."""
    return {"type": "message", "text": text}


def output_texts(control: Any, turn_id: str) -> list[str]:
    """The ``output`` strings of a turn's ``function_call_output`` items, in order."""
    return [i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"]


def wait_for(predicate: Any, timeout: float = 30.0, poll: float = 0.1) -> Any:
    """Poll ``predicate()`` until it returns something truthy (returned); AssertionError after ``timeout`` s."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"condition not met within {timeout}s")
