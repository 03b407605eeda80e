"""When ``run_command`` needs a person's approval: unless the command is one read-only program
from an allowlist, with no shell operators (``;``, ``&``, ``|``, redirections, substitutions).

The decision is conservative by construction: anything that does not parse, or that could
chain, redirect or substitute, needs approval.
"""

from __future__ import annotations

import shlex
from typing import Any

# Programs that only read (with the options that write or execute refused below).
READ_ONLY_COMMANDS = frozenset(
    {"ls", "cat", "head", "tail", "wc", "grep", "pwd", "echo", "stat", "du", "df", "date", "whoami"}
    | {"file", "sort", "uniq", "diff", "tree", "find", "basename", "dirname", "realpath", "true"}
)
# Characters that chain, redirect, substitute or background a command in bash.
_SHELL_OPERATORS = set(";&|<>`$(){}\n\r\\")
# find's actions that write or run something.
_FIND_ACTIONS = {"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"}


def command_needs_approval(params: Any, ctx: Any = None) -> bool:
    """``needs_approval`` of ``run_command``: False only for one allowlisted read-only program.

    ``params`` has a ``command`` string (``RunCommandParams``). ``sort -o`` (writes a file) and
    ``find -delete``/``-exec`` need approval.
    """
    command = str(getattr(params, "command", "") or "")
    if not command.strip() or any(ch in _SHELL_OPERATORS for ch in command):
        return True
    try:
        argv = shlex.split(command)
    except ValueError:
        return True
    if not argv or argv[0] not in READ_ONLY_COMMANDS:
        return True
    if argv[0] == "find" and any(a in _FIND_ACTIONS for a in argv):
        return True
    if argv[0] == "sort" and any(a == "-o" or a.startswith("--output") for a in argv):
        return True
    return False
