"""What privileges an agent's command may hold: none.

A command runs with every capability set empty (inheritable, permitted, effective, bounding and
ambient) and ``no_new_privs`` on, so nothing it runs can gain a capability, not even through a
setuid or file-capability program. This is checked, not assumed: the sandbox's probe
(``sandbox.probe``) runs a command that prints its own ``/proc/self/status`` and refuses the
sandbox unless those lines say so (``command_held``), and a root worker is first checked for the
capabilities it needs to set them up (``worker_lacks``).

Why the check: emptying the bounding set (bwrap's ``--cap-drop ALL``, setpriv's
``--bounding-set=-all``) takes ``CAP_SETPCAP``. A tools container granted ``CAP_SETUID`` and
``CAP_SETGID`` but not ``CAP_SETPCAP`` ran every agent command with the container's capabilities
still in its bounding set (``CAP_SYS_ADMIN`` among them) under Debian bookworm's bwrap and
setpriv, which said nothing; trixie's setpriv refuses the drop instead ("apply bounding set:
Operation not permitted"). docs/isolation.md, "Commands".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# Linux's capabilities by number (include/uapi/linux/capability.h), 41 of them.
CAP_NAMES = (
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
)
# The capability sets of /proc/<pid>/status; an agent's command must hold none of them.
CAP_FIELDS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")
# What a root worker needs to start a command as its agent's uid with no capabilities: the uid and
# gid switch (setpriv), and emptying the bounding set.
WORKER_NEEDS = ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP")
# The probe's command: its own status, as every program of an agent's command would see it.
PROBE_COMMAND = "cat /proc/self/status"


@dataclass(frozen=True)
class Privileges:
    """The privilege lines of a ``/proc/<pid>/status``: each capability set and ``NoNewPrivs``
    (``None`` where the status lacks the line)."""

    caps: dict[str, int | None]
    no_new_privs: int | None

    @classmethod
    def parse(cls, status: str) -> "Privileges":
        """The lines of ``status`` (a ``/proc/<pid>/status`` text, proc(5)): each ``Cap*`` set as
        an int from its hex mask, ``NoNewPrivs`` from its decimal; a line missing or not a number
        is ``None`` (never raises), which ``command_held`` counts as held."""
        fields: dict[str, str] = {}
        for line in status.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        return cls(
            caps={name: _number(fields.get(name), 16) for name in CAP_FIELDS},
            no_new_privs=_number(fields.get("NoNewPrivs"), 10),
        )

    def line(self) -> str:
        """One line for a log or a report: ``CapInh 0x0, ..., NoNewPrivs 1``."""
        caps = ", ".join(f"{k} {'?' if v is None else hex(v)}" for k, v in self.caps.items())
        return f"{caps}, NoNewPrivs {'?' if self.no_new_privs is None else self.no_new_privs}"


def _number(text: str | None, base: int) -> int | None:
    try:
        return None if text is None else int(text, base)
    except ValueError:
        return None


def cap_names(mask: int) -> list[str]:
    """The capabilities of a mask, by name (a number past the table as ``cap <n>``)."""
    return [CAP_NAMES[i] if i < len(CAP_NAMES) else f"cap {i}" for i in range(mask.bit_length()) if mask >> i & 1]


def command_held(status: str) -> list[str]:
    """What a command whose ``/proc/self/status`` is ``status`` holds that it must not, one entry
    per set (``"CapBnd 0x82010cb (CAP_CHOWN, ...)"``) and for ``NoNewPrivs``; ``[]`` when nothing."""
    privileges = Privileges.parse(status)
    held = []
    for name, mask in privileges.caps.items():
        if mask is None:
            held.append(f"{name} not in the status")
        elif mask:
            held.append(f"{name} {mask:#x} ({', '.join(cap_names(mask))})")
    if privileges.no_new_privs != 1:
        shown = "not in the status" if privileges.no_new_privs is None else privileges.no_new_privs
        held.append(f"NoNewPrivs {shown} (a setuid or file-capability program could gain privileges)")
    return held


def command_refusal(status: str) -> str | None:
    """Why a sandbox whose command printed ``status`` may not run agents' commands, or ``None``."""
    held = command_held(status)
    if not held:
        return None
    return (
        "an agent's command would keep privileges: " + "; ".join(held) + " (every capability set must be "
        "empty and NoNewPrivs 1: a root worker needs CAP_SETPCAP to empty the bounding set)"
    )


def worker_lacks(status: str) -> list[str]:
    """Which of ``WORKER_NEEDS`` a root worker whose status is ``status`` lacks in its effective or
    its bounding set."""
    privileges = Privileges.parse(status)
    effective, bounding = privileges.caps["CapEff"] or 0, privileges.caps["CapBnd"] or 0
    wanted = [(name, CAP_NAMES.index(name)) for name in WORKER_NEEDS]
    return [name for name, bit in wanted if not (effective >> bit & 1 and bounding >> bit & 1)]


def worker_refusal(status: str | None = None) -> str | None:
    """Why this root worker (``status``: its own ``/proc/self/status`` unless given) cannot start
    commands without privileges, or ``None``."""
    lacks = worker_lacks(Path("/proc/self/status").read_text() if status is None else status)
    if not lacks:
        return None
    return (
        f"the tools worker lacks {', '.join(lacks)}: a root worker starts each command as its agent's uid "
        f"with no capabilities, which takes {', '.join(WORKER_NEEDS)} in its effective and bounding sets; "
        "grant them (compose.yaml's worker-tools cap_add, docs/deployment.md \"The tools worker's grants\")"
    )
