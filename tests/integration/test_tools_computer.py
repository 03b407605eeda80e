"""Computer tools called directly: confinement, commands, file semantics, labels."""

from __future__ import annotations

import errno
import os
import signal
import socket
import stat
import sys
import threading
import time
from pathlib import Path

import pytest

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, WorkerTool
from worker.tools.computer import homes
from worker.tools.computer import search as computer_search
from worker.tools.computer.catalog import create_computer_tools
from worker.turn.context import TurnContext


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home as the worker makes it: its own quota file system, mounted (``homes.provision``)."""
    h = tmp_path / "home"
    h.mkdir()
    homes.provision(Settings(), h)
    return h


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    o = tmp_path / "outside"
    o.mkdir()
    (o / "secret.txt").write_text("TOP SECRET\n")
    return o


def make_tools(home: Path, **settings) -> dict[str, WorkerTool]:
    ctx = TurnContext(turn_id="t1", agent_id="a1", home=home, settings=Settings(**settings))
    return {t.name: t for t in create_computer_tools(ctx)}


def call(tool: WorkerTool, home: Path, abort: AbortSignal | None = None, **params) -> ToolResult:
    assert tool.input_model is not None
    p = tool.input_model.model_validate(params)
    return tool.execute(p, ToolContext(turn_id="t1", call_id="c1", home=home, abort=abort or AbortSignal()))


def test_tool_set_modes_and_flags(home):
    tools = make_tools(home)
    assert list(tools) == ["run_command", "read_file", "write_file", "edit_file", "list_files", "search_files"]
    for name in ("run_command", "write_file", "edit_file"):
        assert tools[name].execution_mode == "sequential" and tools[name].is_destructive
    for name in ("read_file", "list_files", "search_files"):
        assert tools[name].execution_mode == "parallel" and tools[name].is_read_only


# ----------------------------------------------------------------- confinement


@pytest.mark.parametrize("tool_name", ["read_file", "write_file", "edit_file", "list_files", "search_files"])
def test_dotdot_escape_refused(home, outside, tool_name):
    tools = make_tools(home)
    params = {
        "read_file": {"path": "../outside/secret.txt"},
        "write_file": {"path": "../outside/new.txt", "content": "x"},
        "edit_file": {"path": "../outside/secret.txt", "old_string": "TOP", "new_string": "LOW"},
        "list_files": {"path": "../outside"},
        "search_files": {"pattern": "SECRET", "path": "../outside"},
    }[tool_name]
    r = call(tools[tool_name], home, **params)
    assert r.is_error
    assert "escapes the agent home" in r.content
    assert "TOP SECRET" not in r.content
    assert not (outside / "new.txt").exists()
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_absolute_path_outside_refused_inside_allowed(home, outside):
    tools = make_tools(home)
    r = call(tools["read_file"], home, path=str(outside / "secret.txt"))
    assert r.is_error and "outside the agent home" in r.content
    r = call(tools["read_file"], home, path="/etc/passwd")
    assert r.is_error and "outside the agent home" in r.content
    (home / "ok.txt").write_text("fine\n")
    r = call(tools["read_file"], home, path=str(home / "ok.txt"))
    assert not r.is_error and "fine" in r.content


def test_symlink_to_outside_file_refused(home, outside):
    (home / "link.txt").symlink_to(outside / "secret.txt")
    tools = make_tools(home)
    r = call(tools["read_file"], home, path="link.txt")
    assert r.is_error and "symlink" in r.content and "TOP SECRET" not in r.content
    r = call(tools["write_file"], home, path="link.txt", content="pwned")
    assert r.is_error
    r = call(tools["edit_file"], home, path="link.txt", old_string="TOP", new_string="LOW")
    assert r.is_error
    assert (outside / "secret.txt").read_text() == "TOP SECRET\n"


def test_symlinked_parent_dir_refused(home, outside):
    (home / "data").symlink_to(outside, target_is_directory=True)
    tools = make_tools(home)
    r = call(tools["read_file"], home, path="data/secret.txt")
    assert r.is_error and "symlink" in r.content
    r = call(tools["write_file"], home, path="data/sub/new.txt", content="x")
    assert r.is_error
    assert not (outside / "sub").exists()
    r = call(tools["list_files"], home, path="data")
    assert r.is_error
    r = call(tools["run_command"], home, command="pwd", cwd="data")
    assert r.is_error


def test_dangling_symlink_outside_refused_for_write(home, outside):
    (home / "later.txt").symlink_to(outside / "not-yet.txt")
    tools = make_tools(home)
    r = call(tools["write_file"], home, path="later.txt", content="x")
    assert r.is_error
    assert not (outside / "not-yet.txt").exists()


def test_symlink_inside_home_is_followed(home):
    (home / "real.txt").write_text("a\nb\n")
    (home / "alias.txt").symlink_to(home / "real.txt")
    tools = make_tools(home)
    r = call(tools["read_file"], home, path="alias.txt")
    assert not r.is_error and "a" in r.content


def test_search_and_list_do_not_read_through_outside_symlinks(home, outside):
    (home / "notes.txt").write_text("SECRET? no, public\n")
    (home / "leak.txt").symlink_to(outside / "secret.txt")
    (home / "leakdir").symlink_to(outside, target_is_directory=True)
    tools = make_tools(home)
    r = call(tools["search_files"], home, pattern="SECRET")
    assert not r.is_error
    assert "notes.txt:1:" in r.content
    assert "TOP SECRET" not in r.content
    r = call(tools["list_files"], home, recursive=True)
    assert "leak.txt ->" in r.content and "outside the home" in r.content
    assert "secret.txt" not in r.content.replace(str(outside / "secret.txt"), "")


# ----------------------------------------------------------------- run_command


def test_run_command_basic_cwd_and_labels(home):
    tools = make_tools(home)
    tool = tools["run_command"]
    r = call(tool, home, command="pwd; echo hello; echo oops >&2; exit 3")
    assert not r.is_error
    assert str(home.resolve()) in r.content
    assert "hello" in r.content and "oops" in r.content
    assert "[exit code 3]" in r.content
    assert r.details["exit_code"] == 3
    p = tool.input_model.model_validate({"command": "pytest -q"})
    assert tool.activity(p) == "Running `pytest -q`"
    ok = call(tool, home, command="true")
    assert tool.completed_activity(tool.input_model.model_validate({"command": "true"}), ok) == "Ran `true` (exit 0)"


def test_run_command_env_has_no_secrets(home, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-should-not-leak-123")
    monkeypatch.setenv("REDIS_URL", "redis://:hunter2@127.0.0.1:6379/0")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-should-not-leak")
    tools = make_tools(home)
    r = call(tools["run_command"], home, command="env; echo HOME=$HOME")
    assert "sk-test-should-not-leak-123" not in r.content
    assert "OPENAI_API_KEY" not in r.content
    assert "hunter2" not in r.content
    assert "aws-should-not-leak" not in r.content
    assert f"HOME={home.resolve()}" in r.content
    assert "PATH=" in r.content


def test_run_command_timeout_kills(home):
    tools = make_tools(home, command_timeout=30)
    t0 = time.monotonic()
    r = call(tools["run_command"], home, command="echo started; sleep 20; echo never", timeout_seconds=1)
    assert time.monotonic() - t0 < 8
    assert r.is_error
    assert "timed out after 1s" in r.content
    assert "started" in r.content and "never" not in r.content
    assert r.details["outcome"] == "timeout"


def test_run_command_timeout_capped_by_settings(home):
    tools = make_tools(home, command_timeout=1)
    t0 = time.monotonic()
    r = call(tools["run_command"], home, command="sleep 20", timeout_seconds=600)
    assert time.monotonic() - t0 < 8
    assert r.is_error and "timed out after 1s" in r.content


def test_run_command_output_cap_marker(home):
    tools = make_tools(home, command_output_cap=1000)
    r = call(tools["run_command"], home, command="head -c 100000 /dev/zero | tr '\\0' 'x'; echo; echo THE-END")
    assert not r.is_error
    assert "bytes of output cut" in r.content
    assert r.details["output_cut_bytes"] == r.details["output_bytes"] - 1000
    assert r.details["output_bytes"] >= 100000
    assert "THE-END" in r.content  # the tail is kept
    assert r.content.count("x") <= 1000


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("State:"):
                    return "Z" not in line.split()[1]
    except FileNotFoundError:
        return False
    return False


def host_pids(marker: str) -> list[int]:
    """Live host processes whose command line contains ``marker`` (sandboxed commands see their own
    PID namespace, so the pids they print mean nothing on the host)."""
    needle = marker.encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ")
        except OSError:
            continue
        if needle in cmdline and b"pytest" not in cmdline and _alive(int(name)):
            found.append(int(name))
    return found


def _wait_gone(marker: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while host_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return host_pids(marker)


def _kill_marked(marker: str) -> None:
    for pid in host_pids(marker):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_abort_kills_process_group(home):
    tools = make_tools(home, command_timeout=60)
    abort = AbortSignal()
    threading.Timer(1.0, abort.abort).start()
    t0 = time.monotonic()
    # A grandchild in the background plus a foreground sleep: both must die.
    try:
        r = call(tools["run_command"], home, abort=abort, command="sleep 45.0311 & sleep 50.0311")
        assert time.monotonic() - t0 < 10
        assert r.is_error and "aborted" in r.content
        assert _wait_gone(".0311") == []
    finally:
        _kill_marked(".0311")


def test_background_child_holding_pipe_does_not_hang(home):
    tools = make_tools(home)
    t0 = time.monotonic()
    r = call(tools["run_command"], home, command="sleep 30 & echo done")
    assert time.monotonic() - t0 < 8
    assert "done" in r.content and "[exit code 0]" in r.content


# ----------------------------------------------------------------- read / write / edit


def test_write_then_read_with_offsets_and_labels(home):
    tools = make_tools(home)
    w = tools["write_file"]
    content = "".join(f"line {i}\n" for i in range(1, 13))
    r = call(w, home, path="deep/dir/notes.md", content=content)
    assert not r.is_error
    assert (home / "deep/dir/notes.md").read_text() == content
    pw = w.input_model.model_validate({"path": "deep/dir/notes.md", "content": content})
    assert w.activity(pw) == "Writing deep/dir/notes.md"
    assert w.completed_activity(pw, r) == "Wrote 12 lines to deep/dir/notes.md"

    rd = tools["read_file"]
    r = call(rd, home, path="deep/dir/notes.md", offset=3, limit=2)
    assert r.content.splitlines()[:2] == ["     3\tline 3", "     4\tline 4"]
    assert "offset=5" in r.content
    pr = rd.input_model.model_validate({"path": "deep/dir/notes.md", "offset": 3, "limit": 2})
    assert rd.activity(pr) == "Reading deep/dir/notes.md"
    assert rd.completed_activity(pr, r) == "Read 2 lines of deep/dir/notes.md"
    r = call(rd, home, path="deep/dir/notes.md", line_numbers=False)
    assert r.content == content.rstrip("\n")
    r = call(rd, home, path="deep/dir/notes.md", offset=99)
    assert r.is_error and "past the end" in r.content


def test_read_errors(home):
    tools = make_tools(home)
    r = call(tools["read_file"], home, path="missing.txt")
    assert r.is_error and "no such file" in r.content
    (home / "bin.dat").write_bytes(b"\x00\x01\x02")
    r = call(tools["read_file"], home, path="bin.dat")
    assert r.is_error and "binary" in r.content
    r = call(tools["read_file"], home, path=".")
    assert r.is_error and "directory" in r.content


def test_read_size_cap(home):
    tools = make_tools(home, max_output_chars=500)
    (home / "big.txt").write_text("".join(f"{'y' * 40} {i}\n" for i in range(200)))
    r = call(tools["read_file"], home, path="big.txt")
    assert len(r.content) < 700
    assert "output size cap" in r.content and "offset=" in r.content


def test_edit_file_semantics(home):
    tools = make_tools(home)
    e = tools["edit_file"]
    f = home / "app.py"
    f.write_text("a = 1\nb = 1\nc = 2\n")
    r = call(e, home, path="app.py", old_string="= 1", new_string="= 9")
    assert r.is_error and "occurs 2 times" in r.content
    assert f.read_text() == "a = 1\nb = 1\nc = 2\n"
    r = call(e, home, path="app.py", old_string="missing", new_string="x")
    assert r.is_error and "not found" in r.content
    r = call(e, home, path="app.py", old_string="c = 2", new_string="c = 2")
    assert r.is_error and "identical" in r.content
    r = call(e, home, path="app.py", old_string="b = 1", new_string="b = 5")
    assert not r.is_error and f.read_text() == "a = 1\nb = 5\nc = 2\n"
    p = e.input_model.model_validate({"path": "app.py", "old_string": "b = 1", "new_string": "b = 5"})
    assert e.completed_activity(p, r) == "Edited app.py (1 replacement)"
    r = call(e, home, path="app.py", old_string="=", new_string=":=", replace_all=True)
    assert not r.is_error and r.details["replacements"] == 3
    assert f.read_text() == "a := 1\nb := 5\nc := 2\n"
    r = call(e, home, path="nope.py", old_string="a", new_string="b")
    assert r.is_error and "no such file" in r.content


def _fill(home: Path) -> None:
    """Use up every free block of the home's file system (its quota): big writes, then small ones."""
    fd = os.open(home / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096, 512):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
                os.fsync(fd)
    finally:
        os.close(fd)


