"""Console at scale (issue 5, "Live data without lag").

N simulated executors (benchmarks/simexec.py, a separate process, one Unix socket and one
connection each) send a Heartbeat and an 8-GPU Health every second over the real protocol. This
process builds an inventory of N local hosts in four regions, a real Controller, and one
ExecutorLink per host whose messages reach ``fleet.seen`` / ``fleet.observe`` as a warm standby's
do (console/supervise/standby.py ``_route``); each host holds a job name, as a host with a reporting
executor does, so the host monitor probes none of them. The console (HotspareApp) runs
headless in ``run_test`` at 120x40. Measured, first without traffic (baseline: the same N host
rows, no links), then with:

- console CPU: this process's CPU time (every thread) over wall time, on the Fleet view, no keys;
  with the time it waited for a core (/proc schedstat: the machine is shared), the CPU of each
  redraw and screen update (thread time), and a projection to the nominal rates (4 redraws/s,
  N health/s) for a console that had a core of its own;
- key latency: a key event is handed to the driver as a terminal's input would be, and the
  clock stops at the first frame handed to the driver that shows the change (``expectation``);
- health decoded and observed per second, delivery lag (executor send -> fleet.observe), event
  loop stalls, garbage collector time, frames and terminal bytes per second.

Headless Textual skips turning frames into escape sequences; this benchmark does it anyway
(into nothing), so the CPU figure includes what a real terminal would cost.

With ``--transport ssh`` every host is an ssh host of the inventory, reached through real
OpenSSH sshd on loopback (``scale_sshd.py``: a few listeners, host keys verified against a
known_hosts): the console's production ``SshTransport`` dials one connection per host and the
link is a streamlocal channel over it to the simulated executor's socket, as in a fleet. It
reports the connection setup time and the sshd processes' CPU too (here on the same two cores;
in a fleet each host pays its own). ``console_scale_ssh.py`` runs both transports at one N.

This file runs and reports; the parts are beside it: ``scale_app.py`` (the instrumented console,
its meters, key latency), ``scale_measure.py`` (one measured window), ``scale_links.py`` (the
inventory, the simulated executors' process, the links), ``scale_sshd.py`` (the sshd side) and
``simexec.py`` (the executors).

    .venv/bin/python benchmarks/console_scale.py [--sims 1000] [--seconds 30] [--presses 42]
        [--transport local|ssh] [--sshds 4] [--quick] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import math
import os
import pstats
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Figure, at_least, at_most, emit
from scale_app import KEYS, Presses, ScaleApp, key_latencies, meter_screen_updates, until
from scale_links import REGIONS, Sim, SimLinks, write_inventory
from scale_measure import Stalls, Window, measure, pct
from scale_sshd import SshdFleet, raise_fd_limit
from simexec import host_name

from console.controller import Controller
from console.inventory import load
from console.supervise.policy import Policy
from console.ui.screens.fleet import FleetScreen
from console.ui.widgets.live_table import LiveTable

NAME = "console_scale"
NAMES = {"local": NAME, "ssh": "console_scale_over_ssh"}
SIZE = (120, 40)
CPU_TARGET_PCT = 25.0
LATENCY_TARGET_MS = 100.0
LINKS_TIMEOUT_S = 120.0


# ----------------------------------------------------------------------- the run


@dataclass
class Result:
    sims: int
    base: Window
    load: Window
    base_keys: Presses
    load_keys: Presses
    links_up: int
    link_failures: list[str]
    sim_report: str
    load_avg: str
    redraws_skipped: int
    problems: list[str]
    rows_ms: float
    transport: str = "local"
    setup: Setup | None = None
    profile_text: str = ""


@dataclass
class Setup:
    """Opening every link: over ssh the dial (key exchange, host key check, authentication),
    the streamlocal channel and the Hello; locally the socket and the Hello."""

    all_s: float
    """Wall seconds from the first link opening to the last one up."""
    one_p50_s: float
    one_p95_s: float
    """Each link's own open time (its wait for one of OPEN_CONCURRENCY turns not counted)."""
    console_cpu_s: float
    """The console's CPU while it opened them all."""
    sshd_sessions: int = 0
    sshd_cpu_pct: float = math.nan
    """sshd's CPU (every listener and session process) over the loaded window."""
    sshd_mib: float = math.nan
    """sshd's unique memory, every process, after the loaded window and its key presses."""
    sshd_errors: str = ""


