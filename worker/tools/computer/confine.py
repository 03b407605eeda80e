"""Path confinement to the agent's home directory.

Every file and command tool resolves the paths the model gives through
``resolve_in_home``. The rule:

- a relative path resolves under the home; ``~`` and ``~/x`` mean the home;
- an absolute path is accepted only if it lies inside the home;
- ``..`` may not climb out of the home (checked lexically first);
- symlinks are resolved (``os.path.realpath`` on the final path, which also
  resolves every parent) and the *real* location must still lie inside the
  home. A symlink inside the home that points inside the home is fine; one
  that points outside (or a symlinked parent directory that does) is refused
  instead of being followed. A dangling symlink is judged by its target.

Refusals raise ``ConfinementError`` whose message is fit to show the model.

``resolve_in_home`` returns a *path*: whoever opens it later follows its
parents again, so a symlink swapped in between escapes. The file tools,
``todo`` and ``skills`` therefore never open what it returns: they go through
``worker.tools.computer.home_fs``, which applies the lexical rule here
(``lexical_parts``) and then resolves one component at a time from a
descriptor of the home. ``resolve_in_home`` remains for the command tool's
working directory (a command can reach anything its sandbox allows anyway).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path


class ConfinementError(ValueError):
    """A path the agent may not use: outside its home, or not a usable path."""


def home_root(home: Path | str) -> Path:
    """The real (symlink-free, absolute) path of the home; created if missing."""
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(home))


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


# Longest path the tools accept (bytes, Linux PATH_MAX); longer is refused before any
# file system call, so a deep "d/d/d/..." never creates thousands of directories.
PATH_MAX = 4096


def lexical_parts(
    home: Path | str, path: str | os.PathLike[str] | None, *, root: str | None = None
) -> tuple[str, list[str]]:
    """Apply the lexical half of the rule: ``(real home path, components under it)``.

    ``path`` as given by the model (``None`` or blank mean the home; ``~`` and
    ``~/x`` mean the home). The components are normalized (no ``.``, ``..``
    or empty ones); ``[]`` is the home itself. Symlinks are *not* looked at.
    Raises ``ConfinementError`` for a NUL byte, a ``..`` above the home or an
    absolute path outside it, and ``OSError(ENAMETOOLONG)`` for a path over
    ``PATH_MAX`` bytes. ``root``: the home's real path when the caller
    already has it (skips ``home_root``'s ``mkdir`` and ``realpath``).
    """
    raw = "." if path is None else os.fspath(path)
    if "\x00" in raw:
        raise ConfinementError("path contains a NUL byte")
    raw = raw.strip() or "."
    if len(raw.encode("utf-8", "surrogateescape")) >= PATH_MAX:
        raise OSError(errno.ENAMETOOLONG, "path too long", raw[:80])
    root = root or str(home_root(home))
    given_home = os.path.abspath(os.fspath(home))
    if raw == "~" or raw.startswith("~/"):
        raw = "." + raw[1:]
    if os.path.isabs(raw):
        lexical = os.path.normpath(raw)
        # Accept the home spelled either way (as configured or as its real path).
        if _within(lexical, given_home) and not _within(lexical, root):
            lexical = root + lexical[len(given_home) :]
        if not _within(lexical, root):
            raise ConfinementError(f"{raw} is outside the agent home; use a path relative to the home")
    else:
        lexical = os.path.normpath(os.path.join(root, raw))
        if not _within(lexical, root):
            raise ConfinementError(f"{raw} escapes the agent home (no '..' above the home)")
    rest = lexical[len(root) :].strip(os.sep)
    return root, [p for p in rest.split(os.sep) if p]


def symlink_escape(raw: str) -> ConfinementError:
    """The refusal for a path that leads out of the home through a symlink."""
    return ConfinementError(f"{raw} resolves through a symlink to a location outside the agent home; refused")


def resolve_in_home(home: Path | str, path: str | os.PathLike[str] | None) -> Path:
    """Resolve ``path`` (as given by the model) to a real path inside ``home``.

    Returns an absolute ``Path`` with every symlink resolved. The target need
    not exist (so that writes can create it). Raises ``ConfinementError`` when
    the path is empty of meaning (NUL bytes), escapes the home lexically
    (``..``, an absolute path elsewhere), or resolves through a symlink to a
    place outside the home. Only a check: opening the result later is racy
    (see the module docstring); files are opened through ``home_fs``.
    """
    root, parts = lexical_parts(home, path)
    real = os.path.realpath(os.path.join(root, *parts))
    if not _within(real, root):
        raise symlink_escape(("." if path is None else os.fspath(path)).strip() or ".")
    return Path(real)


def display_path(home: Path | str, real: Path | str) -> str:
    """``real`` relative to the home's real path, for labels and outputs ("." for the home)."""
    root = str(home_root(home))
    real = os.fspath(real)
    if real == root:
        return "."
    if _within(real, root):
        return real[len(root.rstrip(os.sep)) + 1 :]
    return real
