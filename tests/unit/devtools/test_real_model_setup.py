"""The real-model tier's setup that runs without the model (docs/real-model.md): the chat template
derivation, the server's argv, ``serve`` stopping the server on SIGTERM (and the server dying with
its parent), and the tier's folder left out of a run over the whole suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.real_model import CMAKE_FLAGS, TEMPLATE_EDITS, LlamaServer, derive_tool_template

SHIPPED = "".join(f"<before {n}>{theirs}" for n, (theirs, _) in enumerate(TEMPLATE_EDITS)) + "<end>"


def test_the_derived_template_writes_calls_as_bare_json():
    derived = derive_tool_template(SHIPPED)
    assert derived == "".join(f"<before {n}>{ours}" for n, (_, ours) in enumerate(TEMPLATE_EDITS)) + "<end>"
    assert "<tool_call>" not in derived and "{{\\" not in derived


@pytest.mark.parametrize("n", range(len(TEMPLATE_EDITS)))
def test_a_template_without_one_markup_or_with_it_twice_is_refused(n):
    theirs = TEMPLATE_EDITS[n][0]
    with pytest.raises(ValueError, match="chat template has changed"):
        derive_tool_template(SHIPPED.replace(theirs, ""))
    with pytest.raises(ValueError, match="chat template has changed"):
        derive_tool_template(SHIPPED + theirs)


def test_the_tier_is_not_collected_by_default(pytestconfig):
    from tests.conftest import REAL_MODEL_TESTS, pytest_ignore_collect

    assert pytest_ignore_collect(REAL_MODEL_TESTS, pytestconfig) is True


def test_the_build_downloads_no_web_ui_and_the_server_returns_text_for_the_runtime_to_read():
    assert "-DLLAMA_USE_PREBUILT_UI=OFF" in CMAKE_FLAGS and "-DLLAMA_BUILD_UI=ON" not in CMAKE_FLAGS
    argv = LlamaServer(Path("llama-server"), Path("m.gguf"), None).command(8080)
    assert "--skip-chat-parsing" in argv and "--no-webui" in argv and "--jinja" in argv


# A stand-in for llama-server: answers /health on --port, writes its pid where $FAKE_PID_FILE says.
FAKE_SERVER = """#!{python}
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a):
        pass
open(os.environ["FAKE_PID_FILE"], "w").write(str(os.getpid()))
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


def _gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":  # a zombie: dead, not yet reaped
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_serve_leaves_no_server_behind(tmp_path, stop):
    """``python -m devtools.real_model serve`` stopped by SIGTERM or Ctrl-C stops its llama-server;
    killed outright, the server dies with it (PR_SET_PDEATHSIG)."""
    fake = tmp_path / "llama-server"
    fake.write_text(FAKE_SERVER.format(python=sys.executable))
    fake.chmod(0o755)
    pid_file = tmp_path / "pid"
    code = (
        "from pathlib import Path; from devtools.real_model import LlamaServer, serve_until_stopped; "
        f"serve_until_stopped(LlamaServer(Path({str(fake)!r}), Path('m.gguf'), None, log=Path({str(tmp_path / 'log')!r})))"
    )
    serve = subprocess.Popen(
        [sys.executable, "-c", code],
        env={**os.environ, "FAKE_PID_FILE": str(pid_file)},
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert serve.stdout is not None
        assert "OPENAI_BASE_URL=http://127.0.0.1:" in serve.stdout.readline()
        server_pid = int(pid_file.read_text())
        serve.send_signal(stop)
        serve.wait(30)
        assert _gone(server_pid), f"llama-server {server_pid} still runs after serve got {stop.name}"
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
