"""Kill-loop soak (``make soak``): turns keep running while their processes and Redis are killed.

One node as ``make stack`` runs it (``devtools.workers``: a solo pool for the steps, prefork
for the tools, beat, all under the supervisor that restarts what exits), an embedded Redis with
an append-only file, and the scripted gateway as its own process (``--latency``). ``--turns``
turns are enqueued over the run; each makes three model calls and three tool calls, two of them
destructive (``append_marker``: a line in the agent's home per execution, outside Redis). Every
2-5 s one of these happens at random: SIGKILL of the steps worker's main process, of a tools
pool child, of the tools worker's main process, of beat, of the gateway (restarted after 1 s), or
a Redis crash (SIGKILL, restarted after 1-3 s; at least ``--redis-restarts`` of them).

Printed at the end: turns lost (unknown), stuck (not ended), failed; destructive calls run twice
(a marker line twice); model calls paid twice (two complete answers for one step of one turn,
split into "after a worker kill" (the call, or its reply, died with the process before the reply
was stored: 0 with ``--background on``, the default, where the re-driven step fetches the response
the dead process started; possible with ``--background off``) and "otherwise", which the runtime
must keep at 0); unanswered calls in ended turns; recovery latency
after each SIGKILL of a worker main process (from the kill to the watchdog's re-drive of its
turns: min/median/max); whether the workers and beat are alive at the end.

With Sentinel (``--redis sentinel``, the default): Redis is a primary, a replica and three
Sentinels (``devtools.embedded_sentinel``), every process reaches it through them, and a "Redis
crash" is a SIGKILL of the current primary (at least ``--redis-restarts`` of them): the Sentinels
promote the replica, and the killed server is started again 0-1 s later (it rejoins as a replica,
as compose's restart policy would). Printed besides: each failover's recovery time, from the kill
to the first step of any turn stored on the new primary (min/median/max), and the destructive calls
deferred or refused because no replica acknowledged their claim (docs/failover.md).
``--redis single`` is the single Redis of before, crashed and restarted.

Run: ``make soak`` or ``.venv/bin/python bench/soak.py [--turns 200] [--minutes 3] [--redis single]``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import orjson
import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devtools.embedded_redis import EmbeddedRedis  # noqa: E402
from devtools.embedded_sentinel import EmbeddedSentinelSet  # noqa: E402
from devtools.node_recovery import NodeRecovery  # noqa: E402
from devtools.ports import free_port  # noqa: E402
from devtools.workers import Supervisor, beat_command, worker_commands  # noqa: E402

SCRIPT = {
    "name": "soak",
    "steps": [
        {
            "output": [
                {"type": "function_call", "name": "append_marker", "arguments": '{"label": "a", "ms": 300}'},
                {"type": "function_call", "name": "read_thing", "arguments": '{"label": "r", "ms": 100}'},
            ]
        },
        {"output": [{"type": "function_call", "name": "append_marker", "arguments": '{"label": "b", "ms": 300}'}]},
        {"output": [{"type": "message", "text": "done"}]},
    ],
}


def _children(pid: int) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(proc.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


class Gateway:
    """The scripted gateway as a process of its own (so chaos can kill it), logging its answers."""

    def __init__(self, scripts: Path, log: Path, latency: float, logdir: Path):
        self.port = free_port()
        # Background responses it finished outlive a kill of the gateway, as a provider's store.
        self.cmd = [sys.executable, "-m", "devtools.scripted_gateway", "--port", str(self.port),
                    "--scripts", str(scripts), "--latency", str(latency), "--answer-log", str(log),
                    "--background-store", str(logdir / "background.jsonl")]  # fmt: skip
        self.logdir = logdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "CONTROL_REDIS_URL")}
        self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=open(self.logdir / "gateway.log", "a"),
                                     stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise SystemExit("the scripted gateway did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _chaos(
    action: str, sup: Supervisor, gateway: Gateway, srv: Any, rng: random.Random, host: str
) -> tuple[float, str, str]:
    """Do one chaos ``action``; returns its event ``(when, what, node)``."""
    when = time.time()
    if action in ("worker-io", "worker-tools", "beat"):
        proc = sup.procs[action]
        node = f"{host}:{proc.pid}"
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return (when, action, node)
    if action == "tools-child":
        kids = _children(sup.procs["worker-tools"].pid)
        if kids:
            try:
                os.kill(rng.choice(kids), signal.SIGKILL)
            except ProcessLookupError:  # it exited meanwhile (its pool replaces it)
                pass
        return (when, action, "")
    if action == "gateway":
        gateway.kill()
        time.sleep(1)
        gateway.start()
        return (when, action, "")
    if isinstance(srv, EmbeddedSentinelSet):  # a failover: the primary dies, the replica is promoted
        old = srv.kill_primary()
        when = time.time()
        new = srv.wait_for_failover(old.port)
        promoted = time.time() - when
        time.sleep(rng.uniform(0, 1))
        srv.restart(old)  # back as a replica: fencing writes are acknowledged again
        return (when, "redis", f"{old.port}->{new} promoted after {promoted:.1f} s")
    srv.halt(kill=True)
    time.sleep(rng.uniform(1, 3))
    srv.restart()
    return (when, "redis", "")


def _run_twice(homes: Path, turns: int) -> int:
    """Destructive tool calls that ran more than once (each call writes its marker in the home)."""
    twice = 0
    for i in range(turns):
        marks = homes / f"soak-{i}" / "markers.txt"
        if marks.exists():
            twice += sum(n - 1 for n in Counter(marks.read_text().split()).values() if n > 1)
    return twice


def _cut_then_made_again(answers: Path) -> int:
    """Steps whose answer was cut (its client went mid-stream: generated, and billed, in part) and
    then made again whole: the partial re-payments a provider bills without background mode (a
    background answer is generated whole whoever listens, and logged once, when it ends)."""
    seen: dict[tuple[Any, Any], set[bool]] = defaultdict(set)
    for line in answers.read_bytes().splitlines():
        a = orjson.loads(line)
        if a["status"] == 200 and a["model"] == "soak":
            seen[(a["input"], a["step"])].add(bool(a["complete"]))
    return sum(1 for kinds in seen.values() if kinds == {True, False})


def _paid_twice(answers: Path, events: list[tuple[float, str, str]]) -> tuple[int, int]:
    """Model calls paid twice for the same (turn input, step): ``(after a steps-worker kill, other)``."""
    paid = defaultdict(list)
    for line in answers.read_bytes().splitlines():
        a = orjson.loads(line)
        if a["complete"] and a["status"] == 200 and a["model"] == "soak":
            paid[(a["input"], a["step"])].append(a["at"])
    worker_kills = [w for w, what, _ in events if what in ("worker-io",)]
    repaid_kill = repaid_other = 0
    for times in paid.values():
        times.sort()
        for first, again in zip(times, times[1:], strict=False):
            if any(first - 1 <= k <= again for k in worker_kills):
                repaid_kill += 1
            else:
                repaid_other += 1
    return repaid_kill, repaid_other


def _recovery_times(control: Any, ids: list[str], events: list[tuple[float, str, str]]) -> list[float]:
    """Seconds from each SIGKILL of a worker main process to the first re-drive of its turns
    that came after it (a node id can come back: a restarted worker may be given a pid a killed
    one had, and a re-drive before the kill is not its recovery)."""
    redriven: dict[str, list[float]] = {}
    for tid in ids:
        for e in control.events(tid):
            if e.get("kind") == "turn_redriven" and "stopped" in str(e.get("reason", "")):
                node = str(e["reason"]).split("worker ", 1)[-1].split(" stopped")[0]
                redriven.setdefault(node, []).append(float(e["at"]))
    times = []
    for when, what, node in events:
        after = [at for at in redriven.get(node, []) if at >= when]
        if what in ("worker-io", "worker-tools") and after:
            times.append(min(after) - when)
    return times


PROGRESS = ("model_reply", "call_completed")  # a step's progress, stored


def _failover_recovery(control: Any, ids: list[str], events: list[tuple[float, str, str]]) -> list[float]:
    """Seconds from each SIGKILL of the primary to the first step of any turn stored after it (on
    the new primary: the old one is dead)."""
    progress = sorted(float(e["at"]) for tid in ids for e in control.events(tid) if e.get("kind") in PROGRESS)
    times = []
    for when, what, _ in events:
        after = [at for at in progress if at >= when]
        if what == "redis" and after:
            times.append(after[0] - when)
    return times


def _deferred_and_unfenced(logs: Path, control: Any, ids: list[str]) -> tuple[int, int]:
    """Destructive calls deferred (their claim not acknowledged by a replica in time: a line each in
    the tools worker's log), and calls reported not run after every deferral."""
    deferred = sum(text.count(" deferred: the claim of call") for text in
                   (p.read_text(errors="replace") for p in logs.glob("worker-*.log")))  # fmt: skip
    unfenced = sum(
        1 for tid in ids for item in control.items(tid)
        if item.get("type") == "function_call_output" and "could not be made safe against a Redis failover" in str(item.get("output"))
    )  # fmt: skip
    return deferred, unfenced


def _redriven_without_a_holder(control: Any, ids: list[str]) -> tuple[set[str], set[str]]:
    """Turns re-driven by the progress deadline (nobody knew they had stopped), and turns re-driven
    because no message named them after a Redis restart or a node's death
    (``tasks.watchdog.unnamed_turns_redriven``)."""
    by_deadline: set[str] = set()
    after_restart: set[str] = set()
    for tid in ids:
        for e in control.events(tid):
            reason = str(e.get("reason", "")) if e.get("kind") == "turn_redriven" else ""
            if reason.startswith("no progress"):
                by_deadline.add(tid)
            elif "Redis restart" in reason or "after the death of node" in reason:  # no message named it
                after_restart.add(tid)
    return by_deadline, after_restart


def _print_histories(control: Any, turns: list[str], events: list[tuple[float, str, str]], t0: float) -> None:
    """What happened to ``turns`` against the chaos, in seconds since ``t0`` (the start)."""
    for tid in turns:
        print(f"  {tid}: " + "; ".join(
            f"{float(e['at']) - t0:.1f} {e['kind']}" + "".join(f" {k}={e[k]}" for k in ("step", "phase", "call_id", "reason") if k in e)
            for e in control.events(tid) if e.get("kind") not in ("model_delta",)))  # fmt: skip
    if turns:
        print("  chaos: " + ", ".join(f"{w - t0:.1f} {what}" for w, what, _ in events))


def _report(
    control: Any, ids: list[str], work: Path, events: list[tuple[float, str, str]], srv: Any, sup: Supervisor,
    restarted: list[tuple[float, str]], started: float,
) -> bool:  # fmt: skip
    """Print what the run lost, duplicated, re-paid and how fast it recovered; True when it failed."""
    from worker.model.items import unanswered_call_ids

    homes, answers, logs = work / "homes", work / "answers.jsonl", work / "logs"
    statuses = dict(zip(ids, control.store.statuses(ids), strict=True))
    ended = {tid: s for tid, s in statuses.items() if s is not None and s.terminal}
    unanswered = sum(len(unanswered_call_ids(control.items(tid))) for tid in ended)
    lost = sum(s is None for s in statuses.values())
    stuck = sum(s is not None and not s.terminal for s in statuses.values())
    failed = sum(s.value != "completed" for s in ended.values())
    twice = _run_twice(homes, len(ids))

    repaid_kill, repaid_other = _paid_twice(answers, events)
    recovery = _recovery_times(control, ids, events)
    by_deadline, after_restart = _redriven_without_a_holder(control, ids)
    failovers = _failover_recovery(control, ids, events) if isinstance(srv, EmbeddedSentinelSet) else []
    deferred, unfenced = _deferred_and_unfenced(logs, control, ids)

    alive_at_end = {name: proc.poll() is None for name, proc in sup.procs.items()}
    kinds = Counter(what for _, what, _ in events)
    print()
    print(f"turns: {len(ids)}; chaos events: {dict(kinds)}; processes restarted by the supervisor: {len(restarted)}")
    print(f"lost {lost}, stuck {stuck}, failed {failed}")
    print(f"destructive calls run twice: {twice}")
    background = os.environ.get("AGENT_MODEL_BACKGROUND") == "1"
    print(f"model calls paid twice: {repaid_other} otherwise, {repaid_kill} after a steps-worker kill "
          f"(background mode {'on' if background else 'off'}); answers cut and made again: "
          f"{_cut_then_made_again(answers)}")  # fmt: skip
    print(f"unanswered calls in ended turns: {unanswered}")
    if recovery:
        print(f"recovery after a worker-main SIGKILL (kill -> re-drive), {len(recovery)} kills with turns held: "
              f"min {min(recovery):.1f} s, median {statistics.median(recovery):.1f} s, max {max(recovery):.1f} s")  # fmt: skip
    else:
        print("recovery: no worker-main kill held a turn")
    if failovers:
        print(f"failover recovery (primary SIGKILL -> first step stored on the new primary), {len(failovers)} failovers: "
              f"min {min(failovers):.1f} s, median {statistics.median(failovers):.1f} s, max {max(failovers):.1f} s "
              f"({', '.join(f'{t:.1f}' for t in failovers)})")  # fmt: skip
    if isinstance(srv, EmbeddedSentinelSet):
        print(f"failovers the Sentinels made: {srv.failovers()} (primary kills: {kinds['redis']})")
    print(f"destructive calls deferred (claim not acknowledged by a replica in time): {deferred}; "
          f"reported not run after every deferral: {unfenced}")  # fmt: skip
    print(f"turns re-driven by the progress deadline: {len(by_deadline)} {sorted(by_deadline)}; "
          f"re-driven because no message named them after a Redis restart, failover or node death: {len(after_restart)}")  # fmt: skip
    _print_histories(control, sorted(by_deadline), events, time.time() - (time.monotonic() - started))
    print(f"alive at the end: {alive_at_end}")
    repaid = repaid_other + (repaid_kill if background else 0)  # without background mode, a kill may re-pay
    return bool(lost or stuck or twice or repaid or unanswered or by_deadline or not all(alive_at_end.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--minutes", type=float, default=3.0, help="how long chaos goes on")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds the model takes to answer")
    parser.add_argument("--redis-restarts", type=int, default=4,
                        help="at least this many Redis crashes (with Sentinel: primary kills)")  # fmt: skip
    parser.add_argument("--redis", choices=("sentinel", "single"), default="sentinel",
                        help="a primary, a replica and three Sentinels (failovers), or one Redis (restarts)")  # fmt: skip
    parser.add_argument("--background", choices=("on", "off"), default="on",
                        help="the Responses API's background mode (AGENT_MODEL_BACKGROUND): a killed node's call is "
                             "fetched by its id, not made again")  # fmt: skip
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-node-recovery", action="store_true",
                        help="the supervisor does not report deaths (heartbeat expiry only, as before)")  # fmt: skip
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="soak-"))
    logs, homes, scripts = work / "logs", work / "homes", work / "scripts"
    for d in (logs, homes, scripts):
        d.mkdir()
    (scripts / "soak.json").write_bytes(orjson.dumps(SCRIPT))
    answers = work / "answers.jsonl"

    srv: Any = EmbeddedSentinelSet() if args.redis == "sentinel" else EmbeddedRedis(persist=True)
    srv.start()
    bad = True
    gateway: Gateway | None = None
    sup: Supervisor | None = None
    try:  # everything started is stopped, also when the soak itself fails
        gateway = Gateway(scripts, answers, args.latency, logs)
        gateway.start()
        os.environ.update(
            **srv.env,
            OPENAI_BASE_URL=f"http://127.0.0.1:{gateway.port}/v1",
            OPENAI_API_KEY="soak",
            AGENT_HOMES_ROOT=str(homes),
            AGENT_EXTRA_TOOLSETS="testing=tests.support.toolsets:testing_tools",
            AGENT_APPROVAL_MODE="off",
            AGENT_MODEL_TIMEOUT="30",
            AGENT_TOOL_TIME_LIMIT="30",
            AGENT_MODEL_BACKGROUND="1" if args.background == "on" else "0",
        )
        from control.client import ControlPlane
        from worker.redis_connection import redis_endpoint
        from worker.settings import get_settings

        get_settings.cache_clear()
        worker_env = {k: v for k, v in os.environ.items() if k != "CONTROL_REDIS_URL"}
        restarted: list[tuple[float, str]] = []
        commands = worker_commands(tools_concurrency=2, loglevel="WARNING")
        node_recovery = None if args.no_node_recovery else NodeRecovery(set(commands))
        sup = Supervisor(
            logs, on_restart=lambda name, code: restarted.append((time.time(), name)), on_exit=node_recovery
        )
        for name, cmd in commands.items():
            sup.start(name, cmd, env=worker_env)
        sup.start("beat", beat_command("WARNING"), env=worker_env)
        r = redis_endpoint(control=True).client(socket_timeout=10)  # through the Sentinels, if any
        host = socket.gethostname()

        def alive(name: str) -> bool:
            try:
                return r.exists(f"agent:alive:{host}:{sup.procs[name].pid}") == 1
            except redis.RedisError:
                return False

        deadline = time.monotonic() + 60
        while not (alive("worker-io") and alive("worker-tools")):
            if time.monotonic() > deadline:
                raise SystemExit(f"the workers did not start; see {logs}")
            time.sleep(0.2)
        control = ControlPlane()

        events: list[tuple[float, str, str]] = []  # (when, what, detail)
        ids: list[str] = []
        started = time.monotonic()
        chaos_until = started + args.minutes * 60
        enqueue_every = (args.minutes * 60 * 0.8) / max(args.turns, 1)
        next_enqueue = started
        next_chaos = started + rng.uniform(2, 5)
        redis_restarts = 0
        print(f"soak: {args.turns} turns over {args.minutes:g} min, chaos every 2-5 s; logs {work}", flush=True)
        while time.monotonic() < chaos_until or len(ids) < args.turns:
            now = time.monotonic()
            if len(ids) < args.turns and now >= next_enqueue:
                i = len(ids)
                try:
                    ids.append(control.enqueue({"agent_id": f"soak-{i}", "input": f"soak {i}", "model": "soak",
                                                "toolset": "testing"}, turn_id=f"soak-{i}"))  # fmt: skip
                    next_enqueue = now + enqueue_every
                except Exception as exc:  # Redis down this instant: try again shortly
                    print(f"  enqueue {i} deferred: {exc.__class__.__name__}", flush=True)
                    next_enqueue = now + 0.5
            if now >= next_chaos and now < chaos_until:
                left = args.redis_restarts - redis_restarts
                remaining_slots = max(1, int((chaos_until - now) / 3.5))
                action = "redis" if left > 0 and rng.random() < left / remaining_slots else rng.choice(
                    ["worker-io", "tools-child", "worker-tools", "beat", "gateway", "redis"])  # fmt: skip
                events.append(_chaos(action, sup, gateway, srv, rng, host))
                redis_restarts += action == "redis"
                detail = f" {events[-1][2]}" if action == "redis" and events[-1][2] else ""
                print(
                    f"  {time.monotonic() - started:6.1f}s chaos: {action}{detail} ({len(ids)} turns enqueued)",
                    flush=True,
                )
                next_chaos = time.monotonic() + rng.uniform(2, 5)
            time.sleep(0.05)

        print("chaos over; waiting for every turn to end", flush=True)
        wait_until = time.monotonic() + 240
        pending = set(ids)
        while pending and time.monotonic() < wait_until:
            try:
                order = sorted(pending)
                for tid, status in zip(order, control.store.statuses(order), strict=True):
                    if status is not None and status.terminal:
                        pending.discard(tid)
            except redis.RedisError:
                pass
            time.sleep(1)

        bad = _report(control, ids, work, events, srv, sup, restarted, started)
    finally:
        if sup is not None:
            sup.stop()
        if gateway is not None:
            gateway.kill()
        srv.stop()
    if os.environ.get("SOAK_KEEP") != "1":
        shutil.rmtree(homes, ignore_errors=True)
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