def test_a_write_on_a_full_home_leaves_the_old_file_whole_and_names_the_quota(home):
    """Issue 30: ``write_file`` over an existing file on a full home used to leave it at 0 bytes."""
    tools = make_tools(home)
    old = "the old content\n" * 100
    assert not call(tools["write_file"], home, path="notes/keep.txt", content=old).is_error
    os.chmod(home / "notes/keep.txt", 0o600)
    _fill(home)
    for name, params in (
        ("write_file", {"path": "notes/keep.txt", "content": "new " * 300_000}),
        (
            "edit_file",
            {"path": "notes/keep.txt", "old_string": "old", "new_string": "new " * 3000, "replace_all": True},
        ),
    ):
        r = call(tools[name], home, **params)
        assert r.is_error and "the agent home is full" in r.content and "AGENT_HOME_QUOTA_MB" in r.content, r.content
        assert "the file is unchanged" in r.content, r.content
        assert (home / "notes/keep.txt").read_text() == old
    r = call(tools["write_file"], home, path="fresh.txt", content="y" * 1_000_000)
    assert r.is_error and "AGENT_HOME_QUOTA_MB" in r.content and "nothing was written" in r.content
    assert sorted(p.name for p in (home / "notes").iterdir()) == ["keep.txt"]  # no temporary file left
    assert not (home / "fresh.txt").exists()
    (home / "filler").unlink()
    r = call(tools["write_file"], home, path="notes/keep.txt", content="replaced\n")
    assert not r.is_error and r.content.startswith("Overwrote notes/keep.txt")
    assert (home / "notes/keep.txt").read_text() == "replaced\n"
    assert stat.S_IMODE((home / "notes/keep.txt").stat().st_mode) == 0o600  # the target's mode is kept


