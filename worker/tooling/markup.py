"""Tool-call markup that leaked from a model's template into the JSON arguments.

Open-model servers turn a model's tool-call text into JSON with a parser per template:
GLM's ``<arg_key>k</arg_key><arg_value>v</arg_value>``, Qwen3-Coder's
``<parameter=k>v</parameter>``, the ``<parameter name="k">`` / ``<invoke>`` XML style,
chat-template tokens (``<|tool_call_end|>``, DeepSeek's fullwidth ``<｜tool▁call▁end｜>``,
Harmony's ``<|call|>``) and Mistral's ``[TOOL_CALLS]`` (in keys). When such a parser misses a boundary,
the markup ends up inside the JSON: in a key (``"</parameter"``) or in a value that swallowed
the next parameters (``"app.log</arg_value><arg_key>pattern</arg_key>..."``). Neither is ever
passed on (``docs/arguments.md``, "Markup"); one rule for every tool, whatever declares its schema.

- ``markup_key_error``: any key (at any depth) holding markup is refused; a key the tool
  declares at the top level is allowed.
- ``markup_value_error``: a string value is refused when it holds a piece of a format's
  *structure*: two format tags side by side (``</arg_value><arg_key>``,
  ``</parameter>\\n<parameter=path>``, ``<|tool_call_end|><|tool_call_begin|>``; two chat-turn
  tokens side by side are a transcript, content), a Harmony message header
  (``<|channel|>commentary``), a closing tag followed by the opening of a parameter
  (``</content>\\n<parameter name="tags">``), or a
  parameter tag / template token at the very start or end of the value that the value does not
  itself open and close (``app.log</arg_value>``, ``ls -la<|call|>``); a value that is one tag
  or token and nothing else is data (a stop sequence). Markup that is content
  passes unchanged: a single ``</tool_call>`` in a shell command, HTML, a regex quoting
  ``<parameter=x>(.*?)</parameter>``, a chat template mentioning ``<|im_start|>`` mid-text.

Sources of the shapes: llama.cpp PR 26608 (C01), exo-explore/exo PR 2187 (GLM markup in keys
and values), anthropics/claude-code issues 83088 and 44826 (a wrong closer swallowing the next
parameter), raullenchai/Rapid-MLX issue 1515 and Neroued/ninfer issue 138 (markup that is content).
"""

from __future__ import annotations

import re
from typing import Any

# Markup in a key: <|...|> delimiters (also fullwidth <｜...｜>), closing tags (also unterminated:
# "</parameter"), opening tags or assignments (<arg_key>, <parameter=cmd>, <tool_call>,
# <a href=...>), Mistral's control tokens, and a known tool-format tag name left open ("<parameter").
_KEY_MARKUP = re.compile(
    r"<[|\uff5c]|[|\uff5c]>|</\s*[A-Za-z_]|<[A-Za-z_][\w:.-]*(?:\s*/?>|=|\s+[\w:.-]+\s*=)"
    r"|<\s*(?:parameter|function|tool_calls?|tool_response|arg_key|arg_value|invoke|think)\b"
    r"|\[/?(?:TOOL_CALLS|ARGS|CALL_ID|TOOL_RESULTS)\]"
)

# One tag of a tool-call format, as found in a value. Groups: ``tok`` a chat-template token,
# ``close`` the name of a closing tag, ``popen`` an opening parameter-level tag.
_FORMAT_TAG = re.compile(
    r"(?P<tok><\|[^<>|\n]{1,48}\|>|<\uff5c[^<>\n]{1,48}\uff5c>)"
    r"|</\s*(?:\uff5c+DSML\uff5c+)?(?P<close>arg_key|arg_value|parameter|function|tool_call|tool_calls"
    r"|function_calls|invoke|tool_response)\s*>"
    r"|(?P<popen><(?:arg_key|arg_value)>|<parameter=[^<>\n]{1,80}>"
    r"|<(?:\uff5c+DSML\uff5c+)?parameter\s+name\s*=\s*[\"'][^\"'<>\n]{1,80}[\"'][^<>\n]{0,40}>)"
    r"|<(?:tool_call|tool_calls|function_calls|invoke(?:\s+name\s*=\s*[\"'][^\"'<>\n]{1,80}[\"'])?"
    r"|function=[^<>\n]{1,80}|tool_response)>"
)
# Chat-turn tokens of ChatML, Llama 3, Gemma and Harmony: a transcript in a value is content.
_TURN_TOKENS = frozenset(
    {"im_start", "im_end", "im_sep", "eot_id", "start_header_id", "end_header_id", "begin_of_text", "end_of_text"}
    | {"endoftext", "start", "end", "start_of_turn", "end_of_turn", "user", "assistant", "system"}
)
# Harmony's message header (gpt-oss): the channel a message goes to (vllm-project/vllm issue 32587).
_HARMONY_HEADER = re.compile(r"<\|channel\|>\s*(?:commentary|analysis|final)\b")
# Any closing tag (a wrong closer such as </content> at a parameter boundary).
_ANY_CLOSE = re.compile(r"</\s*[A-Za-z_][\w:.-]*\s*>")
# The parameter-level closers, and the opener each one closes.
_PARAM_CLOSERS = {"arg_key": "<arg_key>", "arg_value": "<arg_value>", "parameter": "<parameter"}


