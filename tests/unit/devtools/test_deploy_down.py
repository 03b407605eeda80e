"""``devtools.deploy_stack.down`` (``make deploy-down``) against a fake ``podman``: removal is never
forced (podman 4's ``rm -f`` SIGTERMs the host PIDs it recorded for exec sessions, stale PIDs that
may be anyone's, ``down``'s own included: exit 143), and ``main`` exits 0 only when everything
stopped and was removed, else 1 naming each problem."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from devtools import deploy_stack
from devtools.deploy_stack import Down, Stopped, down_problems, remove_command

REFUSED = "Error: container 0f3c has active exec sessions, refusing to clean up: container state improper"


class FakePodman:
    """``podman`` as ``down`` calls it: a project of three running containers; ``refuse`` names the
    containers whose ``rm`` fails as podman refuses one with a live exec-session PID."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.calls: list[list[str]] = []
        self.refuse = refuse
        self.removed: set[str] = set()
        self.containers = {"p_worker-turns_1": "worker-turns", "p_sentinel-1_1": "sentinel-1", "p_redis-1_1": "redis-1"}

    def __call__(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        self.calls.append(["podman", *args])
        out, err, code = "", "", 0
        if args[:2] == ("ps", "-a"):
            listed = [
                {"Names": [n], "Labels": {"com.docker.compose.service": s}, "State": "running"}
                for n, s in self.containers.items()
            ]
            out = json.dumps(listed)
        elif args[0] == "inspect":
            out = json.dumps([{"State": {"Status": "exited", "ExitCode": 0}}])
        elif args[:2] == ("rm", "--depend"):
            name = args[-1]
            if name in self.refuse:
                err, code = REFUSED, 2
            else:
                self.removed.add(name)
        elif args[:2] == ("container", "exists"):
            code = 1 if args[2] in self.removed else 0
        elif args[1:2] == ("ls",):
            out = "p_default\n" if args[0] == "network" else ""
        return subprocess.CompletedProcess(["podman", *args], code, out, err)


class FakeStop:
    """A ``podman stop`` started with ``subprocess.Popen``, done at once."""

    def __init__(self, argv: list[str], **kw: object) -> None:
        FakeStop.argvs.append(argv)

    def poll(self) -> int:
        return 0

    argvs: list[list[str]] = []


@pytest.fixture
def fake(monkeypatch):
    def make(refuse: tuple[str, ...] = ()) -> FakePodman:
        podman = FakePodman(refuse)
        monkeypatch.setattr(deploy_stack, "podman", podman)
        FakeStop.argvs = []
        monkeypatch.setattr(deploy_stack.subprocess, "Popen", FakeStop)
        return podman

    return make


def test_remove_command_never_forces():
    assert remove_command("container", "a") == ["rm", "--depend", "a"]
    assert remove_command("network", "n1", "n2") == ["network", "rm", "n1", "n2"]
    assert remove_command("volume", "v") == ["volume", "rm", "v"]


def test_down_stops_in_order_and_removes_without_force(fake):
    podman = fake()
    result = deploy_stack.down("p")
    assert [s.name for s in result.stopped] == ["p_worker-turns_1", "p_sentinel-1_1", "p_redis-1_1"]
    assert [argv[-1] for argv in FakeStop.argvs] == ["p_worker-turns_1", "p_sentinel-1_1", "p_redis-1_1"]
    removing = [argv for argv in podman.calls if "rm" in argv]
    assert removing and not any(a in ("-f", "--force") for argv in [*removing, *FakeStop.argvs] for a in argv)
    assert podman.removed == set(podman.containers) and result.not_removed == {}
    assert down_problems(result) == []


def test_a_container_podman_refuses_to_remove_is_reported_not_forced(fake):
    podman = fake(refuse=("p_sentinel-1_1",))
    result = deploy_stack.down("p")
    assert result.not_removed == {"p_sentinel-1_1": REFUSED}
    assert not any("-f" in argv for argv in podman.calls)
    assert down_problems(result) == [f"p_sentinel-1_1: not removed: {REFUSED}"]


def test_down_problems_name_a_sigkill_and_a_container_still_running():
    result = Down(
        [Stopped("a", "api", 137, 10.0), Stopped("b", "redis-1", 0, 60.0, state="running"), Stopped("c", "x", 0, 1.0)]
    )
    assert down_problems(result) == [
        "a: SIGKILLed (exit 137): stop_grace_period too short",
        "b: still running after its stop",
    ]


@pytest.mark.parametrize("refuse", [(), ("p_redis-1_1",)])
def test_main_exits_0_only_when_everything_stopped_and_was_removed(fake, monkeypatch, capsys, refuse):
    fake(refuse)
    monkeypatch.setattr(sys, "argv", ["deploy_stack", "down", "-p", "p"])
    if refuse:
        with pytest.raises(SystemExit) as exited:
            deploy_stack.main()
        assert exited.value.code == "p: down incomplete, 1 error(s) above"  # printed; exit status 1
        assert f"error: p_redis-1_1: not removed: {REFUSED}\n" in capsys.readouterr().err
    else:
        deploy_stack.main()  # returns: exit 0
        assert "p: 3 containers stopped and removed" in capsys.readouterr().out