def test_edit_keeps_crlf(home):
    tools = make_tools(home)
    f = home / "win.txt"
    f.write_bytes(b"one\r\ntwo\r\n")
    r = call(tools["edit_file"], home, path="win.txt", old_string="two", new_string="2")
    assert not r.is_error
    assert f.read_bytes() == b"one\r\n2\r\n"


# ----------------------------------------------------------------- list / search


def test_list_files(home):
    (home / "src/pkg").mkdir(parents=True)
    (home / "src/app.py").write_text("print(1)\n")
    (home / "src/pkg/mod.py").write_text("x = 1\n")
    (home / ".hidden").write_text("h")
    (home / "node_modules/junk").mkdir(parents=True)
    tools = make_tools(home)
    r = call(tools["list_files"], home)
    assert "src/" in r.content and ".hidden" not in r.content
    r = call(tools["list_files"], home, include_hidden=True)
    assert ".hidden" in r.content
    r = call(tools["list_files"], home, path="src", recursive=True)
    assert "pkg/mod.py" in r.content and "app.py" in r.content
    r = call(tools["list_files"], home, recursive=True)
    assert "junk" not in r.content
    r = call(tools["list_files"], home, recursive=True, max_entries=2)
    assert r.details["entries"] == 2 and r.details["truncated"] and "listing stopped" in r.content
    r = call(tools["list_files"], home, path="src/app.py")
    assert r.is_error


