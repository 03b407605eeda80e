"""Real turns with the product's own text catalog (``toolset`` ``text``) against the real model, in
both wire styles (``catalog_stack``): a file count through ``run_command``, and a file written and
read back. The model writes its calls in its own forms (bare JSON, fences, tags), which
llama-server returns as text (``--skip-chat-parsing``) and the runtime reads
(``worker.model.text_calls``); the catalog's other tools are deferred behind ``tool_search`` to keep
the small model's prompt small, which ``test_deferred_tools_keep_the_first_prompt_small`` measures.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest
import redis as redis_lib

from devtools.real_model import MODEL_NAME
from tests.conftest import API_STYLES
from tests.integration.real_model.conftest import CATALOG_DEFERRED
from worker.model.clients import model_client
from worker.model.interface import ModelRequest
from worker.settings import Settings
from worker.tooling.contract import ToolServices
from worker.tooling.schemas import collect_tool_definitions
from worker.tooling.tool_search import deferred_by_name, with_tool_search
from worker.tools.assembly import text_turn_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnStatus

pytestmark = pytest.mark.timeout(900)

# Without them the small model keeps calling tools after the one the request needed (first run).
INSTRUCTIONS = (
    "You work in the user's home directory with tools. Call only the tools the request needs. "
    "When their results answer the request, answer the user in one sentence and call no more tools."
)


def _home(homes_root: Path, files: dict[str, str]) -> str:
    agent = f"real-{uuid.uuid4().hex[:6]}"
    home = homes_root / agent
    home.mkdir(parents=True)
    for name, text in files.items():
        (home / name).write_text(text)
    return agent


def _run(stack, agent: str, text: str) -> tuple:
    started = time.monotonic()
    turn_id = stack.control.enqueue({"agent_id": agent, "input": text, "instructions": INSTRUCTIONS})
    view = stack.control.wait(turn_id, timeout=800)
    elapsed = time.monotonic() - started
    usage = stack.control.usage(turn_id)
    first = usage["steps"][0]["input_tokens"] if usage["steps"] else 0
    print(
        f"\n{stack.style}: {view.status.value} in {elapsed:.1f} s, {view.model_calls} model calls, "
        f"first prompt {first} tokens, {usage['total']['input_tokens']} in / {usage['total']['output_tokens']} out: "
        f"{view.final_output!r}"
    )
    planned = [e for e in stack.control.events(turn_id) if e["kind"] == "call_planned"]
    for event in planned:
        print(f"  {event['name']} {event['arguments']} repairs={event['repairs']} error={event['error']}")
    return turn_id, view, planned


def _outputs(stack, turn_id: str) -> dict[str, str]:
    return {i["call_id"]: i["output"] for i in stack.control.items(turn_id) if i["type"] == "function_call_output"}


def test_a_file_count_through_run_command(catalog_stack, homes_root):
    agent = _home(homes_root, {"todo.txt": "write the summary\ncount the lines\nship it\n"})
    turn_id, view, planned = _run(
        catalog_stack, agent, "How many lines does todo.txt have? Count them with wc -l using run_command."
    )
    assert view.status == TurnStatus.completed, view.error
    runs = [e for e in planned if e["name"] == "run_command" and e["error"] is None]
    assert runs and any("todo.txt" in e["arguments"]["command"] for e in runs), planned
    outputs = _outputs(catalog_stack, turn_id)
    assert any("3 todo.txt" in outputs[e["call_id"]] for e in runs), outputs
    assert "3" in view.final_output or "three" in view.final_output.lower()


def test_a_file_written_and_read_back(catalog_stack, homes_root):
    agent = _home(homes_root, {})
    turn_id, view, planned = _run(
        catalog_stack,
        agent,
        "Write the text 'the tide is high' to a file named tide.txt with write_file, "
        "then read tide.txt back with read_file and tell me what it says.",
    )
    assert view.status == TurnStatus.completed, view.error
    assert "the tide is high" in (homes_root / agent / "tide.txt").read_text()
    reads = [e for e in planned if e["name"] == "read_file" and e["error"] is None]
    assert reads, planned
    outputs = _outputs(catalog_stack, turn_id)
    assert any("the tide is high" in outputs[e["call_id"]] for e in reads), outputs
    assert [e["name"] for e in planned].index("write_file") < [e["name"] for e in planned].index("read_file")


def _catalog(tmp_path: Path, redis_url: str) -> list:
    """The text catalog as a worker of this session's settings builds it for a turn."""
    ctx = TurnContext(
        turn_id="t",
        agent_id="a",
        home=tmp_path,
        settings=Settings(),
        redis=redis_lib.Redis.from_url(redis_url),
        services=ToolServices(
            enqueue_turn=lambda request, turn_id=None: "turn-id",
            cancel_turn=lambda turn_id: True,
            save_schedule_entry=lambda record: None,
            delete_schedule_entry=lambda schedule_id: None,
        ),
    )
    return text_turn_tools(ctx)


@pytest.mark.parametrize("style", API_STYLES)
def test_deferred_tools_keep_the_first_prompt_small(style, llama_server, tmp_path, redis_url):
    """The first request of a catalog turn, as the worker sends it, with the whole catalog and with
    ``CATALOG_DEFERRED``: the server's own prompt-token count and the call's time (one output
    token: prompt processing is what the catalog costs)."""
    tools = _catalog(tmp_path, redis_url)
    settings = Settings(
        OPENAI_BASE_URL=llama_server.base_url,
        OPENAI_API_STYLE=style,
        OPENAI_MODEL=MODEL_NAME,
        OPENAI_API_KEY="",
        model_timeout=600,
    )
    client = model_client(settings)
    question = [{"type": "message", "role": "user", "content": "How many lines does todo.txt have?"}]
    measured = {}
    try:
        for name, offered in (
            ("deferred", with_tool_search(deferred_by_name(tools, CATALOG_DEFERRED))),
            ("whole", tools),
        ):
            definitions = collect_tool_definitions(offered)
            started = time.monotonic()
            reply = client.create(
                ModelRequest(model=settings.model, input=question, tools=definitions, max_output_tokens=1)
            )
            measured[name] = (reply.usage["input_tokens"], time.monotonic() - started, len(definitions))
    finally:
        client.close()
    for name, (tokens, seconds, count) in measured.items():
        print(f"\n{style}: {name} catalog, {count} tools sent: first prompt {tokens} tokens, {seconds:.1f} s")
    assert measured["deferred"][0] * 2 < measured["whole"][0], orjson.dumps(measured).decode()
