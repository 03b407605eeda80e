"""The file tools: ``read_file``, ``write_file``, ``edit_file`` and ``list_files``, confined to the agent home.

Every path is opened through ``home_fs.HomeDir`` (component by component from
a descriptor of the home, symlinks followed only while they stay inside) and
the tools act on that descriptor only: read and edit through it, list with
``os.scandir(fd)`` and ``home_fs.walk``. ``write_file`` and ``edit_file``
write a temporary file in the target's directory and rename it over the
target (``HomeDir.write_atomic``, by directory descriptors): a write either
happens whole or not at all, so a full home (its quota) leaves the old file
as it was. ``read_file`` and ``edit_file`` stream
(``worker.tools.computer.streams``): their memory does not grow with the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import BaseModel, Field

from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.computer.common import (
    BINARY_SNIFF_BYTES,
    SKIP_DIRS,
    NotRegularFile,
    count_lines,
    fail,
    os_reason,
    plural,
)
from worker.tools.computer.confine import ConfinementError
from worker.tools.computer.home_fs import HomeDir, Opened, require_lone_regular, walk
from worker.tools.computer.streams import copy_replacing, count_occurrences, iter_lines

# Reads: default/maximum lines per call, longest line kept, bytes sniffed for binary.
READ_DEFAULT_LINES = 2000
READ_MAX_LINE_CHARS = 2000
# Bytes kept of a line while reading: enough for READ_MAX_LINE_CHARS characters of UTF-8.
READ_MAX_LINE_BYTES = 4 * READ_MAX_LINE_CHARS
# Listing caps.
LIST_DEFAULT_ENTRIES = 200
LIST_MAX_ENTRIES = 2000

# --------------------------------------------------------------------------- read_file


class ReadFileParams(BaseModel):
    """Input of ``read_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    offset: int = Field(1, ge=1, description="First line to read (1-based).")
    limit: int = Field(READ_DEFAULT_LINES, ge=1, le=READ_DEFAULT_LINES, description="Maximum number of lines to read.")
    line_numbers: bool = Field(True, description="Prefix each line with its number.")


def _open(
    home: Path, path: str, verb: str, missing: str, flags: int = os.O_RDONLY, **kw: object
) -> Opened | ToolResult:
    """Open ``path`` race-free in the home, or the error result for the usual refusals."""
    try:
        with HomeDir(home) as hd:
            return _open_in(hd, path, verb, missing, flags, **kw)
    except ConfinementError as exc:
        return fail(str(exc))


def _open_in(hd: HomeDir, path: str, verb: str, missing: str, flags: int, **kw: object) -> Opened | ToolResult:
    try:
        return hd.open(path, flags, **kw)  # type: ignore[arg-type]
    except ConfinementError as exc:
        return fail(str(exc))
    except FileNotFoundError as exc:
        return fail(f"{exc.filename}: {missing}")
    except NotRegularFile as exc:
        return fail(f"{exc.filename} is {exc.strerror}; not {verb}")


def _read_file(params: ReadFileParams, ctx: ToolContext, settings: Settings) -> ToolResult:
    opened = _open(ctx.home, params.path, "read", "no such file")
    if isinstance(opened, ToolResult):
        return opened
    with opened:
        shown = opened.rel
        if stat.S_ISDIR(opened.st.st_mode):
            return fail(f"{shown} is a directory; use list_files")
        try:
            require_lone_regular(opened.st, shown)
        except NotRegularFile as exc:
            return fail(f"{shown} is {exc.strerror}; not read")
        try:
            if b"\x00" in os.pread(opened.fd, BINARY_SNIFF_BYTES, 0):
                return fail(f"{shown} looks like a binary file; not shown")
            char_cap = settings.max_output_chars
            out: list[str] = []
            size = 0
            last = params.offset - 1
            total = 0
            stopped_at_cap = False
            end = params.offset + params.limit - 1
            # Read through the descriptor that was checked, by chunks: only the first bytes of each
            # line are kept (a 300 MB one-line file costs a chunk, not 300 MB).
            for n, (head, cut) in enumerate(iter_lines(opened.fd, READ_MAX_LINE_BYTES), start=1):
                total = n
                if n < params.offset or n > end or stopped_at_cap:
                    continue
                text = head.decode("utf-8", errors="replace")
                if cut or len(text) > READ_MAX_LINE_CHARS:
                    text = text[:READ_MAX_LINE_CHARS] + f" [... line cut at {READ_MAX_LINE_CHARS} chars]"
                rendered = f"{n:>6}\t{text}" if params.line_numbers else text
                if size + len(rendered) + 1 > char_cap and out:
                    stopped_at_cap = True
                    continue
                out.append(rendered)
                size += len(rendered) + 1
                last = n
        except OSError as exc:
            return fail(f"{shown}: cannot read ({os_reason(exc)})")
    lines_read = len(out)
    details = {"path": shown, "lines_read": lines_read, "total_lines": total, "first_line": params.offset}
    if total == 0:
        return ToolResult(content=f"{shown} is empty", details=details)
    if params.offset > total:
        return fail(f"{shown} has {plural(total, 'line')}; offset {params.offset} is past the end", **details)
    text = "\n".join(out)
    if last < total:
        why = "output size cap" if stopped_at_cap else "line limit"
        text += f"\n[... showed lines {params.offset}-{last} of {total} ({why}); read on with offset={last + 1}]"
    return ToolResult(content=text, details=details)


