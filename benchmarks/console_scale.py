"""Console at scale (issue 5, "Live data without lag").

N simulated executors (benchmarks/simexec.py, a separate process, one Unix socket and one
connection each) send a Heartbeat and an 8-GPU Health every second over the real protocol. This
process builds an inventory of N local hosts in four regions, a real Controller, and one
ExecutorLink per host whose messages reach ``fleet.seen`` / ``fleet.observe`` as a warm standby's
do (console/standby.py ``_route``); each host holds a job name, as a host with a reporting
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
(into nothing), so the CPU figure includes what a real terminal would cost. ``--fix`` patches a
proposed ``LiveTable.sync`` into this process to measure it before it is written for real.

    .venv/bin/python benchmarks/console_scale.py [--sims 1000] [--seconds 30] [--presses 42]
        [--quick] [--fix widths|visible] [--profile] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
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
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import tomli_w
from common import Figure, at_least, at_most, emit
from rich.cells import cell_len
from simexec import host_name, socket_path
from textual import events
from textual._compositor import CompositorUpdate, LayoutUpdate
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widgets.data_table import ColumnKey

from console.controller import Controller
from console.inventory import load
from console.link import ExecutorLink, LinkError
from console.policy import Policy
from console.ui import app as ui_app
from console.ui.app import HotspareApp
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.help import HelpScreen
from console.ui.screens.jobs import JobsScreen
from console.ui.widgets.live_table import LiveTable
from protocol.messages import ExecutorMessage, Health, Heartbeat

NAME = "console_scale"
SIZE = (120, 40)
REGIONS = ("us-east", "us-west", "eu-west", "ap-south")
KEYS = ("down", "down", "down", "2", "1", "question_mark", "escape")
CHARS = {"1": "1", "2": "2", "question_mark": "?", "escape": "\x1b"}
CPU_TARGET_PCT = 25.0
LATENCY_TARGET_MS = 100.0
PRESS_TIMEOUT_S = 5.0
OPEN_TIMEOUT_S = 10.0
OPEN_CONCURRENCY = 64
SIM_READY_TIMEOUT_S = 120.0
LINKS_TIMEOUT_S = 120.0
GIVE_UP_AFTER = 2
"""Consecutive presses never shown within PRESS_TIMEOUT_S after which the rest count as never."""
STALL_TICK_S = 0.05


# --------------------------------------------------------------------------- the app


@dataclass
class Meter:
    """CPU time (this thread) and calls of one part of the console."""

    cpu_s: float = 0.0
    calls: int = 0

    def snapshot(self) -> tuple[float, int]:
        return self.cpu_s, self.calls


class GcMeter:
    """Wall time in the cyclic garbage collector, by generation (gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._t = 0.0
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t = time.perf_counter()
        else:
            took = time.perf_counter() - self._t
            self.seconds[info["generation"]] += took
            self.longest = max(self.longest, took)


GC = GcMeter()

SCREEN_UPDATES = Meter()
"""Screen._on_timer_update: layout, then the dirty widgets rendered into a frame."""


def meter_screen_updates() -> None:
    """Count the CPU of every screen update (patched on the class before any screen exists)."""
    original = Screen._on_timer_update

    def timed(self: Screen[Any]) -> None:
        t = time.thread_time()
        try:
            original(self)
        finally:
            SCREEN_UPDATES.cpu_s += time.thread_time() - t
            SCREEN_UPDATES.calls += 1

    Screen._on_timer_update = timed  # type: ignore[method-assign]


@dataclass
class Probe:
    """What the next frame must show for a key press to count as on screen."""

    shown: Callable[[Screen[Any], Any], bool]
    done: asyncio.Future[float]


class ScaleApp(HotspareApp):
    """The console with a display hook: what a terminal would get, and when."""

    # A relative CSS_PATH resolves beside the subclass's module; keep the console's own.
    CSS_PATH = str(Path(ui_app.__file__).parent / str(HotspareApp.CSS_PATH))

    def __init__(self, ctl: Controller) -> None:
        super().__init__(ctl)
        self.frames = 0
        self.out_bytes = 0
        self.probe: Probe | None = None
        self.redraws_skipped = 0
        self.redraw_meter = Meter()
        self.count_dirty = False
        self.dirty: Counter[str] = Counter()
        """With --profile: which widgets each frame repainted."""

    def redraw(self) -> None:
        # The 4 Hz timer can fire while a view that was just switched to is still composing
        # (no LiveTable yet): HotspareApp.redraw then raises NoMatches and the app exits.
        # Counted and reported instead, so the run goes on.
        t = time.thread_time()
        try:
            super().redraw()
        except NoMatches:
            self.redraws_skipped += 1
        finally:
            self.redraw_meter.cpu_s += time.thread_time() - t
            self.redraw_meter.calls += 1

    def check_alive(self) -> None:
        if self._exception is not None or not self.is_running:
            raise RuntimeError(f"the console stopped: {self._exception!r}")

    def _display(self, screen: Screen[Any], renderable: Any) -> None:
        super()._display(screen, renderable)
        if renderable is None or self._batch_count:
            return
        if isinstance(renderable, CompositorUpdate):
            # What the headless driver skips: the frame as terminal escape sequences.
            self.out_bytes += len(renderable.render_segments(self.console))
        self.frames += 1
        if self.count_dirty:
            kinds = {type(w).__name__ for w in screen._dirty_widgets}
            self.dirty[" + ".join(sorted(kinds)) or type(renderable).__name__] += 1
        probe = self.probe
        if probe is not None and not probe.done.done() and probe.shown(screen, renderable):
            probe.done.set_result(time.perf_counter())


def expectation(app: ScaleApp, key: str) -> Callable[[Screen[Any], Any], bool]:
    """The frame that shows ``key``'s effect.

    A frame is computed synchronously from the widgets' state (``Screen._on_timer_update``:
    dirty widgets -> compositor regions -> ``render_update`` -> ``_display``), so a frame in
    which the table was repainted after its cursor moved shows the new cursor row.
    """
    if key == "down":
        table = app.screen.query_one(LiveTable)
        target = min(table.cursor_row + 1, table.row_count - 1)

        def cursor_shown(screen: Screen[Any], renderable: Any) -> bool:
            dirty = screen._dirty_widgets
            return (
                screen is app.screen
                and table.cursor_row == target
                and (table in dirty or screen in dirty or isinstance(renderable, LayoutUpdate))
            )

        return cursor_shown
    kind: type[Screen[Any]] = {
        "1": FleetScreen,
        "2": JobsScreen,
        "question_mark": HelpScreen,
        "escape": FleetScreen,
    }[key]
    return lambda screen, _r: isinstance(screen, kind) and screen is app.screen


Presses = dict[str, list[tuple[float, float]]]
"""Per key: (latency, CPU) of each press, in seconds."""


async def press(app: ScaleApp, key: str) -> tuple[float, float]:
    """Seconds from handing the key to the driver to the frame showing its effect (inf: never),
    and the process's CPU seconds meanwhile."""
    app.check_alive()
    loop = asyncio.get_running_loop()
    probe = Probe(expectation(app, key), loop.create_future())
    app.probe = probe
    event = events.Key(key, CHARS.get(key))
    event.set_sender(app)
    driver = app._driver
    assert driver is not None
    cpu0, t0 = time.process_time(), time.perf_counter()
    driver.send_message(event)
    try:
        async with asyncio.timeout(PRESS_TIMEOUT_S):
            t1 = await probe.done
    except TimeoutError:
        t1 = math.inf
    finally:
        app.probe = None
    return t1 - t0, time.process_time() - cpu0


async def key_latencies(
    app: ScaleApp, presses: int, rng: random.Random, profile: cProfile.Profile | None = None
) -> Presses:
    """``presses`` keys a person would press, at random moments, starting on the Fleet view."""
    out: Presses = {}
    timeouts = 0
    for i in range(presses):
        key = KEYS[i % len(KEYS)]
        if timeouts >= GIVE_UP_AFTER:
            out.setdefault(key, []).append((math.inf, math.nan))
            continue
        if profile is not None:
            profile.enable()
        result = await press(app, key)
        timeouts = timeouts + 1 if math.isinf(result[0]) else 0
        out.setdefault(key, []).append(result)
        if profile is not None:
            profile.disable()
        await asyncio.sleep(rng.uniform(0.15, 0.4))
    if isinstance(app.screen, HelpScreen):
        await press(app, "escape")
    if not isinstance(app.screen, FleetScreen):
        await press(app, "1")
    return out


# ------------------------------------------------------ what-if: a fix for the lead


VISIBLE_MARGIN = 5
"""Rows beyond the viewport still written each redraw (``--fix visible``)."""


def sync_patched(
    self: LiveTable, rows: Mapping[str, tuple[str, ...]], *, visible_only: bool
) -> int:
    """LiveTable.sync as proposed to the lead (``--fix widths``, ``--fix visible``).

    widths: cells are written with ``update_width=False``; each column's width is the widest
    plain string in it, set once per sync when it changed. (``update_width=True`` makes
    DataTable re-measure the whole column, through Rich markup, for every updated cell that
    got narrower: O(changed x rows) per redraw.)
    visible: only rows in the viewport (+ a margin) are written; the others keep their last
    written values until they scroll into view (any cell write bumps DataTable's update
    count, which drops its cache of every rendered line).
    """
    written = 0
    keys = list(rows)
    if keys != list(self._shown):
        kept = [k for k in self._shown if k in rows]
        if keys[: len(kept)] != kept:
            self.clear()
            self._shown.clear()
        for key in [k for k in self._shown if k not in rows]:
            self.remove_row(key)
            del self._shown[key]
    names = self._column_names
    top = int(self.scroll_y) - VISIBLE_MARGIN
    bottom = int(self.scroll_y) + self.size.height + VISIBLE_MARGIN
    for index, (key, row) in enumerate(rows.items()):
        before = self._shown.get(key)
        if before is None:
            self.add_row(*row, key=key)
            written += len(row)
        elif visible_only and not top <= index <= bottom:
            continue
        else:
            for column, old, new in zip(names, before, row, strict=True):
                if old != new:
                    self.update_cell(key, column, new)
                    written += 1
        self._shown[key] = row
    if written:
        for i, name in enumerate(names):
            width = max(max((cell_len(r[i]) for r in rows.values()), default=0), cell_len(name))
            column = self.columns[ColumnKey(name)]
            if column.content_width != width:
                column.content_width = width
                self._require_update_dimensions = True
    return written


def _patch_sync(visible_only: bool) -> None:
    def sync(self: LiveTable, rows: Mapping[str, tuple[str, ...]]) -> int:
        return sync_patched(self, rows, visible_only=visible_only)

    LiveTable.sync = sync  # type: ignore[method-assign]


FIXES: dict[str, Callable[[], None]] = {
    "widths": lambda: _patch_sync(visible_only=False),
    "visible": lambda: _patch_sync(visible_only=True),
}


# ---------------------------------------------------------------------- the fleet


@dataclass
class Traffic:
    """What the links delivered, counted after ``fleet.seen`` / ``fleet.observe`` returned."""

    health: int = 0
    heartbeats: int = 0
    lags: list[float] = field(default_factory=list)
    record_lag: bool = False


class SimLinks:
    """One ExecutorLink per host to its simulated executor, routed as a warm standby's is."""

    def __init__(self, ctl: Controller, root: Path, count: int) -> None:
        self.ctl = ctl
        self.root = root
        self.count = count
        self.traffic = Traffic()
        self.links: list[ExecutorLink] = []
        self.pumps: list[asyncio.Task[str]] = []
        self.failed: list[str] = []

    def _route(self, host: str, msg: ExecutorMessage) -> None:
        fleet = self.ctl.fleet
        if isinstance(msg, Heartbeat):
            fleet.seen(host)
            self.traffic.heartbeats += 1
        elif isinstance(msg, Health):
            fleet.observe(host, msg)
            self.traffic.health += 1
            if self.traffic.record_lag:
                self.traffic.lags.append(time.time() - msg.t)

    async def _open(self, i: int, gate: asyncio.Semaphore) -> None:
        host = host_name(i)
        rt = self.ctl.fleet.hosts[host]
        link = ExecutorLink(rt.transport, str(socket_path(self.root, i)), self.ctl.console_id)
        async with gate:
            try:
                await link.open(timeout=OPEN_TIMEOUT_S)
            except LinkError as e:
                self.failed.append(str(e))
                return
        self.links.append(link)
        self.pumps.append(asyncio.create_task(link.pump(lambda m: self._route(host, m))))

    def hold_jobs(self) -> None:
        """A host whose executor reports to the console holds a job (primary or standby) in
        production, and the host monitor probes only hosts without one: so here too, from the
        start, so that the baseline differs from the loaded run by the traffic alone."""
        for i in range(self.count):
            self.ctl.fleet.hosts[host_name(i)].job = f"j{i:04d}"

    async def open_all(self) -> None:
        gate = asyncio.Semaphore(OPEN_CONCURRENCY)
        await asyncio.gather(*(self._open(i, gate) for i in range(self.count)))

    async def close(self) -> None:
        for task in self.pumps:
            task.cancel()
        await asyncio.gather(*self.pumps, return_exceptions=True)
        for link in self.links:
            link.close()


def write_inventory(tmp: Path, hosts_root: Path, count: int) -> Path:
    hosts = {}
    for i in range(count):
        hosts[host_name(i)] = {
            "region": REGIONS[i * len(REGIONS) // max(count, 1)],
            "transport": "local",
            "root": str(hosts_root / host_name(i)),
            "gpus": 8,
            "role": "spare" if i % 10 == 9 else "primary",
        }
    data = {
        "console": {"state_dir": str(tmp / "state"), "heartbeat_s": 1.0},
        "regions": {r: {"priority": n + 1} for n, r in enumerate(REGIONS)},
        "hosts": hosts,
    }
    path = tmp / "inventory.toml"
    path.write_text(tomli_w.dumps(data))
    return path


# ----------------------------------------------------------------- measurement


class Stalls:
    """How late the event loop runs a 50 ms timer: the wait any key press may meet."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.recording = False
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            t = time.perf_counter()
            await asyncio.sleep(STALL_TICK_S)
            if self.recording:
                self.samples.append(time.perf_counter() - t - STALL_TICK_S)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


def run_queue_s() -> float:
    """Seconds this process's threads have waited for a core (/proc schedstat); NaN if unknown."""
    total = 0.0
    try:
        for task in Path("/proc/self/task").iterdir():
            total += int((task / "schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return math.nan
    return total


@dataclass
class Window:
    cpu_pct: float
    wait_pct: float
    seconds: float
    health_per_s: float
    frames_per_s: float
    out_kib_per_s: float
    stall_p99_ms: float
    stall_max_ms: float
    lag_p50_ms: float
    lag_p95_ms: float
    redraws_per_s: float
    redraw_ms: float
    """CPU per redraw: rows from the controller, diffed into the table."""
    updates_per_s: float
    update_ms: float
    """CPU per screen update: layout and the frame rendered."""
    other_pct: float
    """The rest of the CPU: protocol, fleet.observe, asyncio, Textual's messages."""

    @property
    def projected_pct(self) -> float:
        """CPU at the nominal rates, from the measured cost of each unit of work: 4 redraws a
        second, each with the screen updates measured per redraw, and the rest scaled to one
        Health per executor a second: what the console would use on a core of its own,
        where a starved run skips redraws and its CPU share understates the need."""
        per_redraw = self.updates_per_s / max(self.redraws_per_s, 1e-9)
        ui = 4 * (self.redraw_ms + per_redraw * self.update_ms) / 10
        traffic = self.nominal_health / self.health_per_s if self.health_per_s > 0 else 1.0
        return ui + self.other_pct * traffic

    nominal_health: float = 0.0
    gc_pct: float = 0.0
    gc_longest_ms: float = 0.0


async def measure(
    app: ScaleApp,
    traffic: Traffic,
    stalls: Stalls,
    seconds: float,
    profile: cProfile.Profile | None,
    nominal_health: float,
) -> Window:
    stalls.samples.clear()
    traffic.lags.clear()
    health0, frames0, bytes0 = traffic.health, app.frames, app.out_bytes
    r0, u0 = app.redraw_meter.snapshot(), SCREEN_UPDATES.snapshot()
    gc0 = sum(GC.seconds)
    GC.longest = 0.0
    stalls.recording = traffic.record_lag = True
    if profile is not None:
        profile.enable()
    cpu0, t0, q0 = time.process_time(), time.perf_counter(), run_queue_s()
    await asyncio.sleep(seconds)
    cpu1, t1, q1 = time.process_time(), time.perf_counter(), run_queue_s()
    if profile is not None:
        profile.disable()
    stalls.recording = traffic.record_lag = False
    r1, u1 = app.redraw_meter.snapshot(), SCREEN_UPDATES.snapshot()
    gc_s = sum(GC.seconds) - gc0
    wall = t1 - t0
    redraw_s, redraws = r1[0] - r0[0], r1[1] - r0[1]
    update_s, updates = u1[0] - u0[0], u1[1] - u0[1]
    lags = sorted(traffic.lags) or [math.nan]
    stall = sorted(stalls.samples) or [math.nan]
    return Window(
        cpu_pct=100 * (cpu1 - cpu0) / wall,
        wait_pct=100 * (q1 - q0) / wall,
        seconds=wall,
        health_per_s=(traffic.health - health0) / wall,
        frames_per_s=(app.frames - frames0) / wall,
        out_kib_per_s=(app.out_bytes - bytes0) / wall / 1024,
        stall_p99_ms=1000 * pct(stall, 99),
        stall_max_ms=1000 * stall[-1],
        lag_p50_ms=1000 * pct(lags, 50),
        lag_p95_ms=1000 * pct(lags, 95),
        redraws_per_s=redraws / wall,
        redraw_ms=1000 * redraw_s / max(redraws, 1),
        updates_per_s=updates / wall,
        update_ms=1000 * update_s / max(updates, 1),
        other_pct=100 * (cpu1 - cpu0 - redraw_s - update_s) / wall,
        nominal_health=nominal_health,
        gc_pct=100 * gc_s / wall,
        gc_longest_ms=1000 * GC.longest,
    )


def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


async def until(app: ScaleApp, predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        app.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


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
    profile_text: str = ""


class Sim:
    """The simulated executors' process: started, awaited ready, always reaped."""

    def __init__(self, hosts_root: Path, count: int, log: Path, max_s: float) -> None:
        self.argv = [
            sys.executable,
            str(Path(__file__).resolve().parent / "simexec.py"),
            "--dir",
            str(hosts_root),
            "--count",
            str(count),
            "--parent",
            str(os.getpid()),
            "--max-s",
            str(max_s),
        ]
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, stdout=asyncio.subprocess.PIPE, stderr=err
            )
        assert self.proc.stdout is not None
        async with asyncio.timeout(SIM_READY_TIMEOUT_S):
            line = await self.proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"simulated executors did not start: {self.log.read_text()[-2000:]}")

    async def stop(self) -> str:
        """SIGTERM, then its one-line report (SIGKILL if it does not end in time)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return ""
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(10):
                out, _ = await proc.communicate()
        except TimeoutError:
            self.kill()
            return "the simulated executors did not stop on SIGTERM (killed)"
        return out.decode(errors="replace").strip().splitlines()[-1] if out.strip() else ""

    def kill(self) -> None:
        """Last resort, also after the event loop is gone (Ctrl-C, a failure)."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.proc.pid, signal.SIGKILL)
                os.waitpid(self.proc.pid, 0)


async def run(args: argparse.Namespace, tmp: Path, sim_holder: list[Sim]) -> Result:
    hosts_root = tmp / "h"
    inventory = write_inventory(tmp, hosts_root, args.sims)
    sim = Sim(hosts_root, args.sims, tmp / "sim.log", max_s=args.seconds * 4 + 600)
    sim_holder.append(sim)
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
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LINKS_TIMEOUT_S):
                    await links.open_all()
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
            load_w = await measure(
                app, links.traffic, stalls, args.seconds, profiles.get("loaded"), float(args.sims)
            )
            load_keys = await key_latencies(app, args.presses, rng, profiles.get("loaded keys"))
            rows_ms = rows_cost(app)
            load_avg = uptime()
    finally:
        await stalls.stop()
        await links.close()
        sim_report = await sim.stop()
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
        Figure("health delivery lag p95", round(load.lag_p95_ms, 1), "ms"),
        Figure("event loop stall p99", round(load.stall_p99_ms, 1), "ms"),
        Figure("event loop stall max", round(load.stall_max_ms, 1), "ms"),
        Figure("frames", round(load.frames_per_s, 1), "frames/s"),
        Figure("terminal output", round(load.out_kib_per_s, 1), "KiB/s"),
    ]


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
    if r.profile_text:
        print("cProfile (CPU time) of both windows; CPU figures are inflated by the profiler:")
        print(r.profile_text)
    notes = (
        f"{r.sims} simulated executors (separate process, one Unix socket each) send Heartbeat + "
        f"8-GPU Health at 1 Hz through ExecutorLink into fleet.seen/observe; HotspareApp headless "
        f"in run_test {SIZE[0]}x{SIZE[1]} on the Fleet view; CPU = process_time/wall over "
        f"{r.load.seconds:.0f} s (baseline: same hosts, no links, {r.base.seconds:.0f} s), frames "
        f"rendered to escape sequences as a terminal would; key latency = Key event handed to the "
        f"driver -> first frame passed to the driver showing the change (keys {' '.join(KEYS)}, "
        f"{args.presses} presses per phase); load avg {r.load_avg} on 2 shared cores"
        + ("; PROFILED, CPU inflated" if args.profile else "")
        + (f"; WHAT-IF with LiveTable.sync patched: --fix {args.fix}" if args.fix else "")
    )
    emit(NAME, figures(r), notes, args.json)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=None, help="simulated executors (default 1000)")
    p.add_argument("--seconds", type=float, default=None, help="loaded window (default 30)")
    p.add_argument("--presses", type=int, default=None, help="key presses per phase (default 42)")
    p.add_argument("--quick", action="store_true", help="200 sims, 8 s, 21 presses")
    p.add_argument("--profile", action="store_true", help="cProfile the loaded window")
    p.add_argument(
        "--fix",
        choices=sorted(FIXES),
        help="what-if: measure with a proposed LiveTable.sync patched in (this process only); "
        "visible implies widths",
    )
    p.add_argument("--json", action="store_true", help="print the JSON line last")
    args = p.parse_args()
    sims, seconds, presses = (200, 8.0, 21) if args.quick else (1000, 30.0, 42)
    args.sims = sims if args.sims is None else args.sims
    args.seconds = seconds if args.seconds is None else args.seconds
    args.presses = presses if args.presses is None else args.presses
    args.base_seconds = max(4.0, args.seconds / 3)
    if args.sims < 1 or args.seconds <= 0 or args.presses < 1:
        p.error("--sims, --seconds and --presses must be positive")
    return args


class Interrupts:
    """Ctrl-C once: cancel the run (its cleanup runs). Twice, or SIGTERM: a console stuck in
    a long synchronous call cannot be cancelled, so kill the simulated executors, remove the
    temporary folder and exit at once."""

    def __init__(self, tmp: Path, sims: list[Sim]) -> None:
        self.tmp = tmp
        self.sims = sims
        self.count = 0
        self.task: asyncio.Task[Result] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGTERM, self._now)

    def cleanup(self) -> None:
        for sim in self.sims:
            sim.kill()
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
            return await run(args, self.tmp, self.sims)


def main() -> int:
    args = parse()
    meter_screen_updates()
    if args.fix:
        FIXES[args.fix]()
    tmp = Path(tempfile.mkdtemp(prefix="hs-scale-", dir="/tmp"))
    interrupts = Interrupts(tmp, [])
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
