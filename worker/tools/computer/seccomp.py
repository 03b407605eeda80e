"""The sandbox's seccomp filter: system calls a command never needs fail (docs/isolation.md, "Limits per agent").

Compiled once per process with libseccomp (the C library Docker, systemd and
Flatpak use; Debian's ``libseccomp2``) through the ``pyseccomp`` binding, and
handed to ``bwrap --seccomp FD``, which loads it just before the command
starts. The default is to allow; what it refuses:

- ``EPERM``: mounting (``mount``, the new mount API, ``pivot_root``,
  ``chroot``), namespaces (``unshare``, ``setns``, ``clone`` with a
  ``CLONE_NEW*`` flag), tracing other processes (``ptrace``,
  ``process_vm_*``, ``pidfd_getfd``), the kernel keyring (``keyctl``,
  ``add_key``, ``request_key``), ``bpf``, ``perf_event_open``,
  ``userfaultfd``, ``io_uring_*`` (its operations bypass seccomp), kernel
  modules, ``kexec``, ``reboot``, swap, ``acct``, quotas, ``syslog``, clock
  setting, ``open_by_handle_at``, and terminal injection (``ioctl``
  ``TIOCSTI``/``TIOCLINUX``);
- ``EPERM``: setting a setuid or setgid bit: ``chmod``/``fchmod``/``fchmodat``/
  ``fchmodat2``, ``mkdir``/``mknod`` and ``open``/``openat``/``creat`` with
  ``O_CREAT`` or ``O_TMPFILE`` whose mode has ``S_ISUID`` or ``S_ISGID``. So no
  file a command leaves keeps such a bit (the home is also mounted ``nosuid``
  and owned by the agent's unprivileged uid: the bit would grant nothing);
- ``ENOSYS`` (programs fall back, as for an older kernel): ``clone3`` (its
  flags are in memory, out of a filter's reach; glibc falls back to
  ``clone``), ``openat2``, and every system call numbered above the newest
  this filter knows (``NEWEST_KNOWN``), so a future call cannot slip past it.
- other architectures' system calls (the 32-bit ABI on x86-64) kill the
  process (libseccomp's default for a foreign architecture).
"""

from __future__ import annotations

import errno
import functools
import os
import stat
from typing import Any

EPERM = errno.EPERM
# x86-64 / aarch64 share numbers from 424 on; 453 is map_shadow_stack (Linux 6.6).
NEWEST_KNOWN = 453
BLOCK_UP_TO = 560

DENIED = (
    "mount umount umount2 pivot_root chroot move_mount open_tree fsopen fsmount fsconfig fspick mount_setattr "
    "unshare setns ptrace process_vm_readv process_vm_writev pidfd_getfd keyctl add_key request_key bpf "
    "perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register init_module finit_module "
    "delete_module kexec_load kexec_file_load reboot swapon swapoff acct quotactl quotactl_fd syslog iopl ioperm "
    "settimeofday clock_settime clock_adjtime adjtimex lookup_dcookie vhangup open_by_handle_at name_to_handle_at"
).split()
NOT_IMPLEMENTED = ("clone3", "openat2")
CLONE_NEW_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000, 0x00000080)
TERMINAL_IOCTLS = (0x5412, 0x541C)  # TIOCSTI, TIOCLINUX
# (system call, index of its mode argument, index of its flags argument or None)
MODE_CALLS = (
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("mkdir", 1, None),
    ("mkdirat", 2, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("creat", 1, None),
    ("open", 2, 1),
    ("openat", 3, 2),
)
SPECIAL_BITS = (stat.S_ISUID, stat.S_ISGID)
O_TMPFILE_BITS = 0o20000000  # __O_TMPFILE (O_TMPFILE also carries O_DIRECTORY)


class SeccompUnavailable(RuntimeError):
    """The filter cannot be compiled here (no libseccomp); the message says what to install."""


def _library() -> Any:  # the pyseccomp module (untyped)
    try:
        import pyseccomp
    except Exception as exc:  # ImportError, or OSError/TypeError when libseccomp.so.2 is missing
        raise SeccompUnavailable(
            f"the seccomp filter needs libseccomp (Debian package libseccomp2) and the pyseccomp package ({exc})"
        ) from None
    return pyseccomp


@functools.lru_cache(maxsize=1)
def program() -> bytes:
    """The compiled BPF program (cached). Raises ``SeccompUnavailable``."""
    sc = _library()
    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(EPERM)

    def add(action: int, name: str | int, *args: object) -> None:
        try:
            f.add_rule(action, name, *args)
        except (OSError, ValueError, RuntimeError):
            pass  # a system call this architecture does not have (umount, iopl on aarch64...)

    for name in DENIED:
        add(deny, name)
    for name in NOT_IMPLEMENTED:
        add(sc.ERRNO(errno.ENOSYS), name)
    for number in range(NEWEST_KNOWN + 1, BLOCK_UP_TO):
        add(sc.ERRNO(errno.ENOSYS), number)
    for flag in CLONE_NEW_FLAGS:
        add(deny, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in TERMINAL_IOCTLS:
        add(deny, "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    for name, mode_arg, flags_arg in MODE_CALLS:
        for bit in SPECIAL_BITS:
            mode = sc.Arg(mode_arg, sc.MASKED_EQ, bit, bit)
            if flags_arg is None:
                add(deny, name, mode)
            else:
                for creating in (os.O_CREAT, O_TMPFILE_BITS):
                    add(deny, name, mode, sc.Arg(flags_arg, sc.MASKED_EQ, creating, creating))
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    try:
        with open(fd, "wb", closefd=False) as out:
            f.export_bpf(out)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def program_fd() -> int:
    """A fresh descriptor holding ``program()`` at offset 0, for ``bwrap --seccomp`` (the caller
    passes it and closes its copy). Raises ``SeccompUnavailable``."""
    data = program()
    fd = os.memfd_create("seccomp")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
