"""When ``run_command`` needs a person's approval: unless the command is one read-only program
from an allowlist, with no shell operators (``;``, ``&``, ``|``, redirections, substitutions).

The decision is conservative by construction: anything that does not parse, or that could
chain, redirect or substitute, needs approval.
"""

from __future__ import annotations

import shlex

# Programs that only read, whatever their options (``find``'s writing actions refused below).
# Not here, because an option or an operand makes them write: ``sort`` (``-o``, also as ``-uo``
# or ``-oFILE``), ``uniq`` (a second operand is its output file), ``tree`` (``-o``), ``file``
# (``-C`` compiles a magic file), ``date`` (``-s``), ``tee``, ``cp``, ``env``/``xargs``/``nice``/
# ``timeout`` (they run another program).
READ_ONLY_COMMANDS = frozenset(
    {"ls", "cat", "head", "tail", "wc", "grep", "pwd", "echo", "stat", "du", "df", "whoami"}
    | {"diff", "find", "basename", "dirname", "realpath", "true"}
)
# Characters that chain, redirect, substitute or background a command in bash.
_SHELL_OPERATORS = set(";&|<>`$(){}\n\r\\")
# find's actions that write or run something.
_FIND_ACTIONS = {"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"}


def command_needs_approval(params: object, ctx: object = None) -> bool:
    """``needs_approval`` of ``run_command``: False only for one allowlisted read-only program.

    ``params`` has a ``command`` string (``RunCommandParams``). ``find`` with an action that
    writes or runs something (``-delete``, ``-exec``, ``-fprint``...) needs approval.
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
    return False