def test_search_files(home):
    (home / "src").mkdir()
    (home / "src/a.py").write_text("def foo():\n    return 1\n# TODO fix foo\n")
    (home / "src/b.txt").write_text("foo bar\n")
    tools = make_tools(home)
    s = tools["search_files"]
    r = call(s, home, pattern=r"def \w+\(")
    assert r.content == "src/a.py:1: def foo():"
    r = call(s, home, pattern="FOO", case_sensitive=False, glob="*.py")
    assert "src/a.py:1:" in r.content and "src/a.py:3:" in r.content and "b.txt" not in r.content
    r = call(s, home, pattern="foo(", literal=True)
    assert "src/a.py:1:" in r.content
    r = call(s, home, pattern="foo(")
    assert r.is_error and "invalid regular expression" in r.content
    r = call(s, home, pattern="foo", max_results=1)
    assert r.details["truncated"] and "stopped at 1 matches" in r.content
    p = s.input_model.model_validate({"pattern": "foo", "path": "src"})
    r = call(s, home, pattern="foo", path="src")
    assert s.activity(p) == "Searching for 'foo' in src"
    assert s.completed_activity(p, r) == "Found 3 matches for 'foo' in src"
    r = call(s, home, pattern="zzz")
    assert not r.is_error and "No matches" in r.content


