"""read_file and edit_file stream: memory bounded on a 300 MB one-line file (issue 19, low finding).

The chunked scanners are checked against Python's own line splitting and
``bytes.replace`` with tiny chunks (every boundary case), and the tools'
peak resident memory is measured in a process of their own.
"""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from worker.tools.computer.streams import copy_replacing, count_occurrences, iter_lines

ROOT = Path(__file__).resolve().parents[2]


def _fd(tmp_path: Path, data: bytes) -> int:
    path = tmp_path / f"f{random.random()}"
    path.write_bytes(data)
    return os.open(path, os.O_RDONLY)


@pytest.mark.parametrize(
    "data",
    [b"", b"a", b"a\n", b"a\nb", b"a\r\nb\r\n", b"a\rb\r", b"\n\n\r\n\r\r", b"one\r", b"x" * 50 + b"\r\n" + b"y" * 7],
)
@pytest.mark.parametrize("chunk", [1, 2, 3, 7, 1 << 20])
def test_lines_match_universal_newlines(tmp_path, data, chunk):
    fd = _fd(tmp_path, data)
    try:
        got = [head for head, _ in iter_lines(fd, keep=1000, chunk=chunk)]
    finally:
        os.close(fd)
    expected = [line.rstrip("\r\n").encode() for line in io.StringIO(data.decode(), newline=None)]
    assert got == expected


def test_long_lines_keep_only_their_head(tmp_path):
    fd = _fd(tmp_path, b"a" * 100 + b"\nshort\n" + b"b" * 10)
    try:
        assert list(iter_lines(fd, keep=8, chunk=3)) == [(b"a" * 8, True), (b"short", False), (b"b" * 8, True)]
    finally:
        os.close(fd)


def test_replacing_matches_bytes_replace_across_chunk_boundaries(tmp_path):
    rng = random.Random(7)
    for _ in range(200):
        data = bytes(rng.choice(b"ab\n") for _ in range(rng.randrange(0, 60)))
        old = bytes(rng.choice(b"ab") for _ in range(rng.randrange(1, 4)))
        new = bytes(rng.choice(b"xyz") for _ in range(rng.randrange(0, 5)))
        chunk = rng.randrange(1, 9)
        fd = _fd(tmp_path, data)
        try:
            assert count_occurrences(fd, old, chunk=chunk) == data.count(old)
            out = io.BytesIO()
            assert copy_replacing(fd, out, old, new, chunk=chunk) == len(data.replace(old, new))
            assert out.getvalue() == data.replace(old, new)
        finally:
            os.close(fd)


def test_invalid_utf8_is_found_even_split_across_chunks(tmp_path):
    fd = _fd(tmp_path, "héllo wörld".encode() + b"\xff")
    try:
        with pytest.raises(UnicodeDecodeError):
            count_occurrences(fd, b"o", chunk=1)
    finally:
        os.close(fd)
    fd = _fd(tmp_path, "héllo wörld".encode())
    try:
        assert count_occurrences(fd, "ö".encode(), chunk=1) == 1  # a character split over chunks is fine
    finally:
        os.close(fd)


# The tools on a 300 MB line, in a process of their own: peak resident memory (VmHWM) before and after.
_PROBE = r"""
import json, sys
from pathlib import Path
from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer.files import EditFileParams, ReadFileParams, _edit_file, _read_file

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

home = Path(sys.argv[1])
ctx = ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal(), agent_id="a", services={})
settings = Settings()
before = hwm()
read = _read_file(ReadFileParams(path="big.txt", limit=1), ctx, settings)
after_read = hwm()
edit = _edit_file(EditFileParams(path="big.txt", old_string="NEEDLE", new_string="PIN"), ctx)
after_edit = hwm()
print(json.dumps({"before": before, "after_read": after_read, "after_edit": after_edit,
                  "read": read.content[:20] + read.content[-60:], "read_error": read.is_error, "edit": edit.content}))
"""

BIG = 300 * 1024**2
# Resident memory the two calls may add: chunks, the decoder's output for one chunk, slack for
# the allocator. Loading the line (as the tools did) costs 300 MB to 600 MB.
BOUND = 64 * 1024**2


def test_read_and_edit_of_a_300_mb_line_stay_in_bounded_memory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    block = b"x" * (1 << 20)
    with open(home / "big.txt", "wb") as fh:
        fh.write(b"NEEDLE")
        for _ in range(BIG // len(block)):
            fh.write(block)
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(home)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert not out["read_error"] and out["read"].startswith("     1\tNEEDLExxx") and "line cut" in out["read"]
    assert out["edit"] == "Edited big.txt: 1 replacement"
    assert out["after_read"] - out["before"] < BOUND, out
    assert out["after_edit"] - out["before"] < BOUND, out
    with open(home / "big.txt", "rb") as fh:
        assert fh.read(10) == b"PINxxxxxxx"
    assert (home / "big.txt").stat().st_size == BIG + 3
