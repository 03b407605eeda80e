"""Agent homes on a node: a disk quota per home and a host uid per agent.

A home is ``<homes_root>/<agent_id>``. ``provision(settings, home)`` makes it
ready for the computer tools and returns an ``AgentHome``; ``release`` undoes
it (placement calls these when a node takes or gives up an agent).

Disk quota (``AGENT_HOME_QUOTA_MB``; docs/isolation.md, "Limits per agent": without it one agent
filled the disk Redis shared and every turn failed). Each home is its own ext4 file system:
an image file ``<images_root>/<agent_id>.img`` of the quota's size, loop-
mounted on the home with ``nosuid,nodev,noatime``. A full home fails the
agent's own writes with ``ENOSPC`` and touches nothing else. Why an image per
home and not project quotas: project quotas need the homes' file system to be
XFS or ext4 made with the ``project`` feature and mounted with ``prjquota``,
a host set-up the runtime cannot do or check; an image works on any
backing file system, brings its own ``nosuid``/``nodev`` mount, makes hard
links from outside the home impossible, and is one file to snapshot or move.
The image is allocated up front (``fallocate``; ``AGENT_HOME_IMAGE_PREALLOCATE``)
so that homes can never together fill the disk under them: a new home on a
full disk fails to be created, with the cause, instead. ``<images_root>``
defaults to ``<homes_root>/.images`` (agent ids start with a letter or digit,
so it is never a home); keep it, like the homes, off Redis's disk.

Mounting needs root (``CAP_SYS_ADMIN``) and loop devices. A worker that is not
root, with a quota set, gets ``HomeUnavailable`` naming the setting: no silent
fallback. ``AGENT_HOME_QUOTA_MB=0`` turns the quota off for development (a
WARNING, once): homes are then plain directories.

Host uid (without it a root worker's sandbox mapped to root, and a setuid copy
of bash left on the host gave ``nobody`` euid 0). A root worker gives each
agent its own unprivileged uid (= gid) from ``AGENT_UID_BASE`` ..
``+AGENT_UID_COUNT``: a hash of the agent id, probed linearly past uids that
another agent holds on this node (a claim file ``<images_root>/uids/<uid>``
made with ``O_EXCL``). The home's root belongs to it; commands run as it
(``sandbox.owner_prefix``: ``setpriv`` inside the sandbox) and what the
file tools create is given to it (``AgentHome.as_owner``).
A worker that is not root cannot switch uids: its agents share its own
(non-root) uid.

Concurrency: provisioning and release of one home hold an ``flock`` on
``<images_root>/<agent_id>.lock`` (pool processes of a node race for a home).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from worker.settings import Settings
from worker.tools.computer.home_fs import owned_by

log = logging.getLogger(__name__)

MOUNT_OPTIONS = "loop,nosuid,nodev,noatime"
COMMAND_TIMEOUT = 60.0
QUOTA_HINT = (
    "each agent home is a loop-mounted file system of AGENT_HOME_QUOTA_MB megabytes, which needs a root worker "
    "with loop devices (and mkfs.ext4, mount); for development only, AGENT_HOME_QUOTA_MB=0 turns the quota off"
)


class HomeUnavailable(RuntimeError):
    """The home cannot be made ready; the message names the cause and the setting."""


class HomeBusy(HomeUnavailable):
    """``release`` found the home's file system in use (a command still running in it)."""


@dataclass(frozen=True)
class AgentHome:
    """A home ready for the computer tools.

    ``path``: its real path; ``uid``/``gid``: the host ids its commands and
    files use (``None``: the worker's own, for a worker that is not root);
    ``quota_bytes``: the size of its file system (``None``: no quota).
    """

    path: Path
    uid: int | None
    gid: int | None
    quota_bytes: int | None

    def as_owner(self) -> contextlib.AbstractContextManager[None]:
        """A block in which what the file tools create in this thread is the agent's
        (``home_fs.owned_by``: ``fchown`` at creation). No-op for ``uid is None`` (a worker that
        is not root: the files are its own, never root's)."""
        if self.uid is None or self.gid is None:
            return contextlib.nullcontext()
        return owned_by((self.uid, self.gid))


def images_root(settings: Settings, home: Path) -> Path:
    """Where the home's image, lock and uid claims live: ``AGENT_HOME_IMAGES_ROOT`` or ``<home's parent>/.images``."""
    return Path(settings.home_images_root) if settings.home_images_root else home.parent / ".images"


def image_path(settings: Settings, home: Path) -> Path:
    """The image file of ``home`` (the unit to snapshot or move: unmounted, it is the whole home)."""
    return images_root(settings, home) / f"{home.name}.img"


_warned_off = False
_ready: dict[str, AgentHome] = {}


