"""Who owns a claim: this process as ``host:pid``, and whether a claim's owner is gone.

A tool call is claimed by the process that runs it (``TurnStore.claim``); a redelivered
call whose owner died on this host is taken over at once instead of waiting for the lease.
"""

from __future__ import annotations

import os
import socket

HOST = socket.gethostname()


def owner() -> str:
    """This process as a claim owner: ``host:pid`` (computed per call: prefork children fork after import)."""
    return f"{HOST}:{os.getpid()}"


def owner_is_dead(claim_owner: str) -> bool:
    """True when a claim's owner ran on this host and its process is gone (a killed pool child).

    Its call is then redelivered at once (``task_reject_on_worker_lost``) and need not wait
    for the lease to expire. Owners on other hosts are judged by their lease only.
    """
    host, _, pid = claim_owner.rpartition(":")
    if host != HOST or not pid.isdigit() or int(pid) == os.getpid():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
