"""The ``search_files`` tool: regex or literal search under a path of the agent home, each match attempt timed.

The path is opened with ``home_fs.HomeDir``; directories are walked by
descriptors (``home_fs.walk``) and each file is opened relative to its
directory's descriptor with ``O_NOFOLLOW``. A symlink met on the way is
searched only if it resolves inside the home; special files, files with
several hard links, binary files and files over ``SEARCH_MAX_FILE_BYTES``
are skipped.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import stat
import time
from typing import Iterator, TextIO

import regex
from pydantic import BaseModel, Field

from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.computer.common import BINARY_SNIFF_BYTES, SKIP_DIRS, NotRegularFile, fail, short
from worker.tools.computer.confine import ConfinementError
from worker.tools.computer.home_fs import HardLinkedFile, HomeDir, Opened, require_lone_regular, walk

# Search caps.
SEARCH_DEFAULT_RESULTS = 100
SEARCH_MAX_RESULTS = 1000
SEARCH_MAX_FILE_BYTES = 2_000_000
SEARCH_MAX_LINE_CHARS = 300
SEARCH_TIME_BUDGET = 20.0  # seconds
# Longest one regex search over one line may take (also bounded by what is left of the budget).
SEARCH_PATTERN_TIMEOUT = 2.0  # seconds

# --------------------------------------------------------------------------- search_files


class SearchFilesParams(BaseModel):
    """Input of ``search_files``."""

    pattern: str = Field(..., min_length=1, description="Python regular expression, or plain text when literal=true.")
    path: str = Field(".", description="File or directory to search, relative to the agent home.")
    literal: bool = Field(False, description="Treat pattern as plain text rather than a regex.")
    case_sensitive: bool = Field(True, description="Match case exactly.")
    glob: str | None = Field(None, description="Only search files whose name or relative path matches, e.g. '*.py'.")
    max_results: int = Field(
        SEARCH_DEFAULT_RESULTS, ge=1, le=SEARCH_MAX_RESULTS, description="Stop after this many matching lines."
    )


_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_searchable(hd: HomeDir, dir_fd: int, name: str, from_home: str) -> Opened | None:
    """Open one file met by the walk, or ``None`` to skip it.

    A plain name is opened relative to its directory's descriptor with
    ``O_NOFOLLOW``; a symlink is resolved from the home (skipped if it leads
    out). Then ``_keep`` decides.
    """
    try:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                return None
            return _keep(hd.open(from_home))  # a symlink: followed only while it stays inside
        try:
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            raise
        return _keep(Opened(fd, from_home, st))
    except (ValueError, OSError):
        return None


def _keep(opened: Opened) -> Opened | None:
    """``opened`` (made blocking) if it is a lone regular file, not too big, not binary; else close it."""
    try:
        require_lone_regular(opened.st, opened.rel)
        if opened.st.st_size > SEARCH_MAX_FILE_BYTES or b"\x00" in os.pread(opened.fd, BINARY_SNIFF_BYTES, 0):
            raise NotRegularFile(errno.EINVAL, "skipped")
        os.set_blocking(opened.fd, True)
    except OSError:
        opened.close()
        return None
    return opened


def _candidates(root: Opened, glob: str | None) -> Iterator[tuple[int, str, str]]:
    """``(dir_fd, name, rel)`` of each file under the directory ``root``, by descriptors (``home_fs.walk``)."""
    for rel_dir, dir_fd, dirnames, others in walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for name in others:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            if glob and not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(rel, glob)):
                continue
            yield dir_fd, name, rel


def _search_files(params: SearchFilesParams, ctx: ToolContext) -> ToolResult:
    flags = regex.VERSION0 if params.case_sensitive else regex.VERSION0 | regex.IGNORECASE
    source = regex.escape(params.pattern) if params.literal else params.pattern
    try:
        with HomeDir(ctx.home) as hd:
            try:
                root: Opened | str = hd.open(params.path)
            except NotRegularFile as exc:  # a FIFO, socket or device: nothing to search in
                root = exc.filename or hd.rel(params.path)
            with contextlib.ExitStack() as stack:
                if isinstance(root, Opened):
                    stack.enter_context(root)
                    if stat.S_ISREG(root.st.st_mode) and root.st.st_nlink > 1:
                        try:
                            require_lone_regular(root.st, root.rel)
                        except HardLinkedFile as exc:
                            return fail(f"{root.rel} is {exc.strerror}; not searched")
                shown = root.rel if isinstance(root, Opened) else root
                try:
                    rx = regex.compile(source, flags)
                except (regex.error, ValueError, TypeError, OverflowError, RecursionError) as exc:
                    return fail(
                        f"invalid regular expression {params.pattern!r}: {exc}; set literal=true for plain text"
                    )
                return _run_search(params, ctx, hd, root, shown, rx)
    except ConfinementError as exc:
        return fail(str(exc))
    except FileNotFoundError as exc:
        return fail(f"{exc.filename}: no such file or directory")


_FILE_DONE, _TRUNCATED, _TIMED_OUT = "file done", "truncated", "timed out"


def _scan_file(
    fh: TextIO,
    rx: regex.Pattern[str],
    label: str,
    deadline: float,
    params: SearchFilesParams,
    ctx: ToolContext,
    results: list[str],
    shown: str,
) -> ToolResult | str:
    """Append ``label:line: text`` to ``results`` for each matching line of ``fh``. Returns
    ``_FILE_DONE``, ``_TRUNCATED`` (``max_results`` reached), ``_TIMED_OUT`` (the search's
    ``deadline`` passed), or the failure to return (turn aborted, pattern too slow on a line)."""
    for n, line in enumerate(fh, start=1):
        if ctx.abort.aborted:
            return fail("search cancelled: the turn was aborted")
        left = deadline - time.monotonic()
        if left <= 0:
            return _TIMED_OUT
        per_search = min(left, SEARCH_PATTERN_TIMEOUT)
        try:
            found = rx.search(line, timeout=per_search)
        except TimeoutError:
            if ctx.abort.aborted:
                return fail("search cancelled: the turn was aborted")
            if per_search < SEARCH_PATTERN_TIMEOUT:  # the overall budget ran out
                return _TIMED_OUT
            return fail(
                f"pattern too slow; simplify it: {params.pattern!r} took more than "
                f"{SEARCH_PATTERN_TIMEOUT:g}s on one line ({label}:{n}); avoid nested "
                f"repetition like (a+)+ or use literal=true",
                path=shown,
                pattern_timeout=True,
            )
        if found:
            text = line.rstrip("\n")
            if len(text) > SEARCH_MAX_LINE_CHARS:
                text = text[:SEARCH_MAX_LINE_CHARS] + " […]"
            results.append(f"{label}:{n}: {text}")
            if len(results) >= params.max_results:
                return _TRUNCATED
    return _FILE_DONE


def _run_search(
    params: SearchFilesParams, ctx: ToolContext, hd: HomeDir, root: Opened | str, shown: str, rx: regex.Pattern[str]
) -> ToolResult:
    results: list[str] = []
    files_with_matches = 0
    files_searched = 0
    truncated = False
    timed_out = False
    deadline = time.monotonic() + SEARCH_TIME_BUDGET
    prefix = "" if shown == "." else f"{shown}/"
    if not isinstance(root, Opened):
        files: Iterator[tuple[int, str, str]] = iter(())
    elif stat.S_ISDIR(root.st.st_mode):
        files = _candidates(root, params.glob)
    else:
        files = iter([(-1, "", shown)])
    for dir_fd, name, rel in files:
        if truncated or timed_out:
            break
        if ctx.abort.aborted:
            return fail("search cancelled: the turn was aborted")
        if time.monotonic() > deadline:
            timed_out = True
            break
        if dir_fd < 0:  # the root is the file itself
            assert isinstance(root, Opened)
            label = shown
            opened = _keep(Opened(os.dup(root.fd), shown, root.st))
        else:
            label = prefix + rel
            opened = _open_searchable(hd, dir_fd, name, label)
        if opened is None:
            continue
        try:
            files_searched += 1
            before = len(results)
            with opened, os.fdopen(os.dup(opened.fd), "r", encoding="utf-8", errors="replace") as fh:
                outcome = _scan_file(fh, rx, label, deadline, params, ctx, results, shown)
            if isinstance(outcome, ToolResult):
                return outcome
            files_with_matches += len(results) > before
            truncated, timed_out = outcome == _TRUNCATED, outcome == _TIMED_OUT
            if timed_out:
                break
        except OSError:
            continue
    details = {
        "path": shown,
        "matches": len(results),
        "files_with_matches": files_with_matches,
        "files_searched": files_searched,
        "truncated": truncated,
        "timed_out": timed_out,
    }
    if not results:
        note = " (search time budget ran out)" if timed_out else ""
        return ToolResult(content=f"No matches for {params.pattern!r} in {shown}{note}", details=details)
    body = "\n".join(results)
    if truncated:
        body += f"\n[... stopped at {params.max_results} matches; narrow the pattern, path or glob]"
    if timed_out:
        body += f"\n[... search stopped after {SEARCH_TIME_BUDGET:g}s; narrow the path or glob]"
    return ToolResult(content=body, details=details)


def _describe_search(p: SearchFilesParams) -> str:
    where = "" if p.path in (".", "") else f" in {p.path}"
    return f"Searching for '{short(p.pattern, 40)}'{where}"


def _describe_search_done(p: SearchFilesParams, r: ToolResult) -> str:
    if r.is_error:
        return f"Could not search for '{short(p.pattern, 40)}'"
    n = r.details.get("matches", 0)
    where = "" if p.path in (".", "") else f" in {p.path}"
    more = "+" if r.details.get("truncated") else ""
    return f"Found {n}{more} {'match' if n == 1 else 'matches'} for '{short(p.pattern, 40)}'{where}"
