"""Benchmark of the race-free file resolver (docs/isolation.md, "Files").

Reading a small file of the agent home, two ways, timed in alternation in
the same run (paired samples, as in ``bench/arguments.py``):

- **path-based** (the previous code, racy): ``confine.resolve_in_home``
  (lexical check + ``os.path.realpath``) then an ``O_NOFOLLOW`` open of the
  resulting path by name, an ``fstat`` check and a read;
- **descriptor-based** (now): ``home_fs.HomeDir(home).open(path)``
  (component by component from a descriptor of the home), the ``fstat``
  check (regular, one link) and a ``pread``.

Also the whole ``read_file`` tool call, for scale. Paths: a file at depth 1,
one at depth 4, and one reached through a symlink inside the home.

Run: ``.venv/bin/python bench/file_tools.py``
"""

from __future__ import annotations

import os
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer.catalog import create_computer_tools
from worker.tools.computer.confine import resolve_in_home
from worker.tools.computer.home_fs import HomeDir, read_fd, require_lone_regular
from worker.turn.context import TurnContext

CALLS = 2000  # per sample
PAIRS = 21


def path_based(home: Path, rel: str) -> bytes:
    """The previous read path: check the path, then open it by name (``O_NOFOLLOW`` on the last component only)."""
    fd = os.open(resolve_in_home(home, rel), os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        os.set_blocking(fd, True)
        return fh.read()


def descriptor_based(home: Path, rel: str) -> bytes:
    with HomeDir(home) as hd, hd.open(rel) as f:
        require_lone_regular(f.st, f.rel)
        return read_fd(f.fd)


def per_call(fn, *args) -> float:
    t0 = time.perf_counter()
    for _ in range(CALLS):
        fn(*args)
    return (time.perf_counter() - t0) / CALLS


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        (home / "a/b/c").mkdir(parents=True)
        text = "".join(f"line {i}\n" for i in range(50))
        (home / "top.txt").write_text(text)
        (home / "a/b/c/deep.txt").write_text(text)
        (home / "via").symlink_to("a/b/c", target_is_directory=True)
        print(f"{'path':<16} {'path-based':>12} {'descriptor':>12} {'ratio (median of pairs)':>24}")
        for rel in ("top.txt", "a/b/c/deep.txt", "via/deep.txt"):
            assert path_based(home, rel) == descriptor_based(home, rel)
            old, new, ratios = [], [], []
            for _ in range(PAIRS):
                o = per_call(path_based, home, rel)
                n = per_call(descriptor_based, home, rel)
                old.append(o)
                new.append(n)
                ratios.append(n / o)
            print(
                f"{rel:<16} {statistics.median(old) * 1e6:>9.1f} us {statistics.median(new) * 1e6:>9.1f} us "
                f"{statistics.median(ratios):>23.2f}x"
            )
        ctx = TurnContext(turn_id="t", agent_id="a", home=home, settings=Settings())
        tool = next(t for t in create_computer_tools(ctx) if t.name == "read_file")
        params = tool.input_model.model_validate({"path": "a/b/c/deep.txt"})
        tctx = ToolContext(turn_id="t", call_id="c", home=home, abort=AbortSignal())
        whole = statistics.median(per_call(tool.execute, params, tctx) for _ in range(5))
        print(f"read_file tool call (a/b/c/deep.txt, 50 lines): {whole * 1e6:.1f} us")


if __name__ == "__main__":
    main()
