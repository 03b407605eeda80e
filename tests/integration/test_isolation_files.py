"""Attacks on the file tools (issue 9, finding 4): symlink races, hard links, symlinks out, FIFOs.

The race: a separate process swaps a directory of the home with a symlink to
an outside directory (``renameat2(RENAME_EXCHANGE)``, so the name always
exists) as fast as it can while 3,000 tool calls run against paths under it.
Before ``home_fs`` (path checked, then opened by name) the same loop let
hundreds of reads, writes and edits land outside.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import orjson
import pytest

from tests.support.scripts import fc
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext, ToolResult, WorkerTool
from worker.tools.computer import homes
from worker.tools.computer.catalog import create_computer_tools
from worker.tools.computer.confine import ConfinementError
from worker.tools.computer.home_fs import HomeDir
from worker.tools.skills import write_mcporter_config
from worker.tools.todo import create_todo_tool
from worker.turn.context import TurnContext
from worker.turn.request import TurnStatus

SECRET = "OUTSIDE-SECRET-6f1d"
RACE_CALLS = 3000
OUTSIDE_ONLY = "zz-outside-only.txt"  # never named by a call: seeing it means a listing leaked

# Exchanges two names atomically, forever: argv[1] and argv[2] (a directory and a symlink).
SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
a, b = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2])
print("ready", flush=True)
while True:
    if libc.renameat2(-100, a, -100, b, 2) != 0:  # AT_FDCWD, RENAME_EXCHANGE
        raise OSError(ctypes.get_errno(), "renameat2")
"""


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
    (o / "secret.txt").write_text(f"{SECRET}\n")
    (o / "f.txt").write_text(f"{SECRET} in f\n")
    (o / OUTSIDE_ONLY).write_text("a name that exists only outside\n")
    return o


def tools_for(home: Path, settings: Settings | None = None) -> dict[str, WorkerTool]:
    ctx = TurnContext(turn_id="t1", agent_id="a1", home=home, settings=settings or Settings())
    return {t.name: t for t in create_computer_tools(ctx)}


def call(tool: WorkerTool, home: Path, **params) -> ToolResult:
    p = tool.input_model.model_validate(params)
    return tool.execute(p, ToolContext(turn_id="t1", call_id="c1", home=home, abort=AbortSignal()))


def call_bounded(tool: WorkerTool, home: Path, **params) -> ToolResult:
    """``call`` in a daemon thread: a hang fails the test instead of blocking the run."""
    box: dict[str, object] = {}
    t = threading.Thread(target=lambda: box.update(r=call(tool, home, **params)), daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), f"{tool.name} {params} hung"
    return box["r"]  # type: ignore[return-value]


