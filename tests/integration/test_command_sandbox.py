"""The command sandbox's parts, called directly: mounts, limits, the egress proxy's rules, the opt-out."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from worker.settings import Settings
from worker.tools.computer import launch, privileges, sandbox
from worker.tools.computer.egress import EgressProxy, host_allowed
from worker.tools.web.address_guard import BlockedAddressError

ROOT = Path(__file__).resolve().parents[2]


def test_limits_line_has_every_limit():
    limits = sandbox.Limits.from_settings(Settings())
    line = limits.ulimit_line()
    for flag, value in (("-t", 300), ("-v", 4 * 1024**2), ("-u", 256), ("-f", 1024**2), ("-n", 1024), ("-c", 0)):
        assert f"{flag} {value}" in line


def test_bind_sources_never_expose_homes_or_the_project(tmp_path):
    homes = tmp_path / "homes"
    homes.mkdir()
    for bad in ("/", "/root", "/proc", "/run", "/home", "/var", str(tmp_path), str(homes)):
        assert sandbox.check_bind_source(bad, homes), bad
    assert sandbox.check_bind_source(str(ROOT), homes)  # the project (cwd of the tests) holds var/
    assert sandbox.check_bind_source(str(homes / "x"), homes) is None  # below the root is not a holder
    settings = Settings(homes_root=homes, command_extra_path=os.pathsep.join(["/", str(tmp_path), "/nonexistent"]))
    # Only the Python prefix, whatever was asked for.
    assert sandbox.readonly_sources(settings) == sandbox.readonly_sources(Settings(homes_root=homes))


def test_extra_path_brings_its_venv_and_node_modules(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    mods = tmp_path / "node" / "node_modules" / ".bin"
    mods.mkdir(parents=True)
    settings = Settings(homes_root=tmp_path / "homes", command_extra_path=f"{venv / 'bin'}:{mods}")
    sources = sandbox.readonly_sources(settings)
    assert str(venv) in sources and str(mods.parent) in sources


def test_host_allowlist_rules():
    assert host_allowed("example.org", None)
    assert host_allowed("Example.ORG.", ("example.org",))
    assert not host_allowed("a.example.org", ("example.org",))
    assert host_allowed("a.example.org", (".example.org",)) and host_allowed("example.org", (".example.org",))
    assert not host_allowed("badexample.org", (".example.org",))


def test_proxy_vets_like_web_fetch():
    proxy = EgressProxy()
    try:
        assert proxy._vet("93.184.215.14", 443) == ["93.184.215.14"]  # public: attempted
        for host in ("127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]", "100.100.100.200", "localhost"):
            with pytest.raises(BlockedAddressError):
                proxy._vet(host.strip("[]"), 80)
    finally:
        proxy.close()
    assert not os.path.exists(proxy.socket_path)
    loop = EgressProxy(loopback_ports=frozenset({8080}))
    try:
        assert loop._vet("127.0.0.1", 8080) == ["127.0.0.1"]
        with pytest.raises(BlockedAddressError):
            loop._vet("127.0.0.1", 6379)
    finally:
        loop.close()


def test_process_limit_counts_one_agent(tmp_path):
    """The process cap (``AGENT_COMMAND_MAX_PROCESSES``) counts this agent's processes only.

    A root worker runs each agent as its own uid, so RLIMIT_NPROC counts that agent: 20 processes
    of another uid do not stop 6 inside a command capped at 12; 30 inside are refused. Every
    process lives until its command ends (no timing: the count cannot drop while the loop runs),
    and the uids are this test's own (no other suite's processes count).
    """
    from worker.tooling.contract import AbortSignal, ToolContext
    from worker.tools.computer import homes
    from worker.tools.computer.catalog import create_computer_tools
    from worker.turn.context import TurnContext

    home = tmp_path / f"np-{uuid.uuid4().hex[:8]}"
    settings = Settings(command_max_processes=12)
    agent = homes.provision(settings, home)
    ctx = TurnContext(turn_id="t", agent_id=home.name, home=home, settings=settings)
    tool = {t.name: t for t in create_computer_tools(ctx)}["run_command"]

    def inside(n: int) -> str:
        spawn = f"i=0; while [ $i -lt {n} ]; do sleep 600 & i=$((i+1)); done; echo spawned-{n}"
        r = tool.execute(
            tool.input_model(command=f"exec /bin/sh -c '{spawn}'", timeout_seconds=60),  # sh: no fork retries
            ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal()),
        )
        return r.content

    other = None
    if os.geteuid() == 0:
        assert agent.uid is not None
        other = agent.uid + 1 if agent.uid + 1 < settings.uid_base + settings.uid_count else agent.uid - 1
    outside = [
        subprocess.Popen(["sleep", "600"], user=other, group=other, extra_groups=[] if other is not None else None)
        for _ in range(20)
    ]
    try:
        out = inside(6)
        assert "spawned-6" in out and "fork" not in out.lower(), out
        out = inside(30)
        assert "fork" in out.lower() and "spawned-30" not in out, out
    finally:
        for p in outside:
            p.kill()
            p.wait()


def test_off_is_logged_as_a_warning(caplog, monkeypatch):
    monkeypatch.setattr(launch, "_warned_off", False)
    with caplog.at_level(logging.WARNING, logger="worker.tools.computer.launch"):
        assert launch.startup_check(Settings(command_sandbox="off")) == "off"
    assert any("UNSANDBOXED" in r.message and r.levelno == logging.WARNING for r in caplog.records)


def test_startup_check_reports_the_sandbox():
    status = launch.startup_check(Settings())
    assert status.startswith("bwrap ") and "process cap by" in status


def test_limits_are_checked_at_a_tools_nodes_start(tmp_path, caplog, monkeypatch):
    """Issue 30: the per-agent limits are reported once, at start, not at each pool process's first
    call: a real probe image is made, mounted and removed; off is a WARNING naming the setting."""
    from worker.tools.computer import homes

    status = launch.limits_check(Settings(homes_root=tmp_path / "homes"))
    assert (
        status["quota"].endswith(".images)")
        and " MB per home" in status["quota"]
        and status["memory"].startswith("a cgroup per command")
    )
    assert status["uid"].startswith("one per agent")
    assert not homes.mounted_under(tmp_path) and not list((tmp_path / "homes" / ".images").glob(".probe*"))
    monkeypatch.setattr(homes, "_warned_off", False)
    monkeypatch.setattr(launch, "_warned_no_memory_cgroup", False)
    with caplog.at_level(logging.WARNING):
        off = launch.limits_check(Settings(homes_root=tmp_path / "h2", home_quota_mb=0, command_memory_cgroup=False))
    assert off["quota"].startswith("off") and off["memory"].startswith("off")
    said = " ".join(r.message for r in caplog.records if r.levelno == logging.WARNING)
    assert "AGENT_HOME_QUOTA_MB=0" in said and "AGENT_COMMAND_MEMORY_CGROUP=0" in said


def test_egress_proxy_closes_its_connections():
    proxy = EgressProxy()
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(proxy.socket_path)
    client.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\nHost: 10.0.0.1\r\n\r\n")
    reply = client.recv(4096)
    assert reply.startswith(b"HTTP/1.1 403") and b"private address" in reply
    client.close()
    proxy.close()
    deadline = time.monotonic() + 2
    while os.path.exists(proxy.socket_path) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.refusals and not os.path.exists(proxy.socket_path)


def test_egress_proxy_bounds_what_a_command_holds_of_the_worker(monkeypatch):
    """Found by an attacker: 24,000 half-sent requests from one command took 20,000 threads and every
    descriptor of the worker. Connections are capped per proxy (more are refused at once) and a
    request head that never comes is dropped after HEAD_TIMEOUT."""
    from worker.tools.computer import egress

    monkeypatch.setattr(egress, "HEAD_TIMEOUT", 0.5)
    proxy = EgressProxy()
    held = []
    try:
        for _ in range(egress.MAX_CONNECTIONS):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(proxy.socket_path)
            s.sendall(b"CONNECT half")  # never finished
            held.append(s)
        extra = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        extra.connect(proxy.socket_path)
        extra.settimeout(5)
        assert extra.recv(4096).startswith(b"HTTP/1.1 503")
        extra.close()
        for s in held:  # each half-sent request is dropped by the proxy after HEAD_TIMEOUT
            s.settimeout(5)
            assert s.recv(4096) == b""
        threads = [t for t in threading.enumerate() if t.name == "egress-conn"]
        assert len(threads) <= egress.MAX_CONNECTIONS
        again = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # slots are free again
        again.connect(proxy.socket_path)
        again.sendall(b"CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n")
        again.settimeout(5)
        assert again.recv(4096).startswith(b"HTTP/1.1 403")
        again.close()
    finally:
        for s in held:
            s.close()
        proxy.close()


def test_no_nested_user_namespaces_and_no_capabilities(tmp_path):
    from worker.tooling.contract import AbortSignal, ToolContext
    from worker.tools.computer.catalog import create_computer_tools
    from worker.turn.context import TurnContext

    home = tmp_path / "home"
    home.mkdir()
    ctx = TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings(homes_root=tmp_path))
    tool = {t.name: t for t in create_computer_tools(ctx)}["run_command"]
    command = "unshare -U true; echo userns=$?; grep -E '^(Cap|NoNewPrivs)' /proc/self/status; id -u; hostname"
    r = tool.execute(
        tool.input_model(command=command), ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal())
    )
    assert "userns=1" in r.content
    for cap in privileges.CAP_FIELDS:  # every set empty, as the command itself reads it
        assert f"{cap}:\t0000000000000000" in r.content
    assert "NoNewPrivs:\t1" in r.content and privileges.command_held(r.content) == []
    settings = Settings()
    uid = int(r.content.split("\nagent\n")[0].rsplit("\n", 1)[1])
    if os.geteuid() == 0:  # a root worker: the agent's own unprivileged uid, never root
        assert settings.uid_base <= uid < settings.uid_base + settings.uid_count
    else:
        assert uid == sandbox.SANDBOX_UID


def test_the_probe_reads_what_a_command_holds():
    """The probe's command prints its own status: every capability set empty, no_new_privs on."""
    status = launch.startup_check(Settings())
    assert status.endswith("a command holds CapInh 0x0, CapPrm 0x0, CapEff 0x0, CapBnd 0x0, CapAmb 0x0, NoNewPrivs 1")