def markup_hinted(raw: str) -> bool:
    """True when ``raw`` may hold markup in a key or a value (a cheap superset); ``False`` proves
    there is none: every form needs ``<``, ``|>``, ``｜`` or a ``[...]`` control token. Single
    characters are tested first (``memchr`` speed), longer needles only when one is present."""
    if "<" in raw or "\uff5c" in raw:
        return True
    if "|" in raw and "|>" in raw:
        return True
    # Every control token ends in "S]" or "D]" (a superset test: two needles instead of four). A
    # two-character needle is searched character by character (about 1 ns each: 0.2 us on a
    # 270-character call), a single character at ``memchr`` speed, so "S" or "D" is looked for first.
    return "[" in raw and ("S" in raw and "S]" in raw or "D" in raw and "D]" in raw)


def markup_key_error(value: Any, declared: Any) -> str | None:
    """An error naming the first key (at any depth) that holds chat-template or XML markup, else ``None``.

    Keys the tool's schema declares at the top level are allowed. Such a key is a leak of
    the model's tool-call format into the JSON (B01: a Qwen3 ``</parameter`` fragment became
    a key), never a parameter name, and a schema with open ``additionalProperties`` (or a
    pydantic model that ignores unknown keys) would take it as one. Iterative, O(size).
    """
    declared = declared or ()
    stack = [(value, True)]
    while stack:
        v, top = stack.pop()
        if isinstance(v, dict):
            for k, sub in v.items():
                if isinstance(k, str) and not (top and k in declared):
                    m = _KEY_MARKUP.search(k)
                    if m:
                        return (
                            f"the key {k[:80]!r} in your arguments holds chat-template or XML markup "
                            f"({m.group()!r}): a tool-call format leaked into the JSON; nothing was run: send the "
                            "arguments as one plain JSON object whose keys are the tool's parameter names"
                        )
                if isinstance(sub, (dict, list)):
                    stack.append((sub, False))
        elif isinstance(v, list):
            stack.extend((x, False) for x in v if isinstance(x, (dict, list)))
    return None


def leaked_markup(text: str) -> str | None:
    """The piece of tool-call structure ``text`` (one string value) holds, or ``None``.

    See the module docstring for the three shapes. Linear: one regex scan for format tags,
    and one anchored match per closing tag found.
    """
    if "<" not in text:
        return None
    tags = list(_FORMAT_TAG.finditer(text))
    for a, b in zip(tags, tags[1:]):
        if not text[a.end() : b.start()].strip() and not (_is_turn(a) and _is_turn(b)):
            return text[a.start() : b.end()]
    header = _HARMONY_HEADER.search(text)
    if header is not None:
        return header.group()
    for m in _ANY_CLOSE.finditer(text):
        nxt = _FORMAT_TAG.match(text, _skip_space(text, m.end()))
        if nxt is not None and nxt.group("popen"):
            return text[m.start() : nxt.end()]
    return _edge_tag(text, tags)


def _is_turn(tag: re.Match[str]) -> bool:
    """A chat-turn token (``<|im_end|>``, ``<|eot_id|>``...): two of them side by side are a
    transcript (content), not a tool call."""
    tok = tag.group("tok")
    return tok is not None and tok[2:-2].strip().lower() in _TURN_TOKENS


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _edge_tag(text: str, tags: list[re.Match[str]]) -> str | None:
    """A parameter-level tag or a template token at the very start or end of ``text`` that the
    value does not balance itself (a swallowed closer, a leaked opener), else ``None``."""
    if not tags:
        return None
    if len(tags) == 1 and tags[0].group() == text.strip():
        return None  # the whole value is one tag or token: data (a stop sequence, a tag name), not a leak
    stripped_start = _skip_space(text, 0)
    stripped_end = len(text.rstrip())
    first, last = tags[0], tags[-1]
    # A turn token at an edge is a leak only when it is the value's one turn token (a
    # transcript, which opens and closes turns, is content).
    turns = sum(1 for t in tags if _is_turn(t))
    if last.end() == stripped_end:
        if last.group("tok") and not (_is_turn(last) and turns > 1):
            return last.group()
        name = last.group("close")
        if name in _PARAM_CLOSERS and _PARAM_CLOSERS[name] not in text[: last.start()]:
            return last.group()
    if first.start() == stripped_start:
        if first.group("tok") and not (_is_turn(first) and turns > 1):
            return first.group()
        opener = first.group("popen")
        if opener and not _closes(opener, text[first.end() :]):
            return opener
    return None


def _closes(opener: str, rest: str) -> bool:
    """True when ``rest`` closes the parameter-level ``opener`` (``<arg_value>`` ... ``</arg_value>``)."""
    name = (
        "arg_key" if opener.startswith("<arg_key") else "arg_value" if opener.startswith("<arg_value") else "parameter"
    )
    return re.search(rf"</\s*{name}\s*>", rest) is not None


def markup_value_error(value: Any) -> str | None:
    """An error naming the first string value (at any depth, with its location) that holds
    leaked tool-call structure (``leaked_markup``), else ``None``. Iterative, O(size)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, loc = stack.pop()
        if isinstance(v, str):
            piece = leaked_markup(v)
            if piece is not None:
                where = loc or "<root>"
                return (
                    f"the value of {where!r} in your arguments holds tool-call markup ({piece[:120]!r}): the "
                    "model's tool-call format leaked into a value and swallowed what followed it; nothing was run: "
                    "send each parameter as its own key of one plain JSON object, with plain values"
                )
        elif isinstance(v, dict):
            stack.extend(reversed([(sub, f"{loc}.{k}" if loc else str(k)) for k, sub in v.items()]))
        elif isinstance(v, list):
            stack.extend(reversed([(sub, f"{loc}[{i}]") for i, sub in enumerate(v)]))
    return None
