"""What an agent's command may hold (worker/tools/computer/privileges.py): the status parser and
the two refusals, on statuses as the kernel writes them (the bookworm tools container's is the one
a command really showed there before the tools worker was granted CAP_SETPCAP)."""

from __future__ import annotations

import pytest

from worker.tools.computer import privileges
from worker.tools.computer.privileges import Privileges, cap_names, command_held, command_refusal, worker_lacks

# An agent's command in the tools container without CAP_SETPCAP (bookworm's bwrap and setpriv):
# the container's 8 capabilities still in its bounding set.
KEPT_BOUNDING = """Name:\tcat
Umask:\t0022
State:\tR (running)
Uid:\t100000\t100000\t100000\t100000
NoNewPrivs:\t1
CapInh:\t0000000000000000
CapPrm:\t0000000000000000
CapEff:\t0000000000000000
CapBnd:\t00000000082010cb
CapAmb:\t0000000000000000
Seccomp:\t2
"""
NOTHING = KEPT_BOUNDING.replace("00000000082010cb", "0000000000000000")
# The tools worker itself (root in its container): compose.yaml's grants.
WORKER_9 = "CapEff:\t00000000082011cb\nCapBnd:\t00000000082011cb\n"
WORKER_8 = "CapEff:\t00000000082010cb\nCapBnd:\t00000000082010cb\n"


def test_a_command_that_holds_nothing_passes():
    assert command_held(NOTHING) == [] and command_refusal(NOTHING) is None
    parsed = Privileges.parse(NOTHING)
    assert parsed.caps == dict.fromkeys(privileges.CAP_FIELDS, 0) and parsed.no_new_privs == 1
    assert parsed.line() == "CapInh 0x0, CapPrm 0x0, CapEff 0x0, CapBnd 0x0, CapAmb 0x0, NoNewPrivs 1"


def test_a_bounding_set_left_full_is_refused_naming_what_it_holds():
    held = command_held(KEPT_BOUNDING)
    assert held == [
        "CapBnd 0x82010cb (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_SETGID, CAP_SETUID, CAP_NET_ADMIN, "
        "CAP_SYS_ADMIN, CAP_MKNOD)"
    ]
    refusal = command_refusal(KEPT_BOUNDING)
    assert refusal is not None and "CAP_SYS_ADMIN" in refusal and "CAP_SETPCAP" in refusal


@pytest.mark.parametrize("field", privileges.CAP_FIELDS)
def test_any_capability_in_any_set_is_refused(field):
    status = NOTHING.replace(f"{field}:\t0000000000000000", f"{field}:\t0000000000200000")
    assert command_held(status) == [f"{field} 0x200000 (CAP_SYS_ADMIN)"]


def test_without_no_new_privs_or_with_a_line_missing_it_is_refused():
    assert command_held(NOTHING.replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")) == [
        "NoNewPrivs 0 (a setuid or file-capability program could gain privileges)"
    ]
    missing = command_held(NOTHING.replace("CapAmb:\t0000000000000000\n", "").replace("NoNewPrivs:\t1\n", ""))
    assert missing == [
        "CapAmb not in the status",
        "NoNewPrivs not in the status (a setuid or file-capability program could gain privileges)",
    ]
    assert command_held("") != [] and command_held("CapEff:\tnot hex\n")[2] == "CapEff not in the status"


def test_capability_names():
    assert cap_names(0) == [] and cap_names(1 << 8) == ["CAP_SETPCAP"]
    assert cap_names((1 << 40) | (1 << 41)) == ["CAP_CHECKPOINT_RESTORE", "cap 41"]
    assert len(privileges.CAP_NAMES) == 41 and privileges.CAP_NAMES[21] == "CAP_SYS_ADMIN"


def test_a_root_worker_without_setpcap_is_refused_by_name():
    assert worker_lacks(WORKER_9) == [] and privileges.worker_refusal(WORKER_9) is None
    assert worker_lacks(WORKER_8) == ["CAP_SETPCAP"]
    refusal = privileges.worker_refusal(WORKER_8)
    assert refusal is not None and refusal.startswith("the tools worker lacks CAP_SETPCAP: ")
    # in the bounding set but not effective (or the reverse) is not enough
    assert worker_lacks("CapEff:\t00000000000000c0\nCapBnd:\t00000000000001c0\n") == ["CAP_SETPCAP"]
    assert worker_lacks("CapEff:\t00000000000001c0\nCapBnd:\t0000000000000000\n") == list(privileges.WORKER_NEEDS)
    assert privileges.worker_refusal("") == (
        "the tools worker lacks CAP_SETUID, CAP_SETGID, CAP_SETPCAP: a root worker starts each command as its "
        "agent's uid with no capabilities, which takes CAP_SETUID, CAP_SETGID, CAP_SETPCAP in its effective and "
        "bounding sets; grant them (compose.yaml's worker-tools cap_add, docs/deployment.md \"The tools worker's "
        'grants")'
    )
