"""A message that a dying process popped from its queue, and never recorded as fetched, does not
leave its turn to the progress deadline (``tasks.watchdog.unnamed_turns_redriven``).

Kombu's Redis transport pops a message (``BRPOP``) and then records it in ``unacked``: a process
killed between the two takes the message with it. It is then in no queue, no ``unacked`` and no
node's held set; before, only the progress deadline (minutes) named its turn again. Here a real
worker is SIGKILLed after its turn's message was popped as the dying process would have; the
watchdog (beat, the heartbeat path) finds the node dead and re-drives the turn no message names.
The stack's progress deadline is 20 minutes away, and the reconciliation after a Redis restart has
already run once for this Redis: a turn that completes within the asserted seconds was recovered
by the node-death path.
"""

from __future__ import annotations

import time

from tasks.watchdog import NODE_DEATH_REASON, RECONCILED_KEY, redis_run
from tests.support.scripts import msg, wait_for


def test_a_message_popped_by_a_dying_process_is_found_again(stack, gateway, script_name):
    gateway.add_script(script_name, [{"output": [msg("found again")]}])
    r = stack.client()
    # The turn's steps go to the ``background`` queue, which no worker serves until the node dies
    # (the watchdog's sweep goes to ``turns``).
    doomed = stack.start_worker(queues="turns,tools")
    stack.start_beat()
    run, _ = redis_run(r)
    wait_for(lambda: r.exists(RECONCILED_KEY.format(run)), timeout=30)  # the restart path is spent

    request = {"agent_id": "popped-a", "input": "go", "model": script_name, "queue": "background"}
    tid = stack.control.enqueue(request)
    assert wait_for(lambda: r.rpop("background"), timeout=10)  # what the dying process's BRPOP took
    time.sleep(3.5)  # the turn has been quiet long enough to be judged
    killed_at = time.time()
    stack.kill(doomed)
    stack.start_worker(queues="turns,background")

    view = stack.control.wait(tid, timeout=60)
    assert view.status.value == "completed" and view.final_output == "found again"
    redriven = [e for e in stack.control.events(tid) if e.get("kind") == "turn_redriven"]
    assert redriven, "the turn was never re-driven"
    node = NODE_DEATH_REASON.split("{}")[0]
    assert str(redriven[0]["reason"]).startswith(node), redriven
    assert float(redriven[0]["at"]) - killed_at < 30
