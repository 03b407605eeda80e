"""Benchmark of the command sandbox (docs/isolation.md, "Commands"): the cost per command of running it in bubblewrap.

Through ``run_command`` itself (the tool as a turn calls it), in the same run and in
alternation (pairs, because this VM's speed drifts between samples):

- **unsandboxed**: ``AGENT_COMMAND_SANDBOX=off`` (the development-only runner);
- **sandboxed**: ``AGENT_COMMAND_SANDBOX=bwrap`` (the default);
- **egress**: sandboxed with ``network: egress`` (the proxy thread + the relay inside).

Commands: ``true`` and a small pipeline (``seq 1 2000 | sort -r | head -3 | wc -l``).
Printed: the median wall time of each, and the median of the paired ratios sandboxed / unsandboxed.
Then the per-agent limits (docs/isolation.md, "Limits per agent": the home's quota mount, the memory cgroup,
the seccomp filter), each against the sandbox without them, and a home's first use.
A last line isolates bubblewrap itself: ``bash -c true`` spawned directly vs the same inside
``bwrap`` with the sandbox's mounts (no tool around either).

Run: ``.venv/bin/python bench/sandbox.py [--pairs 25]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.settings import Settings
from worker.tooling.contract import AbortSignal, ToolContext
from worker.tools.computer import homes
from worker.tools.computer import sandbox as sb
from worker.tools.computer.catalog import create_computer_tools
from worker.turn.context import TurnContext

COMMANDS = {"true": "true", "pipeline": "seq 1 2000 | sort -r | head -3 | wc -l"}


# The sandbox without the per-agent limits, and each limit added on its own.
LIMITS_OFF = {"home_quota_mb": 0, "command_memory_cgroup": False, "command_seccomp": False}
VARIANTS = {
    "home mount": {**LIMITS_OFF, "home_quota_mb": 64},
    "memory cgroup": {**LIMITS_OFF, "command_memory_cgroup": True},
    "seccomp": {**LIMITS_OFF, "command_seccomp": True},
    "all three": {"home_quota_mb": 64, "command_memory_cgroup": True, "command_seccomp": True},
}


def make_runner(root: Path, sandbox: str, network: str = "none", agent: str = "bench-agent", **limits):
    home = root / agent
    home.mkdir(parents=True, exist_ok=True)
    settings = Settings(homes_root=root, command_sandbox=sandbox, home_image_preallocate=False, **limits)
    ctx = TurnContext(turn_id="b", agent_id=agent, home=home, settings=settings, network=network)
    tool = {t.name: t for t in create_computer_tools(ctx)}["run_command"]
    tctx = ToolContext(turn_id="b", call_id="c", home=home, abort=AbortSignal())

    def run(command: str) -> float:
        t0 = time.perf_counter()
        r = tool.execute(tool.input_model(command=command), tctx)
        elapsed = time.perf_counter() - t0
        if r.is_error or r.details.get("exit_code") != 0:
            raise SystemExit(f"{sandbox}/{network}: {command!r} failed: {r.content}")
        return elapsed

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=25)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-homes-"))
    try:
        run_all(root, args)
    finally:
        homes.release_all(root)  # every home image this run mounted
        shutil.rmtree(root, ignore_errors=True)


def run_all(root: Path, args: argparse.Namespace) -> None:
    off, on, egress = make_runner(root, "off"), make_runner(root, "bwrap"), make_runner(root, "bwrap", "egress")
    for run in (off, on, egress):  # warm-up: probe, imports, page cache
        for command in COMMANDS.values():
            run(command)
    print(f"sandbox cost per command, {args.pairs} alternating samples each (ms, median)")
    print(f"{'command':<10} {'unsandboxed':>12} {'sandboxed':>10} {'ratio':>7} {'egress':>8} {'ratio':>7}")
    for name, command in COMMANDS.items():
        t_off, t_on, t_eg, r_on, r_eg = [], [], [], [], []
        for _ in range(args.pairs):
            a, b, c = off(command), on(command), egress(command)
            t_off.append(a)
            t_on.append(b)
            t_eg.append(c)
            r_on.append(b / a)
            r_eg.append(c / a)
        print(
            f"{name:<10} {statistics.median(t_off) * 1e3:>12.2f} {statistics.median(t_on) * 1e3:>10.2f} "
            f"{statistics.median(r_on):>6.2f}x {statistics.median(t_eg) * 1e3:>8.2f} {statistics.median(r_eg):>6.2f}x"
        )

    limits_costs(root, args.pairs)

    bash = shutil.which("bash") or "/bin/bash"
    bwrap = sb.find_bwrap(Settings())
    direct, wrapped, ratios = [], [], []
    for _ in range(args.pairs):
        t0 = time.perf_counter()
        subprocess.run([bash, "-c", "true"], check=True)
        t1 = time.perf_counter()
        subprocess.run([bwrap, *sb.core_args(), "--", bash, "-c", "true"], check=True, env={})
        t2 = time.perf_counter()
        direct.append(t1 - t0)
        wrapped.append(t2 - t1)
        ratios.append((t2 - t1) / (t1 - t0))
    print(
        f"bwrap alone: bash -c true {statistics.median(direct) * 1e3:.2f} ms, in bwrap "
        f"{statistics.median(wrapped) * 1e3:.2f} ms, ratio {statistics.median(ratios):.2f}x"
    )


def limits_costs(root: Path, pairs: int) -> None:
    """The per-agent limits, each against today's sandbox without them, per command;
    and the one-time cost of a home's first use (image made, formatted, mounted)."""
    base = make_runner(root, "bwrap", agent="limits-base", **LIMITS_OFF)
    runners = {
        name: make_runner(root, "bwrap", agent=f"limits-{i}", **v) for i, (name, v) in enumerate(VARIANTS.items())
    }
    for run in (base, *runners.values()):
        run("true")
    print(f"\nper-agent limits per command (`true`), {pairs} alternating samples (ms, median; ratio to without)")
    print(f"{'without limits':<16} {'':>8} ", end="")
    t_base: list[float] = []
    rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in VARIANTS}
    for _ in range(pairs):
        for name, run in runners.items():
            a, b = base("true"), run("true")
            t_base.append(a)
            rows[name][0].append(b)
            rows[name][1].append(b / a)
    print(f"{statistics.median(t_base) * 1e3:>8.2f}")
    for name, (times, ratios) in rows.items():
        print(f"{'+ ' + name:<16} {'':>8} {statistics.median(times) * 1e3:>8.2f} {statistics.median(ratios):>6.2f}x")
    settings = Settings(homes_root=root, home_quota_mb=64, home_image_preallocate=True)
    firsts = []
    for i in range(max(pairs // 5, 3)):
        home = root / f"first-use-{i}"
        t0 = time.perf_counter()
        homes.provision(settings, home)
        firsts.append(time.perf_counter() - t0)
        homes.release(settings, home, delete=True)
    print(f"first use of a home (64 MB image allocated, mkfs.ext4, mount): {statistics.median(firsts) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