# ----------------------------------------------------------------- regressions: special files, long paths


def call_bounded(tool: WorkerTool, home: Path, seconds: float = 5.0, **params) -> ToolResult:
    """``call`` in a daemon thread: a hang fails the test instead of blocking the run."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["r"] = call(tool, home, **params)
        except BaseException as exc:
            box["e"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{tool.name} {params} hung for {seconds}s"
    if "e" in box:
        raise box["e"]  # type: ignore[misc]
    return box["r"]  # type: ignore[return-value]


@pytest.fixture
def fifo(home: Path):
    f = home / "f"
    os.mkfifo(f)
    (home / "flink").symlink_to("f")
    yield f
    # Should a tool still be blocked on the FIFO (the test failed), open the other end to release it.
    for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
        try:
            os.close(os.open(f, flags))
        except OSError:
            pass


def test_fifo_is_refused_without_blocking(home, fifo):
    tools = make_tools(home)
    for path in ("f", "flink"):
        r = call_bounded(tools["read_file"], home, path=path)
        assert r.is_error and "FIFO" in r.content and "not a regular file" in r.content
    r = call_bounded(tools["write_file"], home, path="f", content="x")  # no reader: must not block
    assert r.is_error and "FIFO" in r.content
    r = call_bounded(tools["write_file"], home, path="flink", content="x")
    assert r.is_error and "FIFO" in r.content
    r = call_bounded(tools["edit_file"], home, path="f", old_string="a", new_string="b")
    assert r.is_error and "not a regular file" in r.content
    r = call_bounded(tools["search_files"], home, pattern="x")
    assert not r.is_error and "No matches" in r.content
    r = call_bounded(tools["search_files"], home, pattern="x", path="f")
    assert not r.is_error
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)  # still a FIFO, untouched


def test_write_to_fifo_with_a_reader_is_refused(home, fifo):
    # Even when the open would succeed (a reader is waiting), nothing is written into the pipe.
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        r = call_bounded(make_tools(home)["write_file"], home, path="f", content="payload")
        assert r.is_error and "FIFO" in r.content
        try:
            leaked = os.read(reader, 100)
        except BlockingIOError:
            leaked = b""
        assert leaked == b""
    finally:
        os.close(reader)


def test_socket_file_is_refused(home):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.getcwd()
    try:
        os.chdir(home)  # short relative name: AF_UNIX paths are limited to ~108 bytes
        sock.bind("s.sock")
    finally:
        os.chdir(old)
    try:
        tools = make_tools(home)
        r = call_bounded(tools["read_file"], home, path="s.sock")
        assert r.is_error and "socket" in r.content
        r = call_bounded(tools["write_file"], home, path="s.sock", content="x")
        assert r.is_error and "socket" in r.content
    finally:
        sock.close()


@pytest.mark.parametrize("path", ["a" * 5000, "d/" * 3000 + "x"])
def test_overlong_paths_are_error_results(home, path):
    tools = make_tools(home)
    params = {
        "read_file": {"path": path},
        "write_file": {"path": path, "content": "x"},
        "edit_file": {"path": path, "old_string": "a", "new_string": "b"},
        "list_files": {"path": path},
        "search_files": {"pattern": "a", "path": path},
        "run_command": {"command": "true", "cwd": path},
    }
    for name, p in params.items():
        r = call(tools[name], home, **p)  # must not raise OSError(ENAMETOOLONG)
        assert r.is_error, name
        assert "too long" in r.content, (name, r.content)
        assert len(r.content) < 300, name


# ----------------------------------------------------------------- regressions: search ReDoS


def test_search_pattern_timeout_gives_clear_error(home, monkeypatch):
    monkeypatch.setattr(computer_search, "SEARCH_PATTERN_TIMEOUT", 0.5)
    (home / "evil.txt").write_text("a" * 40 + "!\n")
    t0 = time.monotonic()
    r = call_bounded(make_tools(home)["search_files"], home, seconds=20, pattern="(a|aa)+$")
    assert time.monotonic() - t0 < 5
    assert r.is_error and "pattern too slow; simplify it" in r.content
    # The same file with a sane pattern still works.
    r = call(make_tools(home)["search_files"], home, pattern="a+!")
    assert not r.is_error and "evil.txt:1:" in r.content


def _slow_lines(home: Path) -> None:
    # Each line costs (a|aa)+$ some tens of ms; all of them together far more than any budget here.
    (home / "slow.txt").write_text(("a" * 24 + "!\n") * 2000)


def test_search_budget_bounds_slow_patterns(home, monkeypatch):
    monkeypatch.setattr(computer_search, "SEARCH_TIME_BUDGET", 1.0)
    _slow_lines(home)
    t0 = time.monotonic()
    r = call_bounded(make_tools(home)["search_files"], home, seconds=20, pattern="(a|aa)+$")
    assert time.monotonic() - t0 < 4
    assert not r.is_error and r.details["timed_out"] and "time budget" in r.content


def test_search_abort_stops_slow_pattern(home):
    _slow_lines(home)
    abort = AbortSignal()
    timer = threading.Timer(0.5, abort.abort)
    timer.start()
    try:
        t0 = time.monotonic()
        r = call(make_tools(home)["search_files"], home, abort=abort, pattern="(a|aa)+$")
        assert time.monotonic() - t0 < 5
        assert r.is_error and "cancelled" in r.content
    finally:
        timer.cancel()


# ----------------------------------------------------------------- regressions: background processes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descendant tracking uses Linux /proc and prctl")
def test_background_processes_stopped_when_command_ends(home):
    tools = make_tools(home)
    try:
        t0 = time.monotonic()
        r = call_bounded(
            tools["run_command"],
            home,
            seconds=20,
            command=(
                "sleep 300.0427 >/dev/null 2>&1 & "
                "setsid sleep 302.0427 >/dev/null 2>&1 & "
                "(setsid sh -c 'sleep 303.0427 >/dev/null 2>&1 &' &); "
                "sleep 0.3; echo started; ps -eo args | grep -c '^sleep 30.*0427'"
            ),
        )
        assert time.monotonic() - t0 < 8
        assert not r.is_error and "started" in r.content and "[exit code 0]" in r.content
        assert "started\n3\n" in r.content  # all three were running inside
        assert _wait_gone(".0427") == []
    finally:
        _kill_marked(".0427")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descendant tracking uses Linux /proc and prctl")
def test_timeout_stops_processes_that_left_the_group(home):
    tools = make_tools(home, command_timeout=60)
    try:
        t0 = time.monotonic()
        r = call_bounded(
            tools["run_command"],
            home,
            seconds=20,
            command=(
                "setsid sleep 305.0433 >/dev/null 2>&1 & "
                "(trap '' TERM; exec sleep 306.0433) & sleep 0.3; echo started; sleep 30"
            ),
            timeout_seconds=1,
        )
        assert time.monotonic() - t0 < 8
        assert r.is_error and "timed out" in r.content and "started" in r.content
        assert _wait_gone(".0433") == []  # the one ignoring SIGTERM is gone too
    finally:
        _kill_marked(".0433")


def test_exit_status_passes_through_the_runner(home):
    tools = make_tools(home)
    r = call(tools["run_command"], home, command="echo out; exit 7")
    assert r.details["exit_code"] == 7 and "out" in r.content
    r = call(tools["run_command"], home, command="kill -9 $$")
    # Sandboxed, a command killed by a signal reports 128 + N, as a shell does.
    assert r.details["exit_code"] == 128 + 9