def quota_off_warning(settings: Settings) -> None:
    """Log, once per process, that homes have no disk quota (``AGENT_HOME_QUOTA_MB=0``)."""
    global _warned_off
    if settings.home_quota_mb == 0 and not _warned_off:
        _warned_off = True
        log.warning(
            "AGENT_HOME_QUOTA_MB=0: agent homes have NO disk quota; one agent can fill the disk under "
            "the homes (and Redis, if it shares it). Development only."
        )


@contextlib.contextmanager
def _locked(images: Path, name: str) -> Iterator[None]:
    images.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(images / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, env={"PATH": _PATH})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HomeUnavailable(f"{what} failed: {exc}; {QUOTA_HINT}") from None
    if proc.returncode != 0:
        cause = " ".join((proc.stderr or proc.stdout or f"exit status {proc.returncode}").split())[:300]
        raise HomeUnavailable(f"{what} failed ({cause}); {QUOTA_HINT}")


_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _claim_uid(settings: Settings, images: Path, name: str, wanted: int | None = None) -> int:
    """This agent's uid on this node: ``wanted`` (the owner of an existing home) when free or already
    its own, else the first free one from the hash of ``name``. Raises ``HomeUnavailable`` when the
    range is full."""
    claims = images / "uids"
    claims.mkdir(mode=0o700, exist_ok=True)
    base, count = settings.uid_base, settings.uid_count
    start = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count
    candidates = [wanted] if wanted is not None and base <= wanted < base + count else []
    for i in range(count):
        candidates.append(base + (start + i) % count)
        if len(candidates) > 4096:
            break
    for uid in candidates:
        path = claims / str(uid)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            if path.read_text() == name:
                return uid
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(name)
        return uid
    raise HomeUnavailable(f"no free agent uid in AGENT_UID_BASE={base} .. +AGENT_UID_COUNT={count} on this node")