class Holder:
    """What the cleanup after an interrupt must stop: the executors, the sshd listeners."""

    def __init__(self) -> None:
        self.sims: list[Sim] = []
        self.sshd: list[SshdFleet] = []

    def kill(self) -> None:
        for sim in self.sims:
            sim.kill()
        for fleet in self.sshd:
            fleet.stop()


async def run(args: argparse.Namespace, tmp: Path, holder: Holder) -> Result:
    hosts_root = tmp / "h"
    sshd: SshdFleet | None = None
    if args.transport == "ssh":
        sshd = SshdFleet(tmp / "ssh", args.sshds, args.sims)
        holder.sshd.append(sshd)
        sshd.start()
    inventory = write_inventory(
        tmp, hosts_root, args.sims, sshd.host_table if sshd is not None else None
    )
    sim = Sim(hosts_root, args.sims, tmp / "sim.log", max_s=args.seconds * 4 + 600)
    holder.sims.append(sim)
    await sim.start()

    ctl = Controller(load(inventory), Policy.MANUAL)
    app = ScaleApp(ctl)
    app.count_dirty = args.profile
    links = SimLinks(ctl, hosts_root, args.sims)
    links.hold_jobs()
    stalls = Stalls()
    rng = random.Random(5)
    # CPU time, not wall time: other processes on the machine must not weigh in.
    phases = ("baseline", "baseline keys", "loaded", "loaded keys")
    profiles = {p: cProfile.Profile(time.process_time) for p in phases} if args.profile else {}
    rows = args.sims + len(REGIONS)
    problems: list[str] = []
    setup = Setup(math.nan, math.nan, math.nan, math.nan)
    try:
        async with app.run_test(size=SIZE, notifications=True):
            await until(
                app,
                lambda: (
                    isinstance(app.screen, FleetScreen)
                    and app.screen.query_one(LiveTable).row_count >= rows
                ),
                60,
                f"the Fleet view to show {rows} rows",
            )
            await asyncio.sleep(1.0)
            app.clear_notifications()
            stalls.start()
            # Both views and the help screen exist before anything is timed.
            await key_latencies(app, len(KEYS), rng)
            base = await measure(
                app, links.traffic, stalls, args.base_seconds, profiles.get("baseline"), 0.0
            )
            base_keys = await key_latencies(app, args.presses, rng, profiles.get("baseline keys"))

            # A console too busy to connect them all in time is measured as it stands.
            cpu0 = time.process_time()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINKS_TIMEOUT_S):
                    await links.open_all()
            opened = sorted(links.open_s)
            setup.all_s, setup.console_cpu_s = links.all_open_s, time.process_time() - cpu0
            setup.one_p50_s, setup.one_p95_s = pct(opened, 50), pct(opened, 95)
            fleet = ctl.fleet
            try:
                await until(
                    app,
                    lambda: all(fleet.hosts[host_name(i)].health for i in range(args.sims)),
                    30,
                    "a health sample from every simulated executor",
                )
            except TimeoutError as e:
                problems.append(str(e))
            await asyncio.sleep(2.0)
            app.clear_notifications()
            sshd_cpu0, sshd_t0 = (sshd.cpu_s() if sshd else 0.0), time.perf_counter()
            load_w = await measure(
                app, links.traffic, stalls, args.seconds, profiles.get("loaded"), float(args.sims)
            )
            if sshd is not None:
                setup.sshd_cpu_pct = (
                    100 * (sshd.cpu_s() - sshd_cpu0) / (time.perf_counter() - sshd_t0)
                )
            load_keys = await key_latencies(app, args.presses, rng, profiles.get("loaded keys"))
            if sshd is not None:  # reading every session's memory blocks for a while
                setup.sshd_sessions = sshd.sessions()
                setup.sshd_mib = sshd.rss_mib()
            rows_ms = rows_cost(app)
            load_avg = uptime()
    finally:
        await stalls.stop()
        await links.close()
        sim_report = await sim.stop()
        if sshd is not None:
            setup.sshd_errors = sshd.errors()
            sshd.stop()
    text = ""
    for what, prof in profiles.items():
        if prof.getstats():
            buf = io.StringIO()
            stats = pstats.Stats(prof, stream=buf)
            stats.sort_stats("tottime").print_stats(25)
            stats.sort_stats("cumulative").print_stats(40)
            text += f"--- {what} ---\n{buf.getvalue()}"
    return Result(
        sims=args.sims,
        base=base,
        load=load_w,
        base_keys=base_keys,
        load_keys=load_keys,
        links_up=len(links.links),
        link_failures=links.failed,
        sim_report=sim_report,
        load_avg=load_avg,
        redraws_skipped=app.redraws_skipped,
        problems=problems,
        rows_ms=rows_ms,
        transport=args.transport,
        setup=setup,
        profile_text=text
        + "".join(f"frames repainting {k}: {n}\n" for k, n in app.dirty.most_common(12)),
    )


