"""The ``search_files`` tool: regex or literal search under a path of the agent home, each match attempt timed."""

from __future__ import annotations

import fnmatch
import os
import time
from pathlib import Path
from typing import Iterator

import regex
from pydantic import BaseModel, Field

from worker.tooling.contract import ToolContext, ToolResult
from worker.tools.computer.common import fail, is_binary, open_regular, short
from worker.tools.computer.confine import ConfinementError, display_path, is_inside_home, resolve_in_home

# Listing and search caps.
LIST_DEFAULT_ENTRIES = 200
LIST_MAX_ENTRIES = 2000
SEARCH_DEFAULT_RESULTS = 100
SEARCH_MAX_RESULTS = 1000
SEARCH_MAX_FILE_BYTES = 2_000_000
SEARCH_MAX_LINE_CHARS = 300
SEARCH_TIME_BUDGET = 20.0  # seconds
# Longest one regex search over one line may take (also bounded by what is left of the budget).
SEARCH_PATTERN_TIMEOUT = 2.0  # seconds
# Directories skipped by recursive listing and search (noise, not secrets).
SKIP_DIRS = frozenset({".git", "node_modules", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache"})

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


def _iter_search_files(root: Path, glob: str | None) -> Iterator[Path]:
    if root.is_file():
        yield root
        return
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in sorted(filenames):
            full = Path(dirpath) / name
            if glob:
                rel = str(full.relative_to(root))
                if not (fnmatch.fnmatch(name, glob) or fnmatch.fnmatch(rel, glob)):
                    continue
            yield full


def _search_files(params: SearchFilesParams, ctx: ToolContext) -> ToolResult:
    try:
        root = resolve_in_home(ctx.home, params.path)
    except ConfinementError as exc:
        return fail(str(exc))
    shown = display_path(ctx.home, root)
    if not root.exists():
        return fail(f"{shown}: no such file or directory")
    flags = regex.VERSION0 if params.case_sensitive else regex.VERSION0 | regex.IGNORECASE
    source = regex.escape(params.pattern) if params.literal else params.pattern
    try:
        rx = regex.compile(source, flags)
    except (regex.error, ValueError, TypeError, OverflowError, RecursionError) as exc:
        return fail(f"invalid regular expression {params.pattern!r}: {exc}; set literal=true for plain text")
    results: list[str] = []
    files_with_matches = 0
    files_searched = 0
    truncated = False
    timed_out = False
    deadline = time.monotonic() + SEARCH_TIME_BUDGET
    for full in _iter_search_files(root, params.glob):
        if truncated or timed_out:
            break
        if ctx.abort.aborted:
            return fail("search cancelled: the turn was aborted")
        if time.monotonic() > deadline:
            timed_out = True
            break
        try:
            if full.is_symlink() and not is_inside_home(ctx.home, full):
                continue  # never read through a symlink that leaves the home
            if not full.is_file() or full.stat().st_size > SEARCH_MAX_FILE_BYTES or is_binary(full):
                continue
            files_searched += 1
            matched_here = False
            rel = str(full.relative_to(root)) if root.is_dir() else display_path(ctx.home, full)
            if root.is_dir() and shown != ".":
                rel = f"{shown}/{rel}"
            with open_regular(full, "r", encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, start=1):
                    if ctx.abort.aborted:
                        return fail("search cancelled: the turn was aborted")
                    left = deadline - time.monotonic()
                    if left <= 0:
                        timed_out = True
                        break
                    per_search = min(left, SEARCH_PATTERN_TIMEOUT)
                    try:
                        found = rx.search(line, timeout=per_search)
                    except TimeoutError:
                        if ctx.abort.aborted:
                            return fail("search cancelled: the turn was aborted")
                        if per_search < SEARCH_PATTERN_TIMEOUT:  # the overall budget ran out
                            timed_out = True
                            break
                        return fail(
                            f"pattern too slow; simplify it: {params.pattern!r} took more than "
                            f"{SEARCH_PATTERN_TIMEOUT:g}s on one line ({rel}:{n}); avoid nested "
                            f"repetition like (a+)+ or use literal=true",
                            path=shown,
                            pattern_timeout=True,
                        )
                    if found:
                        matched_here = True
                        text = line.rstrip("\n")
                        if len(text) > SEARCH_MAX_LINE_CHARS:
                            text = text[:SEARCH_MAX_LINE_CHARS] + " […]"
                        results.append(f"{rel}:{n}: {text}")
                        if len(results) >= params.max_results:
                            truncated = True
                            break
            files_with_matches += matched_here
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
