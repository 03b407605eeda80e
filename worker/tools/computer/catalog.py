"""Computer tools: a shell command tool and file tools, confined to the agent home.

``create_computer_tools(ctx)`` returns, in this order:

- ``run_command`` (sequential, destructive): ``bash -c <command>`` with cwd
  in the home, inside the bubblewrap sandbox (``sandbox.py``: no network
  unless the turn allows egress through the proxy of ``egress.py``), a
  minimal environment (no worker secrets), a timeout capped by
  ``settings.command_timeout`` and output capped by
  ``settings.command_output_cap``. A command's lifetime bounds all of its
  descendants: background processes (``cmd &``, ``nohup``, ``setsid``,
  double forks) are stopped when the command ends, times out or is aborted
  (see ``_RUNNER``).
- ``read_file`` (parallel, read-only): lines ``offset..offset+limit-1``.
  Only regular files are read (a FIFO, device or socket is refused, never
  opened in a blocking way).
- ``write_file`` (sequential, destructive): creates parent directories;
  refuses to write to an existing non-regular file.
- ``edit_file`` (sequential, destructive): exact string replacement.
- ``list_files`` (parallel, read-only): a directory listing, optionally recursive.
- ``search_files`` (parallel, read-only): regex or substring search, with the
  ``regex`` package so that each match attempt has a timeout (a
  catastrophically backtracking pattern ends with "pattern too slow").

The file tools open every path through ``worker.tools.computer.home_fs``
(component by component from a descriptor of the home; race-free) and
refuse special files and files with several hard links; ``run_command``'s
``cwd`` is checked with ``worker.tools.computer.confine.resolve_in_home``. User errors
(bad paths, missing files, ambiguous edits, special files, names too long
for the file system) come back as ``ToolResult(is_error=True)`` with a message
for the model; ``execute`` does not raise for them (an ``OSError`` escaping a
tool body is turned into such a result by ``_guarded``).
"""

from __future__ import annotations

from typing import Any, Callable

from worker.settings import Settings
from worker.tooling.contract import ToolContext, ToolResult, WorkerTool, define_worker_tool
from worker.tools.computer import homes
from worker.tools.computer.approval import command_needs_approval
from worker.tools.computer.commands import RunCommandParams, _describe_command, _describe_command_done, _run_command
from worker.tools.computer.common import fail, guarded
from worker.tools.computer.files import (
    EditFileParams,
    ListFilesParams,
    ReadFileParams,
    WriteFileParams,
    _describe_edit,
    _describe_edit_done,
    _describe_list,
    _describe_list_done,
    _describe_read,
    _describe_read_done,
    _describe_write,
    _describe_write_done,
    _edit_file,
    _list_files,
    _read_file,
    _write_file,
)
from worker.tools.computer.launch import NetworkPolicy
from worker.tools.computer.search import SearchFilesParams, _describe_search, _describe_search_done, _search_files
from worker.turn.context import TurnContext

# --------------------------------------------------------------------------- creator


def _bind(fn: Callable[..., ToolResult], settings: Settings) -> Callable[[object, ToolContext], ToolResult]:
    run = guarded(fn)
    return lambda params, ctx: run(params, ctx, settings)


def _at_home(
    run: Callable[[object, ToolContext], ToolResult], settings: Settings
) -> Callable[[object, ToolContext], ToolResult]:
    """``run`` once the home is provisioned (its quota mounted), acting as the agent's uid
    (``AgentHome.as_owner``); a home that cannot be made ready is the call's error output."""

    def execute(params: object, ctx: ToolContext) -> ToolResult:
        try:
            home = homes.provision(settings, ctx.home)
        except homes.HomeUnavailable as exc:
            return fail(str(exc), home="unavailable")
        with home.as_owner():
            return run(params, ctx)

    return execute