def rows_cost(app: ScaleApp, times: int = 10) -> float:
    """CPU ms for the Fleet view to build its rows from the controller (part of each redraw)."""
    screen = app.screen
    if not isinstance(screen, FleetScreen):
        return math.nan
    t = time.thread_time()
    for _ in range(times):
        screen.rows()
    return 1000 * (time.thread_time() - t) / times


def uptime() -> str:
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


# --------------------------------------------------------------------- reporting


def latency_figures(label: str, keys: Presses, target: bool) -> list[Figure]:
    ms = sorted(1000 * v for vs in keys.values() for v, _ in vs)
    p50, p95, top = pct(ms, 50), pct(ms, 95), ms[-1] if ms else math.nan
    bar = f"<= {LATENCY_TARGET_MS:g} ms" if target else ""
    ok = (lambda v: at_most(v, LATENCY_TARGET_MS)) if target else (lambda v: None)
    return [
        Figure(f"key to screen p50, {label}", round(p50, 1), "ms", bar, ok(p50)),
        Figure(f"key to screen p95, {label}", round(p95, 1), "ms", bar, ok(p95)),
        Figure(f"key to screen max, {label}", round(top, 1), "ms", bar, ok(top)),
    ]


def figures(r: Result) -> list[Figure]:
    load, base = r.load, r.base
    rate_bar = 0.95 * r.sims
    return [
        Figure(
            f"console CPU, {r.sims} sims",
            round(load.cpu_pct, 1),
            "% of one core",
            f"<= {CPU_TARGET_PCT:g} %",
            at_most(load.cpu_pct, CPU_TARGET_PCT),
        ),
        Figure("console CPU, baseline (no traffic)", round(base.cpu_pct, 1), "% of one core"),
        Figure(f"console waiting for a core, {r.sims} sims", round(load.wait_pct, 1), "% of wall"),
        Figure(
            f"console CPU at nominal rates (projected), {r.sims} sims",
            round(load.projected_pct, 1),
            "% of one core",
            f"<= {CPU_TARGET_PCT:g} %",
            at_most(load.projected_pct, CPU_TARGET_PCT),
        ),
        Figure("CPU per redraw (rows -> table)", round(load.redraw_ms, 2), "ms"),
        Figure("CPU to build the Fleet rows, at the end", round(r.rows_ms, 2), "ms"),
        Figure("CPU per screen update (layout + frame)", round(load.update_ms, 2), "ms"),
        Figure("redraws", round(load.redraws_per_s, 2), "/s"),
        Figure("screen updates", round(load.updates_per_s, 2), "/s"),
        Figure("CPU outside redraws and updates", round(load.other_pct, 1), "% of one core"),
        Figure("  garbage collector", round(load.gc_pct, 1), "% of wall"),
        Figure("  longest collection", round(load.gc_longest_ms, 1), "ms"),
        *latency_figures(f"{r.sims} sims", r.load_keys, True),
        *latency_figures("baseline", r.base_keys, False),
        Figure(
            "health observed by fleet",
            round(load.health_per_s, 1),
            "samples/s",
            f">= {rate_bar:g}",
            at_least(load.health_per_s, rate_bar),
        ),
        Figure("links up", r.links_up, "links", f">= {r.sims}", at_least(r.links_up, r.sims)),
        Figure("health delivery lag p50", round(load.lag_p50_ms, 1), "ms"),
        Figure("health delivery lag p95", round(load.lag_p95_ms, 1), "ms"),
        Figure("event loop stall p99", round(load.stall_p99_ms, 1), "ms"),
        Figure("event loop stall max", round(load.stall_max_ms, 1), "ms"),
        Figure("frames", round(load.frames_per_s, 1), "frames/s"),
        Figure("terminal output", round(load.out_kib_per_s, 1), "KiB/s"),
        *setup_figures(r),
    ]


