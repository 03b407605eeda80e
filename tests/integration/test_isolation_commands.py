"""Issue 9, commands: attacks a security review ran against a real worker, each one contained.

Every attack goes through a real Celery worker (``solo_worker``: commands run
in its process) and the embedded Redis, with the model scripted to call
``run_command``. The worker's real environment holds ``OPENAI_API_KEY``,
``AGENT_WEB_SEARCH_KEY`` and ``REDIS_URL`` (conftest sets them in
``os.environ`` before the worker starts, so they are in
``/proc/<worker pid>/environ``). A sandbox that cannot be created FAILS these
tests (the tool refuses, and ``test_sandbox_available`` fails); nothing skips.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tests.support.scripts import fc
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer import privileges, sandbox
from worker.tools.computer.catalog import create_computer_tools
from worker.turn.context import TurnContext
from worker.turn.request import TurnStatus

SECRETS = ("sk-test-secret-never-logged", "search-key-never-shown")


def run_commands(control, gateway, script_name, commands, *, agent=None, **request):
    """One turn whose model calls ``run_command`` once per entry of ``commands``; returns (view, outputs).

    Refuses to send an attack when the worker would run it unsandboxed: a fork bomb or memory hog
    outside the sandbox would hit the whole machine, not fail a test.
    """
    assert Settings().command_sandbox == "bwrap", "the attack suite runs only with the command sandbox on"
    agent = agent or f"iso-{uuid.uuid4().hex[:6]}"
    steps = [{"output": [fc("run_command", {"command": c, "timeout_seconds": 30})]} for c in commands]
    gateway.add_script(script_name, steps + [{"output": [{"type": "message", "text": "done"}]}])
    turn_id = control.enqueue({"agent_id": agent, "input": "go", "model": script_name, **request})
    view = control.wait(turn_id, timeout=150)
    outs = [i["output"] for i in control.items(turn_id) if i["type"] == "function_call_output"]
    assert len(outs) == len(commands)
    return view, outs


def worker_answers(worker) -> bool:
    from tasks.app import app

    replies = app.control.ping(destination=[worker.node_name], timeout=2.0) or []
    return any(worker.node_name in r for r in replies)


def host_pids(marker: str) -> list[int]:
    """Live host processes whose command line contains ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ")
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and b"pytest" not in cmdline and state != b"Z":
            found.append(int(name))
    return found


def redis_address() -> tuple[str, int]:
    url = urlsplit(os.environ["REDIS_URL"])
    return url.hostname or "127.0.0.1", url.port or 6379


# ----------------------------------------------------------------- the sandbox exists


def test_sandbox_available():
    """The sandbox this suite relies on can be created here (fails, never skips, when it cannot)."""
    settings = Settings()
    assert settings.command_sandbox == "bwrap"
    result = sandbox.probe(sandbox.find_bwrap(settings))
    assert result.version.startswith("bubblewrap")
    assert result.process_cap in ("rlimit", "rlimit+cgroup-pids"), result.notes


def test_command_holds_no_capability(control, gateway, script_name):
    """Every capability set of an agent's command is empty and no_new_privs is on, as the command
    itself reads them: its shell, and a program it starts (a tools container once left the
    command's bounding set full: docs/isolation.md "Commands")."""
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        ["grep -E '^(Cap|NoNewPrivs)' /proc/$$/status", "python3 -c \"print(open('/proc/self/status').read())\""],
    )
    assert view.status == TurnStatus.completed
    for out in outs:
        assert "CapBnd:\t0000000000000000" in out and privileges.command_held(out) == [], out


# ----------------------------------------------------------------- finding 1: secrets, homes, worker


def test_command_cannot_read_the_worker_environment(control, gateway, script_name, solo_worker):
    pid = solo_worker.pid
    assert b"sk-test-secret-never-logged" in open(f"/proc/{pid}/environ", "rb").read()  # the secret IS there
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [
            f"cat /proc/{pid}/environ; cat /proc/1/environ; cat /proc/*/environ; env; echo END",
            f"ls /proc/{pid} 2>&1; ps -e -o pid,args | wc -l",
        ],
    )
    assert view.status == TurnStatus.completed
    text = "\n".join(outs)
    for secret in (*SECRETS, os.environ["REDIS_URL"]):
        assert secret not in text
    assert "END" in outs[0]
    assert "No such file or directory" in outs[1]


def test_command_cannot_see_other_homes(control, gateway, script_name, homes_root):
    other = f"other-{uuid.uuid4().hex[:6]}"
    (homes_root / other).mkdir(parents=True)
    (homes_root / other / "notes.txt").write_text("the other agent's private notes\n")
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [f"cat ../{other}/notes.txt; ls -a ..; ls -a {homes_root}; ls -a {homes_root.parent}; echo END"],
    )
    assert view.status == TurnStatus.completed
    assert "private notes" not in outs[0]
    assert other not in outs[0].replace(f"../{other}", "")
    assert "END" in outs[0]


