"""The README's tool example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

from worker.settings import Settings
from worker.tooling.arguments import validate_tool_arguments
from worker.tooling.contract import AbortSignal, ToolContext
from worker.turn.context import TurnContext

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()


def test_writing_a_tool_example(tmp_path):
    section = README.split("## Writing a tool", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    (tmp_path / "a.txt").write_text("one two three")
    tools = namespace["create_word_tools"](TurnContext(turn_id="t", agent_id="a", home=tmp_path, settings=Settings()))
    tool = tools[0]
    outcome = validate_tool_arguments(tool, '{"path": "a.txt"}')
    result = tool.execute(outcome.params, ToolContext(turn_id="t", call_id="c", home=tmp_path, abort=AbortSignal()))
    assert result.content == {"path": "a.txt", "words": 3}
    assert tool.completed_activity(outcome.params, result) == "Counted 3 words in a.txt"
