"""A model reply the server would not return: its own tool-call parser refused the model's output
(``GatewayError.model_output``: llama.cpp's "does not match the expected ... format", Ollama's
"error parsing tool call").

Such a failure is deterministic: the same request gives the same output (the open models' servers
sample greedily by default), so retrying it unchanged only pays for it again, and the turn used to
end ``model_unavailable`` after five identical attempts, counted as a transport error. It is the
model's doing, and is handled as an invalid call is: the model is told what was wrong, in an
instruction added to the history (so the next request differs), and the turn goes on to the next
model step. Each turn has ``max_invalid_calls_per_tool`` of them (the budget of a tool's invalid
calls); the next one ends the turn ``failed`` with a reason that says so (metrics reason
``model_output``).

The server's error carries no text of the model's (llama.cpp's does not; Ollama's sometimes
quotes it). Where a server can return that text instead of failing (llama-server
``--skip-chat-parsing``; vLLM and Ollama return unparsed calls as content), the runtime reads the
calls from it itself (``worker.model.text_calls``) and no instruction is needed.
"""

from __future__ import annotations

import logging

from worker.model.interface import GatewayError
from worker.model.items import user_message
from worker.turn import telemetry
from worker.turn.ending import TurnEnd
from worker.turn.interfaces import step_label
from worker.turn.outcome import StepOutcome
from worker.turn.prepared import PreparedStep
from worker.turn.request import TurnStatus
from worker.turn.runtime import TurnRuntime
from worker.turn.state import StaleStep

log = logging.getLogger("agent.loop")

UNREAD_ERROR = "the model's output could not be read by the model server"
"""The start of the error of a turn ended by unread replies (``worker.turn.metrics`` reads it)."""


def instruction_text(exc: GatewayError) -> str:
    """What the model is told after a reply its server refused (``exc``: the server's error)."""
    return (
        "Your previous reply could not be read: the model server said "
        f"{str(exc)[:300]!r}. Nothing was run. To call a tool, write only the call, exactly in the "
        'tool-call format your instructions give ({"name": <tool name>, "arguments": {...}}), '
        "with no code fence and no other text; otherwise answer in plain text."
    )


def handle_unread_reply(rt: TurnRuntime, end: TurnEnd, prepared: PreparedStep, exc: GatewayError) -> StepOutcome:
    """The outcome of step ``prepared`` whose reply the server refused (``exc.model_output``): the
    model told what was wrong and the next step enqueued, or, past the turn's budget, the turn
    ended ``failed`` (module docstring)."""
    turn_id, step, store = prepared.turn_id, prepared.step, rt.store
    misses = prepared.state.unread_replies + 1
    log.warning(
        "turn %s step %s: the server refused the model's output (%d in this turn): %s", turn_id, step, misses, exc
    )
    if misses > rt.settings.max_invalid_calls_per_tool:
        error = f"{UNREAD_ERROR} {misses} times in this turn; last: {exc}"
        ended = end.at_model_step(turn_id, step, TurnStatus.failed, error)
        return StepOutcome("ended", "model_output", ended=ended)
    try:
        store.moves.continue_after_reply(
            turn_id, step, [user_message(instruction_text(exc))], {"unread_replies": misses}
        )
    except StaleStep:
        return StepOutcome("dropped", "already continued")
    store.event(turn_id, "repair_instruction", step=step, reason="model_output", error=str(exc)[:500])
    agent_id, nxt = prepared.request.agent_id, step + 1
    with telemetry.under_turn(prepared.state.traceparent):
        rt.dispatcher.enqueue_step(turn_id, nxt, queue=prepared.request.queue, label=step_label(agent_id, turn_id, nxt))
    return StepOutcome("repair_instruction", "model_output")
