"""Issue 19, per-agent limits: the review's attacks, each contained.

- disk: an agent fills its home; its own writes fail naming the quota, its
  home stays within ``AGENT_HOME_QUOTA_MB``, another agent's turn and Redis
  keep working (real worker, real sandbox, real loop-mounted home);
- setuid: a command copies bash and sets the setuid bit every way it can; no
  root-owned or setuid file is left, and ``nobody`` cannot get euid 0 from
  anything in the home (real worker);
- memory: four processes of one command, each under the limit, together over
  it: the command is killed with a "memory limit" error (real sandbox and
  memory cgroup);
- seccomp: what commands never need fails (mount, namespaces, ptrace, the
  keyring, bpf, io_uring).

Each would fail if its property broke (quota off, commands as root, RLIMIT_AS
only, no filter). The big one-line file is ``test_file_streams``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

import redis

from tests.support.scripts import fc
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer import homes
from worker.tools.computer.catalog import create_computer_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnStatus


def turn_of_calls(control, gateway, script_name, calls, agent):
    """One turn whose model makes ``calls`` (one per step); returns (view, outputs)."""
    steps = [{"output": [fc(name, args)]} for name, args in calls]
    gateway.add_script(script_name, steps + [{"output": [{"type": "message", "text": "done"}]}])
    turn_id = control.enqueue({"agent_id": agent, "input": "go", "model": script_name})
    view = control.wait(turn_id, timeout=150)
    outs = [i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"]
    return view, outs


def walk_home(home: Path):
    for dirpath, dirnames, filenames in os.walk(home):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            yield path, os.lstat(path)


def test_filling_the_disk_fails_only_the_agents_own_writes(control, gateway, script_name, homes_root, redis_url):
    settings = Settings()
    quota = settings.home_quota_mb * 1024**2
    assert quota > 0, "the suite runs with the disk quota on"
    agent = f"fill-{uuid.uuid4().hex[:6]}"
    view, outs = turn_of_calls(
        control,
        gateway,
        script_name,
        [
            ("run_command", {"command": f"dd if=/dev/zero of=fill bs=1M count={2 * quota // 1024**2} 2>&1 | head -1"}),
            # under the cap on one call's arguments (AGENT_MAX_ARGUMENTS_BYTES, 1 MiB): the full home refuses it
            ("write_file", {"path": "more.txt", "content": "x" * 512 * 1024}),
        ],
        agent,
    )
    assert view.status == TurnStatus.completed
    assert "No space left on device" in outs[0] and "AGENT_HOME_QUOTA_MB" in outs[0], outs[0]
    assert "agent home is full" in outs[1] and "AGENT_HOME_QUOTA_MB" in outs[1], outs[1]
    home = homes_root / agent
    assert os.path.ismount(home)
    used = sum(st.st_blocks * 512 for _, st in walk_home(home))
    assert used <= quota, used
    image = homes.image_path(settings, home)
    assert image.stat().st_blocks * 512 <= quota  # the host disk holds no more than the quota
    # Nobody else is affected: another agent's turn writes and runs, Redis answers and stores.
    other = f"other-{uuid.uuid4().hex[:6]}"
    view, outs = turn_of_calls(
        control,
        gateway,
        script_name + "-b",
        [("write_file", {"path": "a.txt", "content": "fine\n"}), ("run_command", {"command": "cat a.txt"})],
        other,
    )
    assert view.status == TurnStatus.completed and "fine" in outs[1] and "[exit code 0]" in outs[1]
    r = redis.Redis.from_url(redis_url)
    key = f"attack-check-{uuid.uuid4().hex[:6]}"
    assert r.set(key, "ok", ex=60) and r.get(key) == b"ok"


def test_setuid_copies_leave_nothing_that_gains_root(control, gateway, script_name, homes_root):
    agent = f"suid-{uuid.uuid4().hex[:6]}"
    attempts = (
        "cp /bin/bash suidsh; chmod 4755 suidsh; echo chmod=$?; chmod u+s,g+s suidsh; echo chmod2=$?; "
        "install -m 4755 /bin/bash suid2; echo install=$?; "
        "python3 -c \"import os; os.close(os.open('suid3', os.O_CREAT | os.O_WRONLY, 0o6755))\"; echo open=$?; "
        "mkdir -m 2775 sgid-dir; echo mkdir=$?; ls -ln"
    )
    view, outs = turn_of_calls(control, gateway, script_name, [("run_command", {"command": attempts})], agent)
    assert view.status == TurnStatus.completed
    assert "chmod=1" in outs[0] and "chmod2=1" in outs[0], outs[0]
    home = homes_root / agent
    found = list(walk_home(home))
    assert any(p.endswith("suidsh") for p, _ in found), outs[0]
    for path, st in [(str(home), home.lstat()), *found]:
        assert st.st_uid != 0 and st.st_gid != 0, f"{path} is root's"
        assert not st.st_mode & (stat.S_ISUID | stat.S_ISGID), f"{path} keeps a setuid/setgid bit"
    # Even a root-owned setuid bash put in the home (as if every check above failed) grants nothing:
    # the home is mounted nosuid. ``nobody`` runs it with -p and stays nobody.
    planted = home / "planted"
    subprocess.run(["cp", "/bin/bash", str(planted)], check=True)
    os.chown(planted, 0, 0)
    os.chmod(planted, 0o4755)
    mode = home.stat().st_mode
    os.chmod(home, 0o711)
    try:
        proc = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", str(planted), "-p", "-c", "id -u"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        os.chmod(home, stat.S_IMODE(mode))
        planted.unlink()
    assert proc.stdout.strip() == "65534", (proc.stdout, proc.stderr)


def _tools(home: Path, **settings):
    ctx = TurnContext(turn_id="t", agent_id=home.name, home=home, settings=Settings(**settings))
    return {t.name: t for t in create_computer_tools(ctx)}


def _run(tools, home: Path, command: str):
    tool = tools["run_command"]
    return tool.execute(
        tool.input_model(command=command, timeout_seconds=60),
        ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal()),
    )


# Four processes of one command, each holding 100 MiB (touched, so resident), under a 256 MiB limit:
# each is far under RLIMIT_AS, together they are over the command's memory cgroup.
HOG = "python3 -c 'import time; b = bytearray(100 * 1024 * 1024); time.sleep(20)'"


def test_processes_of_one_command_together_hit_the_memory_limit(tmp_path):
    home = tmp_path / "mem-agent"
    tools = _tools(home, command_max_memory_bytes=256 * 1024**2)
    r = _run(tools, home, f"for i in 1 2 3 4; do {HOG} & done; wait; echo all-survived")
    assert r.is_error and r.details["outcome"] == "memory_limit", r.content
    assert "memory limit of 256 MiB" in r.content and "AGENT_COMMAND_MAX_MEMORY_BYTES" in r.content
    assert "all-survived" not in r.content
    # Under the limit the same shape runs to its end.
    r = _run(tools, home, "for i in 1 2; do python3 -c 'b = bytearray(60 * 1024 * 1024)' & done; wait; echo fine")
    assert not r.is_error and "fine" in r.content, r.content


def test_seccomp_refuses_what_commands_never_need(tmp_path):
    home = tmp_path / "sc-agent"
    tools = _tools(home)
    probes = {
        "mount": "mount -t tmpfs none /tmp 2>&1; echo rc=$?",
        "userns": "unshare -U true 2>&1; echo rc=$?",
        "ptrace": "strace -f true >/dev/null 2>&1; echo rc=$?",
        "keyring": 'python3 -c "import ctypes; l = ctypes.CDLL(None, use_errno=True); '
        "print('rc=', l.syscall(250, 0, 0, 0, 0, 0), ctypes.get_errno())\"",  # keyctl
        "bpf": 'python3 -c "import ctypes; l = ctypes.CDLL(None, use_errno=True); '
        "print('rc=', l.syscall(321, 0, 0, 0), ctypes.get_errno())\"",
        "io_uring": 'python3 -c "import ctypes; l = ctypes.CDLL(None, use_errno=True); '
        "print('rc=', l.syscall(425, 1, 0), ctypes.get_errno())\"",
    }
    for name, command in probes.items():
        r = _run(tools, home, command)
        assert "rc=0" not in r.content.replace(" ", ""), (name, r.content)
    for name in ("keyring", "bpf", "io_uring"):
        r = _run(tools, home, probes[name])
        assert "-1 1" in r.content, (name, r.content)  # EPERM from the filter
    r = _run(tools, home, "echo ok; ls / >/dev/null; python3 -c 'import threading; print(threading.active_count())'")
    assert "ok" in r.content and "[exit code 0]" in r.content, r.content