def _describe_read(p: ReadFileParams) -> str:
    return f"Reading {p.path}"


def _describe_read_done(p: ReadFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not read {p.path}"
    return f"Read {plural(r.details.get('lines_read', 0), 'line')} of {r.details.get('path', p.path)}"


# --------------------------------------------------------------------------- write_file / edit_file


class WriteFileParams(BaseModel):
    """Input of ``write_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    content: str = Field(..., description="The full new content of the file (UTF-8 text).")


def _write_file(params: WriteFileParams, ctx: ToolContext) -> ToolResult:
    """Replace (or create) a file whole: the content goes to a temporary file in the same directory,
    renamed over the name (``HomeDir.write_atomic``), so a write that fails (the home's quota) leaves
    the file as it was. An existing file keeps its permission bits; a FIFO, device or hard-linked
    file at the name is refused, as it is for reading."""
    data = params.content.encode("utf-8")
    try:
        hd = HomeDir(ctx.home)
    except ConfinementError as exc:
        return fail(str(exc))
    with hd:
        mode = 0o644
        existed = False
        try:
            current = hd.open(params.path)
        except FileNotFoundError:
            current = None
        except IsADirectoryError as exc:
            return fail(f"{exc.filename} is a directory")
        except NotADirectoryError as exc:
            return fail(f"{exc.filename}: a parent of the path is not a directory")
        except ConfinementError as exc:
            return fail(str(exc))
        except NotRegularFile as exc:
            return fail(f"{exc.filename} is {exc.strerror}; not written")
        if current is not None:
            with current:
                if stat.S_ISDIR(current.st.st_mode):
                    return fail(f"{current.rel} is a directory")
                try:
                    require_lone_regular(current.st, current.rel)
                except NotRegularFile as exc:
                    return fail(f"{current.rel} is {exc.strerror}; not written")
                mode, existed, target = stat.S_IMODE(current.st.st_mode), True, current.rel
        else:
            target = params.path
        try:
            shown = hd.write_atomic(target, data, mode=mode)
        except ConfinementError as exc:
            return fail(str(exc))
        except IsADirectoryError as exc:
            return fail(f"{exc.filename} is a directory")
        except NotADirectoryError as exc:
            return fail(f"{exc.filename}: a parent of the path is not a directory")
        except OSError as exc:
            unchanged = "; the file is unchanged" if existed else "; nothing was written"
            return fail(f"{hd.rel(target)}: cannot write ({os_reason(exc)}){unchanged}")
    lines = count_lines(params.content)
    verb = "Overwrote" if existed else "Created"
    return ToolResult(
        content=f"{verb} {shown} ({plural(lines, 'line')}, {len(data):,} bytes)",
        details={"path": shown, "lines": lines, "bytes": len(data), "created": not existed},
    )


def _describe_write(p: WriteFileParams) -> str:
    return f"Writing {p.path}"


def _describe_write_done(p: WriteFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not write {p.path}"
    return f"Wrote {plural(r.details.get('lines', 0), 'line')} to {r.details.get('path', p.path)}"


class EditFileParams(BaseModel):
    """Input of ``edit_file``."""

    path: str = Field(..., min_length=1, description="File path relative to the agent home.")
    old_string: str = Field(..., min_length=1, description="Exact text to replace (must occur exactly once).")
    new_string: str = Field(..., description="Replacement text.")
    replace_all: bool = Field(False, description="Replace every occurrence instead of requiring exactly one.")


def _edit_file(params: EditFileParams, ctx: ToolContext) -> ToolResult:
    """Replace ``old_string`` in a file, streaming: the file is scanned by chunks (count, UTF-8
    check) and the new content written by chunks to a temporary file renamed over it
    (``HomeDir.write_atomic``), so memory stays bounded whatever the file's size, and a failed
    write (the home's quota) leaves the file as it was."""
    if params.old_string == params.new_string:
        return fail("old_string and new_string are identical; nothing to change")
    old, new = params.old_string.encode("utf-8"), params.new_string.encode("utf-8")
    try:
        hd = HomeDir(ctx.home)
    except ConfinementError as exc:
        return fail(str(exc))
    with hd:
        opened = _open_in(hd, params.path, "edited", "no such file", os.O_RDONLY)
        if isinstance(opened, ToolResult):
            return opened
        with opened:
            shown = opened.rel
            if stat.S_ISDIR(opened.st.st_mode):
                return fail(f"{shown} is a directory, not a regular file; not edited")
            try:
                require_lone_regular(opened.st, shown)
            except NotRegularFile as exc:
                return fail(f"{shown} is {exc.strerror}; not edited")
            try:
                if b"\x00" in os.pread(opened.fd, BINARY_SNIFF_BYTES, 0):
                    return fail(f"{shown} looks like a binary file; not edited")
                count = count_occurrences(opened.fd, old)  # bytes as they are: CRLF stays CRLF
            except UnicodeDecodeError:
                return fail(f"{shown} is not valid UTF-8 text; not edited")
            except OSError as exc:
                return fail(f"{shown}: cannot read ({os_reason(exc)})")
            if count == 0:
                return fail(f"old_string was not found in {shown}; read the file and copy the text exactly")
            if count > 1 and not params.replace_all:
                return fail(
                    f"old_string occurs {count} times in {shown}; include more surrounding text to make it "
                    f"unique, or set replace_all=true"
                )
            try:
                # The content comes from the descriptor that was read and checked; the rename goes
                # to its real path (an edit through a symlink inside the home edits the target).
                hd.write_atomic(
                    shown, lambda out: copy_replacing(opened.fd, out, old, new), mode=stat.S_IMODE(opened.st.st_mode)
                )
            except OSError as exc:
                return fail(f"{shown}: cannot write ({os_reason(exc)}); the file is unchanged")
    return ToolResult(
        content=f"Edited {shown}: {plural(count, 'replacement')}", details={"path": shown, "replacements": count}
    )


def _describe_edit(p: EditFileParams) -> str:
    return f"Editing {p.path}"


def _describe_edit_done(p: EditFileParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not edit {p.path}"
    return f"Edited {r.details.get('path', p.path)} ({plural(r.details.get('replacements', 0), 'replacement')})"


# --------------------------------------------------------------------------- list_files


class ListFilesParams(BaseModel):
    """Input of ``list_files``."""

    path: str = Field(".", description="Directory relative to the agent home (default: the home).")
    recursive: bool = Field(False, description="List subdirectories too (skips .git, node_modules and the like).")
    include_hidden: bool = Field(False, description="Include names starting with a dot.")
    max_entries: int = Field(
        LIST_DEFAULT_ENTRIES, ge=1, le=LIST_MAX_ENTRIES, description="Stop after this many entries."
    )


def _entry_line(hd: HomeDir, dir_fd: int, name: str, rel: str, from_home: str) -> str:
    """One listing line; ``rel`` is shown, ``from_home`` locates the entry for the symlink check."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            target = os.readlink(name, dir_fd=dir_fd)
            where = "" if hd.leads_inside(from_home) else " (outside the home: not accessible)"
            return f"{rel} -> {target}{where}"
        if stat.S_ISDIR(st.st_mode):
            return rel + "/"
        return f"{rel}  ({st.st_size:,} bytes)"
    except OSError:
        return rel


def _list_files(params: ListFilesParams, ctx: ToolContext) -> ToolResult:
    opened = _open(ctx.home, params.path, "listed", "no such directory")
    if isinstance(opened, ToolResult):
        return opened
    shown = opened.rel
    if not stat.S_ISDIR(opened.st.st_mode):
        opened.close()
        return fail(f"{shown} is a file, not a directory; use read_file")
    lines: list[str] = []
    truncated = False

    def visible(name: str) -> bool:
        return params.include_hidden or not name.startswith(".")

    def under(rel: str) -> str:
        return rel if shown == "." else f"{shown}/{rel}"

    try:
        with opened, HomeDir(ctx.home) as hd:
            if params.recursive:
                for rel_dir, dir_fd, dirnames, others in walk(opened):
                    dirnames[:] = [d for d in dirnames if visible(d) and d not in SKIP_DIRS]
                    for name in sorted(dirnames + [f for f in others if visible(f)]):
                        if len(lines) >= params.max_entries:
                            truncated = True
                            break
                        rel = f"{rel_dir}/{name}" if rel_dir else name
                        lines.append(_entry_line(hd, dir_fd, name, rel, under(rel)))
                    if truncated:
                        break
            else:
                with os.scandir(opened.fd) as it:
                    names = sorted(e.name for e in it if visible(e.name))
                for name in names:
                    if len(lines) >= params.max_entries:
                        truncated = True
                        break
                    lines.append(_entry_line(hd, opened.fd, name, name, under(name)))
    except OSError as exc:
        return fail(f"{shown}: cannot list ({os_reason(exc)})")
    header = f"{shown}/" if shown != "." else "./ (agent home)"
    body = "\n".join(lines) if lines else "(empty)"
    if truncated:
        body += f"\n[... listing stopped at {params.max_entries} entries; narrow the path or raise max_entries]"
    return ToolResult(
        content=f"{header}\n{body}", details={"path": shown, "entries": len(lines), "truncated": truncated}
    )


def _describe_list(p: ListFilesParams) -> str:
    return f"Listing {p.path}" + (" recursively" if p.recursive else "")


def _describe_list_done(p: ListFilesParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not list {p.path}"
    more = "+" if r.details.get("truncated") else ""
    return f"Listed {r.details.get('entries', 0)}{more} entries in {r.details.get('path', p.path)}"