def setup_figures(r: Result) -> list[Figure]:
    s = r.setup
    if s is None:
        return []
    out = [
        Figure(f"links set up, all {r.sims} (wall)", round(s.all_s, 2), "s"),
        Figure("link setup p50, each", round(1000 * s.one_p50_s, 1), "ms"),
        Figure("link setup p95, each", round(1000 * s.one_p95_s, 1), "ms"),
        Figure("console CPU setting up the links", round(s.console_cpu_s, 2), "s"),
    ]
    if r.transport == "ssh":
        out += [
            Figure("sshd sessions held", s.sshd_sessions, "connections"),
            Figure(
                "sshd CPU, every process (the hosts' side)",
                round(s.sshd_cpu_pct, 1),
                "% of one core",
            ),
            Figure("sshd memory, every process (unique)", round(s.sshd_mib, 1), "MiB"),
        ]
    return out


def per_key(keys: Presses) -> str:
    parts = []
    for key, vs in keys.items():
        ms = sorted(1000 * v for v, _ in vs)
        cpus = [1000 * c for _, c in vs if not math.isnan(c)]
        cpu = statistics.median(cpus) if cpus else math.nan
        parts.append(
            f"{key}: n={len(ms)} median {statistics.median(ms):.0f} max {ms[-1]:.0f} ms "
            f"(CPU median {cpu:.0f} ms)"
        )
    return "\n  ".join(parts)