def _chown_tree(root: Path, uid: int, gid: int) -> None:
    """Give everything under ``root`` (itself included) to ``uid:gid``, without following symlinks
    (``chown`` also clears setuid/setgid bits of files)."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            os.lchown(path, uid, gid)
    os.lchown(root, uid, gid)


def _fresh_image(settings: Settings, image: Path, uid: int) -> None:
    size = settings.home_quota_mb * 1024**2
    fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        try:
            if settings.home_image_preallocate:
                os.posix_fallocate(fd, 0, size)
            else:
                os.ftruncate(fd, size)
        except OSError as exc:
            raise HomeUnavailable(
                f"cannot allocate the {settings.home_quota_mb} MB image of the home at {image} "
                f"({os.strerror(exc.errno or 0)}): the disk of AGENT_HOME_IMAGES_ROOT is full"
            ) from None
    except BaseException:
        os.close(fd)
        image.unlink(missing_ok=True)
        raise
    os.close(fd)
    try:
        # nodiscard: mkfs would otherwise punch holes in the image and undo the allocation.
        _run(
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={uid}:{uid},nodiscard", str(image)],
            "creating the home's file system (mkfs.ext4)",
        )
    except BaseException:
        image.unlink(missing_ok=True)
        raise


def _mount(image: Path, target: Path) -> None:
    _run(["mount", "-o", MOUNT_OPTIONS, str(image), str(target)], f"mounting the home's image on {target}")


def _umount(target: Path, lazy: bool = False) -> None:
    argv = ["umount", *(["-l"] if lazy else []), str(target)]
    try:
        _run(argv, f"unmounting {target}")
    except HomeUnavailable as exc:
        if "busy" in str(exc):
            raise HomeBusy(f"the home {target} is in use (a command is still running in it)") from None
        raise


def _copy_tree(src: Path, dst: Path) -> None:
    """Copy directories, symlinks (as links) and regular files with one link from ``src`` into
    ``dst``; anything else (a hard-linked file, whose other name may lie outside the home; FIFOs,
    sockets, devices) is left out, as the file tools would refuse it."""
    for dirpath, dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target = dst / rel if rel != "." else dst
        for name in dirnames:
            path = os.path.join(dirpath, name)
            if os.path.islink(path):
                os.symlink(os.readlink(path), target / name)
            else:
                (target / name).mkdir()
        for name in filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(path), target / name)
            elif stat.S_ISREG(st.st_mode) and st.st_nlink == 1:
                shutil.copyfile(path, target / name, follow_symlinks=False)
                os.chmod(target / name, st.st_mode & 0o777)
            else:
                log.warning("moving %s into its image: %s left out (not a lone regular file)", src, path)


def _migrate(image: Path, home: Path, images: Path, uid: int) -> None:
    """Move what a plain-directory home holds (made before the quota was on) into its new image."""
    staging = images / f".mnt-{home.name}"
    staging.mkdir(mode=0o700, exist_ok=True)
    _mount(image, staging)
    try:
        _copy_tree(home, staging)
        _chown_tree(staging, uid, uid)
    finally:
        _umount(staging)
        staging.rmdir()
    for entry in list(home.iterdir()):
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def provision(settings: Settings, home: Path | str) -> AgentHome:
    """Make ``home`` ready (created, its image mounted, owned by the agent's uid) and return it.

    Idempotent and cheap once done (a cached answer, checked with one ``ismount``). Raises
    ``HomeUnavailable`` (message naming the cause and the setting) when the quota is on and the
    worker cannot mount (not root, no loop devices, no ``mkfs.ext4``), or the image cannot be
    allocated.
    """
    home = Path(os.path.abspath(home))
    key = str(home)
    quota = settings.home_quota_mb
    cached = _ready.get(key)
    if cached is not None and cached.quota_bytes == (quota * 1024**2 or None):
        if quota == 0 or os.path.ismount(home):
            return cached
    root = os.geteuid() == 0
    if quota == 0:
        quota_off_warning(settings)
    elif not root:
        raise HomeUnavailable(
            f"agent homes have a disk quota (AGENT_HOME_QUOTA_MB={quota}) and this worker is not root: "
            f"it cannot mount them; {QUOTA_HINT}"
        )
    images = images_root(settings, home)
    with _locked(images, home.name):
        home.mkdir(parents=True, exist_ok=True)
        uid: int | None = None
        if quota:
            if not os.path.ismount(home):
                image = image_path(settings, home)
                if not image.exists():
                    uid = _claim_uid(settings, images, home.name)
                    _fresh_image(settings, image, uid)
                    if any(home.iterdir()):
                        _migrate(image, home, images, uid)
                    _mount(image, home)
                    lost = home / "lost+found"
                    if lost.is_dir() and not any(lost.iterdir()):
                        lost.rmdir()
                else:
                    _mount(image, home)
            owner = home.stat().st_uid
            uid = _claim_uid(settings, images, home.name, wanted=owner)
            if uid != owner:  # its uid is another agent's on this node (a home moved in): re-own it
                _chown_tree(home, uid, uid)
        elif root:
            uid = _claim_uid(settings, images, home.name, wanted=home.stat().st_uid)
            if home.stat().st_uid != uid:
                _chown_tree(home, uid, uid)
        if root:
            os.chmod(home, 0o700)
        ready = AgentHome(path=Path(os.path.realpath(home)), uid=uid, gid=uid, quota_bytes=quota * 1024**2 or None)
    _ready[key] = ready
    return ready


def release(settings: Settings, home: Path | str, *, delete: bool = False, lazy: bool = False) -> None:
    """Unmount ``home``'s image (the node gives the agent up); ``delete`` also removes the image,
    the home directory and the agent's uid claim. ``lazy``: detach even while in use (the loop
    device goes when the last process leaves). Raises ``HomeBusy`` when in use and not ``lazy``."""
    home = Path(os.path.abspath(home))
    _ready.pop(str(home), None)
    images = images_root(settings, home)
    with _locked(images, home.name):
        if os.path.ismount(home):
            _umount(home, lazy=lazy)
        if delete:
            image_path(settings, home).unlink(missing_ok=True)
            for claim in (images / "uids").glob("*") if (images / "uids").is_dir() else ():
                with contextlib.suppress(OSError):
                    if claim.read_text() == home.name:
                        claim.unlink()
            shutil.rmtree(home, ignore_errors=True)
    if delete:
        (images / f"{home.name}.lock").unlink(missing_ok=True)


def mounted_under(root: Path | str) -> list[Path]:
    """Mount points at or under ``root`` (real path), deepest first, from ``/proc/self/mountinfo``."""
    real = os.path.realpath(root)
    prefix = real.rstrip("/") + "/"
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) > 4:
            point = fields[4].replace("\\040", " ")
            if point.startswith(prefix) or (point == real and real != "/"):
                found.append(Path(point))
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def release_all(root: Path | str) -> list[Path]:
    """Detach every file system mounted under ``root`` (a homes root, a test's temporary
    directory): lazily, so it never fails on a busy one; loop devices go with their last user.
    Returns what was unmounted. For draining a node and for tests' cleanup."""
    done = []
    for point in mounted_under(root):
        _ready.pop(str(point), None)
        with contextlib.suppress(HomeUnavailable):
            _umount(point, lazy=True)
            done.append(point)
    return done


def full_note(home: AgentHome) -> str | None:
    """A note for the model when the home's file system is (nearly) full, naming the quota; else ``None``."""
    if home.quota_bytes is None:
        return None
    try:
        st = os.statvfs(home.path)
    except OSError:
        return None
    if st.f_bavail * st.f_frsize >= max(1024**2, home.quota_bytes // 100):
        return None
    return (
        f"the agent home is full: its disk quota is {home.quota_bytes // 1024**2} MB (AGENT_HOME_QUOTA_MB); "
        "delete files to make room"
    )