PROBE = """
import sys
from worker.settings import Settings
from worker.tools.computer import privileges, sandbox
if sys.argv[1:] == ["unchecked"]:  # the worker's own grants not checked: what its command keeps
    privileges.worker_refusal = lambda status=None: None
try:
    sandbox.probe(sandbox.find_bwrap(Settings()), Settings())
    print("ready")
except sandbox.SandboxUnavailable as exc:
    print(exc)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a root worker's grants (a worker that is not root has a user namespace)")
def test_a_root_worker_without_setpcap_runs_no_command():
    """A root worker without CAP_SETPCAP (the tools container before it was granted) cannot empty a
    command's bounding set: its probe refuses by name. Without that check, bookworm's setpriv left
    the command every capability but the one dropped here, and the command's own status says so:
    the probe refuses that too; a newer setpriv fails the sandbox outright."""
    no_setpcap = ["setpriv", "--bounding-set=-setpcap", "--inh-caps=-setpcap", sys.executable, "-c", PROBE]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(no_setpcap, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert run.stdout.startswith("command sandbox unavailable: the tools worker lacks CAP_SETPCAP: "), run
    run = subprocess.run([*no_setpcap, "unchecked"], capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    kept = "command sandbox unavailable: an agent's command would keep privileges: CapBnd "
    assert run.stdout.startswith((kept, "command sandbox unavailable: bwrap cannot create the sandbox")), run
    if run.stdout.startswith(kept):
        assert "CAP_SYS_ADMIN" in run.stdout and "CAP_SETPCAP" not in run.stdout.split(" (every")[0], run
    assert subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, env=env,
                          cwd=ROOT).stdout == "ready\n"  # fmt: skip
