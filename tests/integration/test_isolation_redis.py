"""Issue 9, Redis with credentials: attacks against the real embedded Redis and real workers.

The suite's Redis (tests/conftest.py) is an ``EmbeddedRedis``: ``default`` user locked by a password nobody is given, ACL users
``worker`` (``REDIS_URL``) and ``control`` (``CONTROL_REDIS_URL``) with fresh passwords. Every
other test of the suite runs through those users, which proves workers, beat and the control
plane authenticate; these tests prove what is refused.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from tests.conftest import ROOT
from tests.integration.conftest import broker_app, start_worker_process, stop_process
from tests.support.scripts import fc, msg
from worker.turn.request import TurnStatus


def _parts(url: str):
    p = urlsplit(url)
    return p.hostname, p.port, p.username, p.password


@pytest.fixture(scope="module")
def urls():
    worker_url, control_url = os.environ["REDIS_URL"], os.environ["CONTROL_REDIS_URL"]
    # A test that finds the suite on a Redis without credentials fails rather than skips.
    assert _parts(worker_url)[3] and _parts(control_url)[3], "the suite's Redis must require credentials"
    return worker_url, control_url


def test_unauthenticated_client_is_refused(urls):
    host, port, _, _ = _parts(urls[0])
    # What a process with only a socket would send (e.g. `printf 'LPUSH tools x\r\n' | nc`).
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(b"LPUSH tools x\r\nGET turn:{t}:items\r\nKEYS *\r\n")
        replies = b""
        while replies.count(b"\r\n") < 3:
            chunk = s.recv(4096)
            if not chunk:
                break
            replies += chunk
    assert replies.count(b"-NOAUTH") == 3, replies
    anon = redis.Redis(host=host, port=port, socket_connect_timeout=2)  # redis-py opens with HELLO
    with pytest.raises(redis.exceptions.AuthenticationError, match="NOAUTH|authenticated"):
        anon.get("anything")
    # The default user has a password nobody is given: "AUTH default <anything>" fails.
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host=host, port=port, password="", username="default").ping()


@pytest.mark.parametrize("user", ["worker", "control", "default", "admin"])
def test_wrong_password_is_refused(urls, user):
    host, port, _, _ = _parts(urls[0])
    with pytest.raises(redis.exceptions.AuthenticationError, match="WRONGPASS|invalid username-password"):
        redis.Redis(host=host, port=port, username=user, password="not-the-password").ping()


def test_worker_and_control_plane_authenticate_as_their_own_users(urls, control):
    assert redis.Redis.from_url(urls[0]).acl_whoami() == "worker"
    assert control.redis.acl_whoami() == "control"
    assert "***" in control.display_url and _parts(urls[1])[3] not in control.display_url


@pytest.mark.parametrize("which", [0, 1], ids=["worker", "control"])
@pytest.mark.parametrize(
    "command",
    [
        ("FLUSHALL",),
        ("FLUSHDB",),
        ("CONFIG", "GET", "requirepass"),
        ("CONFIG", "SET", "dir", "/tmp"),
        ("MODULE", "LOAD", "/tmp/evil.so"),
        ("DEBUG", "SLEEP", "0"),
        ("ACL", "SETUSER", "evil", "on", ">x", "+@all"),
        ("ACL", "LIST"),
        ("KEYS", "*"),
        ("MONITOR",),
        ("SHUTDOWN", "NOSAVE"),
        ("CLIENT", "KILL", "TYPE", "normal"),
        ("REPLICAOF", "127.0.0.1", "1"),
        ("BGSAVE",),
    ],
)
def test_admin_and_dangerous_commands_are_refused(urls, which, command):
    client = redis.Redis.from_url(urls[which])
    # NOPERM from the ACL; DEBUG and MODULE are also off server-wide in Redis 7 ("not allowed").
    with pytest.raises(redis.exceptions.ResponseError, match="no permissions|not allowed"):
        client.execute_command(*command)
    assert client.ping()  # the server is still there


def test_make_redis_keeps_the_password_out_of_the_terminal(tmp_path):
    """``make redis``: the URLs go to a 0600 file (removed on exit), the terminal shows them redacted."""
    from devtools.ports import free_port

    env_file = tmp_path / "redis.env"
    proc = subprocess.Popen(
        [sys.executable, "-m", "devtools.embedded_redis", "--port", str(free_port()), "--env-file", str(env_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "credentials in" in line:
                break
        assert env_file.exists(), "".join(lines)
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        values = dict(
            line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines() if line.strip()
        )
        worker_url, control_url = (values[k].strip("'") for k in ("REDIS_URL", "CONTROL_REDIS_URL"))
        assert redis.Redis.from_url(worker_url).acl_whoami() == "worker"
        assert redis.Redis.from_url(control_url).acl_whoami() == "control"
        printed = "".join(lines)
        for url in (worker_url, control_url):
            assert _parts(url)[3] not in printed
        assert "worker:***@" in printed
    finally:
        proc.terminate()
        proc.wait(30)
    assert not env_file.exists()


def _files_under(root: Path, since: float | None = None):
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = Path(dirpath) / name
            try:
                if path.is_symlink() or (since is not None and path.stat().st_mtime < since):
                    continue
                yield path
            except OSError:
                continue


def test_credentials_are_in_no_file_a_sandbox_binds_nor_in_worker_logs(urls, solo_worker, homes_root):
    """Agent homes, the venv (files written during this session), ``var/node`` and the worker's
    log never hold a Redis password (Celery prints the broker URL masked)."""
    secrets = [_parts(u)[3].encode() for u in urls]
    from tests import conftest

    session_start = conftest._state["started"]
    places = [homes_root, ROOT / "var" / "node"]
    checked = 0
    for place in places:
        for path in _files_under(place):
            data = path.read_bytes()
            checked += 1
            assert not any(s in data for s in secrets), f"a Redis password is in {path}"
    for path in _files_under(Path(sys.prefix), since=session_start):
        data = path.read_bytes()
        assert not any(s in data for s in secrets), f"a Redis password is in {path}"
    log = Path(solo_worker.log_path).read_bytes()
    assert log, "the worker log is empty: nothing was checked"
    assert not any(s in log for s in secrets)


# ----------------------------------------------------------------- celery#4308: a malformed queue message

MALFORMED = [
    b"x",  # not JSON: kombu's json.loads raised in the consumer loop (worker exit)
    b"\xff\xfe\x00",  # not UTF-8
    b"{}",  # JSON without properties
    b"[1, 2, 3]",
    b"42",
    b'{"properties": {"delivery_tag": 1}}',
    b'{"properties": {"delivery_tag": "t", "delivery_info": {"exchange": "", "routing_key": "tools"},'
    b' "body_encoding": "base64"}, "body": "%%%not base64%%%"}',
    b'{"properties": {"delivery_tag": "t", "delivery_info": {"exchange": "", "routing_key": "tools"},'
    b' "body_encoding": "rot13"}, "body": "x"}',
    # Well-formed envelopes with a bad payload: Celery itself refuses these.
    b'{"properties": {"delivery_tag": "t2", "delivery_info": {"exchange": "", "routing_key": "tools"}},'
    b' "body": "not json", "content-type": "application/json", "content-encoding": "utf-8", "headers": {}}',
    b'{"properties": {"delivery_tag": "t3", "delivery_info": {"exchange": "", "routing_key": "tools"}},'
    b' "body": "gASVAAAAAAAAAAA=", "content-type": "application/x-python-serialize", "headers": {"task": "x"}}',
    b'{"properties": {"delivery_tag": "t4", "delivery_info": {"exchange": "", "routing_key": "tools"}},'
    b' "body": "[[], {}, {}]", "content-type": "application/json", "content-encoding": "utf-8",'
    b' "headers": {"task": "no.such.task", "id": "i4"}}',
    b'{"properties": {"delivery_tag": "t5", "delivery_info": {"exchange": "", "routing_key": "tools"}},'
    b' "body": "not json", "content-type": "application/json", "headers": {"task": "no.such", "id": "i5"}}',
]


def test_malformed_messages_on_the_tools_queue_do_not_kill_the_worker(urls, gateway, script_name):
    """A worker on its own Redis database (so no other worker takes the messages) gets every
    malformed message on ``tools``, stays up, answers a ping and then finishes a turn."""
    from control.client import ControlPlane

    db = 7
    worker_url = urls[0].rsplit("/", 1)[0] + f"/{db}"
    control_url = urls[1].rsplit("/", 1)[0] + f"/{db}"
    r = redis.Redis.from_url(worker_url)
    r.delete("tools")
    proc = start_worker_process("--pool", "solo", "-c", "1", env={"REDIS_URL": worker_url}, broker_url=worker_url)
    try:
        for item in MALFORMED:
            r.lpush("tools", item)
        deadline = time.monotonic() + 60
        while r.llen("tools") and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert proc.poll() is None, f"the worker exited; see {proc.log_path}"
        assert r.llen("tools") == 0, "the worker stopped consuming the tools queue"
        app = broker_app(worker_url)
        replies = app.control.ping(destination=[proc.node_name], timeout=5)
        assert replies and proc.node_name in replies[0]
        gateway.add_script(script_name, [{"output": [fc("list_files", '{"path": "."}')]}, {"output": [msg("fine")]}])
        cp = ControlPlane(control_url)
        turn_id = cp.enqueue({"agent_id": f"m-{uuid.uuid4().hex[:6]}", "input": "go", "model": script_name})
        view = cp.wait(turn_id, timeout=60)
        assert view.status == TurnStatus.completed and view.final_output == "fine"
        log = Path(proc.log_path).read_text()
        assert log.count("dropped a malformed message") >= 9
        proc.terminate()
        proc.wait(30)  # answers SIGTERM (the upstream bug also left workers ignoring it)
    finally:
        stop_process(proc)