def test_command_sees_no_host_secret_files(control, gateway, script_name):
    project = os.getcwd()
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [f"cat /etc/shadow; ls /etc/ssl/private; ls /run /var /home; ls {project}/var; echo END"],
    )
    assert view.status == TurnStatus.completed
    assert outs[0].count("No such file or directory") == 6, outs[0]
    assert "END" in outs[0]


def test_command_cannot_write_outside_its_home(control, gateway, script_name, homes_root):
    marker = uuid.uuid4().hex
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [f"echo {marker} > /usr/x-{marker}; echo {marker} > ../x-{marker}; echo {marker} > /tmp/t && echo TMP-OK"],
    )
    assert view.status == TurnStatus.completed
    assert not os.path.exists(f"/usr/x-{marker}") and not (homes_root / f"x-{marker}").exists()
    assert "TMP-OK" in outs[0]  # a private /tmp


def test_scratch_space_is_sized_and_the_root_read_only(control, gateway, script_name):
    """A RAM-backed tmpfs grows to half the host's RAM unless sized: /tmp and /dev/shm are capped
    (AGENT_COMMAND_TMP_BYTES, 64 MiB), and the sandbox's root and /dev are read-only."""
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [
            "touch /rootfile 2>&1; touch /dev/devfile 2>&1; "
            "dd if=/dev/zero of=/tmp/big bs=1M count=400 2>/dev/null; echo tmp=$(du -m /tmp/big | cut -f1); "
            "dd if=/dev/zero of=/dev/shm/big bs=1M count=200 2>/dev/null; echo shm=$(du -m /dev/shm/big | cut -f1)"
        ],
    )
    assert view.status == TurnStatus.completed
    out = outs[0]
    assert out.count("Read-only file system") == 2, out
    tmp_mb = int(out.split("tmp=")[1].split()[0])
    shm_mb = int(out.split("shm=")[1].split()[0])
    assert tmp_mb <= 256 and shm_mb <= 64, out


def test_command_cannot_kill_the_worker(control, gateway, script_name, solo_worker):
    view, outs = run_commands(control, gateway, script_name, [f"kill -9 {solo_worker.pid}; echo rc=$?"])
    assert view.status == TurnStatus.completed
    assert "rc=1" in outs[0]
    assert solo_worker.poll() is None and worker_answers(solo_worker)


def test_command_cannot_reach_redis(control, gateway, script_name):
    host, port = redis_address()
    python = os.path.realpath(sys.executable)
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [
            f"(exec 3<>/dev/tcp/{host}/{port}) && echo CONNECTED || echo REFUSED",
            f"{python} -I -S -c \"import socket; socket.create_connection(('{host}', {port}), 3); print('CONNECTED')\"",
        ],
    )
    assert view.status == TurnStatus.completed
    assert "REFUSED" in outs[0] and "CONNECTED" not in outs[0]
    assert "CONNECTED" not in outs[1] and "Error" in outs[1]


# ----------------------------------------------------------------- finding 3: nothing outlives its call


def test_no_survivor_after_setsid_and_killing_the_parent(control, gateway, script_name, solo_worker):
    marker = f"1000.{uuid.uuid4().int % 10**6:06d}"
    try:
        view, outs = run_commands(
            control,
            gateway,
            script_name,
            [f"setsid sleep {marker} & nohup sleep {marker} >/dev/null 2>&1 & sleep 0.2; kill -9 $PPID; echo sent"],
        )
        assert view.status == TurnStatus.completed
        deadline = time.monotonic() + 5
        while host_pids(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_pids(f"sleep {marker}") == []
        assert worker_answers(solo_worker)
    finally:
        for pid in host_pids(f"sleep {marker}"):
            os.kill(pid, signal.SIGKILL)


# ----------------------------------------------------------------- limits


def test_fork_bomb_is_stopped_by_the_process_limit(control, gateway, script_name, solo_worker):
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [
            # Builtins only after the bomb: the shell itself needs no fork to wait and report.
            "bomb() { bomb | bomb & }; bomb; end=$((SECONDS + 3)); while [ $SECONDS -lt $end ]; do :; done; "
            "echo bomb-done",
            _python(
                "import os, time\n"
                "n = 0\n"
                "try:\n"
                "    for _ in range(1000):\n"
                "        if os.fork() == 0:\n"
                "            time.sleep(30)\n"
                "            os._exit(0)\n"
                "        n += 1\n"
                "except OSError as exc:\n"
                "    print('fork refused:', exc)\n"
                "print('forked', n)"
            ),
        ],
    )
    assert view.status == TurnStatus.completed
    assert "bomb-done" in outs[0]
    assert "Resource temporarily unavailable" in outs[0]
    assert "fork refused" in outs[1]
    forked = int(outs[1].split("forked ")[1].split()[0])
    assert forked < Settings().command_max_processes
    assert worker_answers(solo_worker)