def tree_digest(root: Path) -> str:
    """Names, types, sizes and contents of everything under ``root`` (symlinks not followed)."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)}|{st.st_mode}|{st.st_size}|{st.st_nlink}\n".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


# ----------------------------------------------------------------- the race


def test_symlink_swap_race_never_escapes(home, outside):
    assert hasattr(ctypes.CDLL(None), "renameat2"), "the race test needs renameat2 (glibc >= 2.28)"
    d = home / "d"
    d.mkdir()
    (d / "f.txt").write_text("inside text\n")
    (home / "d.alt").symlink_to(outside, target_is_directory=True)
    before = tree_digest(outside)
    tools = tools_for(home)
    plan = [
        ("read_file", lambda i: {"path": "d/f.txt"}),
        ("read_file", lambda i: {"path": "d/f.txt", "offset": 1, "limit": 5}),
        ("write_file", lambda i: {"path": f"d/w{i}.txt", "content": "written\n"}),
        ("edit_file", lambda i: {"path": "d/f.txt", "old_string": SECRET, "new_string": "EDITED"}),
        ("list_files", lambda i: {"path": "d", "recursive": i % 2 == 0}),
        ("search_files", lambda i: {"pattern": "SECRET|inside", "path": "d" if i % 2 else "."}),
    ]
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, str(d), str(home / "d.alt")], stdout=subprocess.PIPE, text=True
    )
    outcomes = {"ok": 0, "refused": 0}
    fds_before = len(os.listdir("/proc/self/fd"))
    leaks: list[tuple[str, str]] = []
    try:
        assert swapper.stdout.readline().strip() == "ready"
        for i in range(RACE_CALLS):
            name, params = plan[i % len(plan)]
            r = call(tools[name], home, **params(i))
            outcomes["refused" if r.is_error else "ok"] += 1
            if SECRET in r.content or OUTSIDE_ONLY in r.content or "secret.txt" in r.content:
                leaks.append((name, r.content[:200]))
        assert swapper.poll() is None, "the swapper stopped: the race did not run"
    finally:
        swapper.kill()
        swapper.wait()
    assert leaks == [], f"{len(leaks)} outside reads, first: {leaks[:3]}"
    assert tree_digest(outside) == before, "a file outside the home was created or changed"
    assert not list(outside.glob("w*.txt"))
    assert (outside / "f.txt").read_text() == f"{SECRET} in f\n"
    assert len(os.listdir("/proc/self/fd")) <= fds_before + 1, "descriptors leaked"  # +1: the swapper's pipe
    # Both sides of the race were hit: calls through the real directory worked, through the link were refused.
    assert outcomes["ok"] > 0 and outcomes["refused"] > 0, outcomes


# ----------------------------------------------------------------- hard links, symlinks, special files


def test_hard_link_from_outside_cannot_be_made_into_a_quota_home(home, outside):
    """A home is its own file system: a hard link to a file outside it cannot exist."""
    with pytest.raises(OSError) as info:
        os.link(outside / "secret.txt", home / "hl.txt")
    assert info.value.errno == errno.EXDEV


@pytest.fixture
def plain_home(tmp_path: Path) -> Path:
    """A plain directory home (``AGENT_HOME_QUOTA_MB=0``): the same file system as ``outside``."""
    h = tmp_path / "plain-home"
    h.mkdir()
    return h


def test_hard_link_to_outside_file_refused(plain_home, outside):
    """Without the quota (a plain directory home), the file tools refuse a file with several links."""
    home = plain_home
    os.link(outside / "secret.txt", home / "hl.txt")
    tools = tools_for(home, Settings(home_quota_mb=0))
    r = call(tools["read_file"], home, path="hl.txt")
    assert r.is_error and "hl.txt is a file with 2 hard links" in r.content and "not read" in r.content
    assert SECRET not in r.content
    r = call(tools["write_file"], home, path="hl.txt", content="pwned")
    assert r.is_error and "hard links" in r.content and "not written" in r.content
    r = call(tools["edit_file"], home, path="hl.txt", old_string=SECRET, new_string="pwned")
    assert r.is_error and "hard links" in r.content and "not edited" in r.content
    r = call(tools["search_files"], home, pattern="SECRET")
    assert not r.is_error and SECRET not in r.content and r.details["files_searched"] == 0
    r = call(tools["search_files"], home, pattern="SECRET", path="hl.txt")
    assert r.is_error and "hard links" in r.content and SECRET not in r.content
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"
    assert os.stat(outside / "secret.txt").st_nlink == 2  # still linked, untouched


def test_hard_linked_todo_file_is_replaced_not_written_through(plain_home, outside):
    home = plain_home
    victim = outside / "todos.json"
    victim.write_bytes(orjson.dumps([{"id": "x", "content": SECRET, "status": "pending", "priority": "low"}]))
    (home / ".agent").mkdir()
    os.link(victim, home / ".agent" / "todos.json")
    tool = create_todo_tool(TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings()))
    p = tool.input_model.model_validate({"todos": [{"id": "1", "content": "mine", "status": "pending"}]})
    r = tool.execute(p, ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal()))
    assert not r.is_error and SECRET not in r.content and r.details["previous_items"] == 0
    assert SECRET in victim.read_text() and os.stat(victim).st_nlink == 1  # the name was replaced
    assert orjson.loads((home / ".agent/todos.json").read_bytes())[0]["content"] == "mine"


def test_symlinks_out_refused_for_every_file_tool(home, outside):
    (home / "out.txt").symlink_to(outside / "secret.txt")
    (home / "rel-out").symlink_to("../outside", target_is_directory=True)
    (home / "sub").mkdir()
    (home / "sub" / "up").symlink_to("../..", target_is_directory=True)  # climbs out through ..
    tools = tools_for(home)
    for path in ("out.txt", "rel-out/secret.txt", "sub/up/outside/secret.txt"):
        for name, params in (
            ("read_file", {"path": path}),
            ("write_file", {"path": path, "content": "x"}),
            ("edit_file", {"path": path, "old_string": SECRET, "new_string": "x"}),
            ("search_files", {"pattern": "SECRET", "path": path}),
        ):
            r = call(tools[name], home, **params)
            assert r.is_error and "symlink to a location outside the agent home" in r.content, (name, path, r)
            assert SECRET not in r.content
    r = call(tools["list_files"], home, path="rel-out")
    assert r.is_error and "outside the agent home" in r.content
    r = call(tools["write_file"], home, path="rel-out/new/deep.txt", content="x")
    assert r.is_error and not (outside / "new").exists()
    r = call(tools["search_files"], home, pattern="SECRET")
    assert not r.is_error and SECRET not in r.content
    # todo and skills go through the same resolver.
    (home / ".agent").symlink_to(outside, target_is_directory=True)
    todo = create_todo_tool(TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings()))
    r = todo.execute(
        todo.input_model.model_validate({"todos": []}),
        ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal()),
    )
    assert r.is_error and not (outside / "todos.json").exists()
    (home / "config").symlink_to("sub/up/outside", target_is_directory=True)
    with pytest.raises(ConfinementError):
        write_mcporter_config(home, {"echo": {"command": "x"}})
    assert not (outside / "mcporter.json").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt", "secret.txt", OUTSIDE_ONLY]


def test_symlinks_that_stay_inside_still_work(home):
    (home / "a/b").mkdir(parents=True)
    (home / "a/b/real.txt").write_text("real\n")
    (home / "abs").symlink_to(home / "a", target_is_directory=True)  # absolute, inside
    (home / "a/b/sib").symlink_to("../b/real.txt")  # relative with ..
    (home / "chain").symlink_to("a/b/sib")  # a chain of two
    (home / "loop1").symlink_to("loop2")
    (home / "loop2").symlink_to("loop1")
    tools = tools_for(home)
    for path in ("abs/b/real.txt", "a/b/sib", "chain"):
        r = call(tools["read_file"], home, path=path)
        assert not r.is_error and "real" in r.content and r.details["path"] == "a/b/real.txt", (path, r.content)
    r = call(tools["write_file"], home, path="abs/b/new.txt", content="n\n")
    assert not r.is_error and (home / "a/b/new.txt").read_text() == "n\n"
    r = call(tools["edit_file"], home, path="chain", old_string="real", new_string="edited")
    assert not r.is_error and (home / "a/b/real.txt").read_text() == "edited\n"
    r = call(tools["list_files"], home, path="abs", recursive=True)
    assert not r.is_error and "b/real.txt" in r.content
    r = call(tools["list_files"], home)
    assert "chain -> a/b/sib" in r.content and "outside the home" not in r.content.split("chain")[1].split("\n")[0]
    r = call(tools["read_file"], home, path="loop1")
    assert r.is_error and "symbolic links" in r.content


def test_fifo_refused_without_hanging_for_every_tool(home):
    (home / "d").mkdir()
    os.mkfifo(home / "d" / "pipe")
    (home / "via").symlink_to("d/pipe")
    tools = tools_for(home)
    for path in ("d/pipe", "via"):
        for name, params in (
            ("read_file", {"path": path}),
            ("write_file", {"path": path, "content": "x"}),
            ("edit_file", {"path": path, "old_string": "a", "new_string": "b"}),
        ):
            r = call_bounded(tools[name], home, **params)
            assert r.is_error and "FIFO" in r.content and "not a regular file" in r.content, (name, path, r.content)
    r = call_bounded(tools["search_files"], home, pattern="x", path="d")
    assert not r.is_error and r.details["files_searched"] == 0
    r = call_bounded(tools["list_files"], home, path="d")
    assert not r.is_error and "pipe" in r.content
    # A FIFO where the todo file goes: not read (no hang), replaced by the save.
    (home / ".agent").mkdir()
    os.mkfifo(home / ".agent" / "todos.json")
    todo = create_todo_tool(TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings()))
    box: dict[str, ToolResult] = {}
    ctx = ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal())
    t = threading.Thread(
        target=lambda: box.update(r=todo.execute(todo.input_model.model_validate({"todos": []}), ctx)), daemon=True
    )
    t.start()
    t.join(10)
    assert not t.is_alive() and not box["r"].is_error
    assert (home / ".agent/todos.json").read_bytes() == b"[]"


def test_resolver_acts_on_the_descriptor_it_checked(home, outside):
    """The descriptor stays bound to the file it opened even if the name is swapped right after."""
    (home / "f.txt").write_text("mine\n")
    with HomeDir(home) as hd, hd.open("f.txt") as opened:
        os.rename(home / "f.txt", home / "moved.txt")
        (home / "f.txt").symlink_to(outside / "secret.txt")
        assert os.pread(opened.fd, 100, 0) == b"mine\n"
        assert opened.rel == "f.txt"
    with HomeDir(home) as hd, pytest.raises(ConfinementError, match="symlink"):
        hd.open("f.txt")


# ----------------------------------------------------------------- through a real worker


def test_symlinked_and_hard_linked_reads_end_as_error_outputs(control, gateway, script_name, homes_root):
    agent = f"a-{uuid.uuid4().hex[:6]}"
    home = homes_root / agent
    home.mkdir(parents=True)
    homes.provision(Settings(), home)  # the home's own file system, as the worker mounts it
    outside = homes_root / f"outside-{agent}"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{SECRET}\n")
    (home / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OSError):  # no hard link across file systems: one inside the home stands in
        os.link(outside / "secret.txt", home / "hard.txt")
    (home / "secret-copy.txt").write_text(f"{SECRET}\n")
    os.link(home / "secret-copy.txt", home / "hard.txt")
    gateway.add_script(
        script_name,
        [
            {
                "output": [
                    fc("read_file", {"path": "link/secret.txt"}),
                    fc("read_file", {"path": "hard.txt"}),
                    fc("edit_file", {"path": "hard.txt", "old_string": SECRET, "new_string": "x"}),
                ]
            },
            {"output": [{"type": "message", "text": "done"}]},
        ],
    )
    turn_id = control.enqueue({"agent_id": agent, "input": "go", "model": script_name})
    view = control.wait(turn_id, timeout=90)
    assert view.status == TurnStatus.completed
    items = control.items(turn_id)
    outs = [i["output"] for i in items if i["type"] == "function_call_output"]
    assert len(outs) == 3
    assert "symlink to a location outside the agent home" in outs[0]
    assert "hard links" in outs[1] and "not read" in outs[1]
    assert "hard links" in outs[2] and "not edited" in outs[2]
    assert all(SECRET not in o for o in outs)
    assert (outside / "secret.txt").read_text() == f"{SECRET}\n"