def create_computer_tools(ctx: TurnContext) -> list[WorkerTool[Any]]:
    """The computer tools for one turn, confined to ``ctx.home``.

    Order: run_command, read_file, write_file, edit_file, list_files,
    search_files. Every one ``needs_computer``: its calls run on the node holding the agent's
    home (``docs/placement.md``). Limits come from ``ctx.settings``: ``command_timeout``
    (seconds, the ceiling of a command's own timeout), ``command_output_cap``
    (bytes of command output kept) and ``max_output_chars`` (characters of a
    file read).
    """
    settings = ctx.settings
    cap_s = f"{settings.command_timeout:g}"
    policy = NetworkPolicy(mode=ctx.network, allow_hosts=ctx.egress_allow_hosts)
    run_command = guarded(_run_command)

    def command(params: object, tctx: ToolContext) -> ToolResult:
        try:
            home = homes.provision(settings, tctx.home)
        except homes.HomeUnavailable as exc:
            return fail(str(exc), home="unavailable")
        return run_command(params, tctx, settings, policy, home)

    if ctx.network == "egress":
        network = (
            "Network: outbound HTTP(S) only through the proxy set in HTTP_PROXY/HTTPS_PROXY "
            "(public addresses only"
            + (f"; allowed hosts: {', '.join(ctx.egress_allow_hosts)}" if ctx.egress_allow_hosts is not None else "")
            + ")."
        )
    else:
        network = "No network access."
    return [
        define_worker_tool(
            name="run_command",
            description=(
                "Run a shell command (bash -c) in the agent's home directory and return its combined "
                f"stdout/stderr and exit code. Time limit: at most {cap_s}s. Long output is cut in the "
                "middle. The environment is minimal (no credentials); HOME is the agent home. Background "
                "processes are stopped when the command ends (nothing started with & outlives it). "
                f"It runs in a sandbox: only the home is writable, other files are read-only system files. {network}"
            ),
            input_model=RunCommandParams,
            execute=command,
            execution_mode="sequential",
            is_destructive=True,
            needs_approval=command_needs_approval,
            describe_activity=_describe_command,
            needs_computer=True,
            describe_completed_activity=_describe_command_done,
        ),
        define_worker_tool(
            name="read_file",
            description=(
                "Read a text file in the agent home. Returns lines offset..offset+limit-1, numbered "
                "like `cat -n` unless line_numbers=false."
            ),
            input_model=ReadFileParams,
            execute=_at_home(_bind(_read_file, settings), settings),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_read,
            needs_computer=True,
            describe_completed_activity=_describe_read_done,
        ),
        define_worker_tool(
            name="write_file",
            description="Create or overwrite a text file in the agent home (parent directories are created).",
            input_model=WriteFileParams,
            execute=_at_home(guarded(_write_file), settings),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=_describe_write,
            needs_computer=True,
            describe_completed_activity=_describe_write_done,
        ),
        define_worker_tool(
            name="edit_file",
            description=(
                "Replace an exact string in a text file in the agent home. old_string must occur exactly "
                "once (include surrounding lines to make it unique) unless replace_all=true."
            ),
            input_model=EditFileParams,
            execute=_at_home(guarded(_edit_file), settings),
            execution_mode="sequential",
            is_destructive=True,
            describe_activity=_describe_edit,
            needs_computer=True,
            describe_completed_activity=_describe_edit_done,
        ),
        define_worker_tool(
            name="list_files",
            description="List a directory in the agent home, optionally recursively (with an entry cap).",
            input_model=ListFilesParams,
            execute=_at_home(guarded(_list_files), settings),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_list,
            needs_computer=True,
            describe_completed_activity=_describe_list_done,
        ),
        define_worker_tool(
            name="search_files",
            description=(
                "Search text files under a path in the agent home for a regex (or plain text with "
                "literal=true). Returns path:line: text for each matching line, up to max_results."
            ),
            input_model=SearchFilesParams,
            execute=_at_home(guarded(_search_files), settings),
            execution_mode="parallel",
            is_read_only=True,
            describe_activity=_describe_search,
            needs_computer=True,
            describe_completed_activity=_describe_search_done,
        ),
    ]