def test_memory_hog_is_stopped_by_the_address_space_limit(control, gateway, script_name, solo_worker):
    view, outs = run_commands(
        control, gateway, script_name, [_python("b = bytearray(6 * 1024**3)\nprint('ALLOCATED')") + "\necho rc=$?"]
    )
    assert view.status == TurnStatus.completed
    assert "MemoryError" in outs[0] and "ALLOCATED" not in outs[0] and "rc=1" in outs[0]
    assert worker_answers(solo_worker)


def test_file_size_limit(control, gateway, script_name, homes_root):
    agent = f"iso-{uuid.uuid4().hex[:6]}"
    view, outs = run_commands(
        control, gateway, script_name, ["ulimit -f; ulimit -H -f 2>&1; ulimit -f unlimited; echo raise=$?"], agent=agent
    )
    blocks = Settings().command_max_file_bytes // 1024
    assert outs[0].splitlines()[:2] == [str(blocks), str(blocks)]
    assert "raise=1" in outs[0]  # a command cannot raise its own hard limits


# ----------------------------------------------------------------- finding 1: network policy


def test_no_network_by_default(control, gateway, script_name, web_server):
    port = urlsplit(web_server.base_url).port
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [f"(exec 3<>/dev/tcp/127.0.0.1/{port}) && echo CONNECTED || echo REFUSED; echo proxy=${{HTTP_PROXY:-none}}"],
    )
    assert view.status == TurnStatus.completed
    assert "REFUSED" in outs[0] and "CONNECTED" not in outs[0] and "proxy=none" in outs[0]


def _python(code: str) -> str:
    """A command running ``code`` with the worker's Python (mounted read-only in the sandbox)."""
    return f"{os.path.realpath(sys.executable)} -I -S - <<'PYEOF'\n{code}\nPYEOF"


def _fetch(url: str) -> str:
    return _python(
        "import urllib.request, urllib.error\n"
        "try:\n"
        f"    print('BODY', urllib.request.urlopen('{url}', timeout=20).read()[:300])\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('HTTP', e.code, e.read().decode())"
    )


def test_egress_goes_through_the_guarded_proxy(control, gateway, script_name, web_server):
    host, redis_port = redis_address()
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [
            _fetch(f"{web_server.base_url}/article"),  # allowed by the test-only loopback port
            _fetch(f"http://{host}:{redis_port}/"),  # Redis: loopback, refused
            _fetch("http://169.254.169.254/latest/meta-data/"),
            _fetch("http://10.0.0.1/"),
            f"(exec 3<>/dev/tcp/{host}/{redis_port}) && echo CONNECTED || echo REFUSED",  # no way around the proxy
        ],
        network="egress",
    )
    assert view.status == TurnStatus.completed
    assert "BODY" in outs[0] and "Celery barriers" in outs[0]
    assert "HTTP 403" in outs[1] and "loopback" in outs[1]
    assert "HTTP 403" in outs[2] and "metadata" in outs[2]
    assert "HTTP 403" in outs[3] and "private" in outs[3]
    assert "REFUSED" in outs[4] and "CONNECTED" not in outs[4]


def test_egress_host_allowlist(control, gateway, script_name, web_server):
    view, outs = run_commands(
        control,
        gateway,
        script_name,
        [_fetch(f"{web_server.base_url}/article")],
        network="egress",
        egress_allow_hosts=["example.org"],
    )
    assert "HTTP 403" in outs[0] and "allowlist" in outs[0] and "Celery barriers" not in outs[0]


# ----------------------------------------------------------------- finding 3 of the brief: never a silent fallback


def _run_direct(tmp_path, command: str, **settings):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    ctx = TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings(homes_root=tmp_path, **settings))
    tool = {t.name: t for t in create_computer_tools(ctx)}["run_command"]
    return home, tool.execute(
        tool.input_model(command=command), ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal())
    )


def test_broken_bwrap_path_refuses_naming_the_setting(tmp_path):
    home, r = _run_direct(tmp_path, "touch ran", command_sandbox_bwrap=str(tmp_path / "no-such-bwrap"))
    assert r.is_error
    assert "AGENT_COMMAND_SANDBOX_BWRAP" in r.content and "AGENT_COMMAND_SANDBOX=off" in r.content
    assert r.details["sandbox"] == "unavailable"
    assert not (home / "ran").exists()


@pytest.mark.parametrize("cause", ["No permissions to create new namespace, likely because the kernel does not allow"])
def test_failing_sandbox_probe_refuses_with_the_cause(tmp_path, cause):
    fake = tmp_path / "bwrap"
    fake.write_text(f"#!/bin/sh\necho 'bwrap: {cause}' >&2\nexit 1\n")
    fake.chmod(0o755)
    home, r = _run_direct(tmp_path, "touch ran", command_sandbox_bwrap=str(fake))
    assert r.is_error and "No permissions to create new namespace" in r.content
    assert "user namespaces" in r.content and "AGENT_COMMAND_SANDBOX" in r.content
    assert not (home / "ran").exists()