def report(r: Result, args: argparse.Namespace) -> None:
    print(f"load average at the end: {r.load_avg} (2 cores, shared)")
    print(f"baseline window {r.base.seconds:.1f} s, loaded window {r.load.seconds:.1f} s")
    b = r.base
    print(
        f"baseline: CPU {b.cpu_pct:.1f} % (waiting for a core {b.wait_pct:.1f} %), "
        f"{b.redraws_per_s:.1f} redraws/s at {b.redraw_ms:.1f} ms, "
        f"{b.updates_per_s:.1f} screen updates/s at {b.update_ms:.1f} ms, "
        f"other {b.other_pct:.1f} %, projected {b.projected_pct:.1f} %"
    )
    print(f"keys, {r.sims} sims (key to frame; process CPU meanwhile):\n  {per_key(r.load_keys)}")
    print(f"keys, baseline:\n  {per_key(r.base_keys)}")
    print(f"simulated executors' own report: {r.sim_report}")
    for problem in r.problems:
        print(f"problem: {problem}")
    if r.redraws_skipped:
        print(
            f"{r.redraws_skipped} redraws hit a view still composing (NoMatches: LiveTable); "
            "skipped here, they would end HotspareApp"
        )
    if r.link_failures:
        print(f"{len(r.link_failures)} links failed, first: {r.link_failures[0]}")
    if r.setup is not None and r.setup.sshd_errors:
        print(f"sshd logged: {r.setup.sshd_errors}")
    if r.profile_text:
        print("cProfile (CPU time) of both windows; CPU figures are inflated by the profiler:")
        print(r.profile_text)
    over = (
        f"reached over real SSH: {args.sshds} OpenSSH sshd listeners on loopback, host keys "
        f"verified, one SshTransport connection per host, the link a streamlocal channel to the "
        f"executor's socket; sshd runs on the same cores; "
        if r.transport == "ssh"
        else ""
    )
    notes = (
        f"{r.sims} simulated executors (separate process, one Unix socket each) send Heartbeat + "
        f"8-GPU Health at 1 Hz through ExecutorLink into fleet.seen/observe; {over}HotspareApp headless "
        f"in run_test {SIZE[0]}x{SIZE[1]} on the Fleet view; CPU = process_time/wall over "
        f"{r.load.seconds:.0f} s (baseline: same hosts, no links, {r.base.seconds:.0f} s), frames "
        f"rendered to escape sequences as a terminal would; key latency = Key event handed to the "
        f"driver -> first frame passed to the driver showing the change (keys {' '.join(KEYS)}, "
        f"{args.presses} presses per phase); load avg {r.load_avg} on 2 shared cores"
        + ("; PROFILED, CPU inflated" if args.profile else "")
    )
    emit(NAMES[r.transport], figures(r), notes, args.json)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=None, help="simulated executors (default 1000)")
    p.add_argument("--seconds", type=float, default=None, help="loaded window (default 30)")
    p.add_argument("--presses", type=int, default=None, help="key presses per phase (default 42)")
    p.add_argument(
        "--transport",
        choices=("local", "ssh"),
        default="local",
        help="local: Unix sockets (default); ssh: real sshd on loopback, streamlocal channels",
    )
    p.add_argument("--sshds", type=int, default=4, help="sshd listeners with --transport ssh")
    p.add_argument("--quick", action="store_true", help="200 sims, 8 s, 21 presses")
    p.add_argument("--profile", action="store_true", help="cProfile the loaded window")
    p.add_argument("--json", action="store_true", help="print the JSON line last")
    args = p.parse_args()
    sims, seconds, presses = (200, 8.0, 21) if args.quick else (1000, 30.0, 42)
    args.sims = sims if args.sims is None else args.sims
    args.seconds = seconds if args.seconds is None else args.seconds
    args.presses = presses if args.presses is None else args.presses
    args.base_seconds = max(4.0, args.seconds / 3)
    if args.sims < 1 or args.seconds <= 0 or args.presses < 1 or args.sshds < 1:
        p.error("--sims, --seconds, --presses and --sshds must be positive")
    return args


class Interrupts:
    """Ctrl-C once: cancel the run (its cleanup runs). Twice, or SIGTERM: a console stuck in
    a long synchronous call cannot be cancelled, so kill the simulated executors and sshd,
    remove the temporary folder and exit at once."""

    def __init__(self, tmp: Path, holder: Holder) -> None:
        self.tmp = tmp
        self.holder = holder
        self.count = 0
        self.task: asyncio.Task[Result] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._now)

    def cleanup(self) -> None:
        self.holder.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _on_sigint(self, signum: int, _frame: object) -> None:
        self.count += 1
        if self.count == 1 and self.loop is not None and self.task is not None:
            print("interrupted: stopping (Ctrl-C again to stop at once)", file=sys.stderr)
            self.loop.call_soon_threadsafe(self.task.cancel)
            return
        self._now(signum, _frame)

    def _now(self, signum: int, _frame: object) -> None:
        self.cleanup()
        os._exit(128 + signum)

    async def run(self, args: argparse.Namespace, budget: float) -> Result:
        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()  # type: ignore[assignment]
        async with asyncio.timeout(budget):
            return await run(args, self.tmp, self.holder)


def main() -> int:
    args = parse()
    raise_fd_limit()  # a socket per link here, and sshd and the executors inherit it
    meter_screen_updates()
    tmp = Path(tempfile.mkdtemp(prefix="hs-scale-", dir="/tmp"))
    interrupts = Interrupts(tmp, Holder())
    budget = args.base_seconds + args.seconds + 4 * args.presses + 600
    try:
        result = asyncio.run(interrupts.run(args, budget))
    except asyncio.CancelledError:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        interrupts.cleanup()
    report(result, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
