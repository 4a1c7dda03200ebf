"""One measured window of benchmarks/console_scale.py: the console's CPU (and its wait for a core,
the machine being shared), the CPU of its redraws and screen updates, health delivered and its
lag, event loop stalls, garbage collector time, frames and terminal bytes.

Imported by ``console_scale.py``, which puts the repository root and ``benchmarks/`` on
``sys.path`` first.
"""

from __future__ import annotations

import asyncio
import cProfile
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scale_app import GC, SCREEN_UPDATES, ScaleApp
from scale_links import Traffic

STALL_TICK_S = 0.05


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


def pct(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return math.nan
    k = min(len(sorted_values) - 1, max(0, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]


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
