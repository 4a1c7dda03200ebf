"""The console under measurement (benchmarks/console_scale.py): HotspareApp with a display hook
that counts frames and terminal bytes, meters for the CPU of redraws, screen updates and the
garbage collector, and key presses timed from the driver to the first frame that shows them.

Imported by ``console_scale.py``, which puts the repository root and ``benchmarks/`` on
``sys.path`` first.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import math
import random
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from textual import events
from textual._compositor import CompositorUpdate, LayoutUpdate
from textual.css.query import NoMatches
from textual.screen import Screen

from console.controller import Controller
from console.ui import app as ui_app
from console.ui.app import HotspareApp
from console.ui.screens.fleet import FleetScreen
from console.ui.screens.help import HelpScreen
from console.ui.screens.jobs import JobsScreen
from console.ui.widgets.live_table import LiveTable

KEYS = ("down", "down", "down", "2", "1", "question_mark", "escape")
CHARS = {"1": "1", "2": "2", "question_mark": "?", "escape": "\x1b"}
PRESS_TIMEOUT_S = 5.0
GIVE_UP_AFTER = 2
"""Consecutive presses never shown within PRESS_TIMEOUT_S after which the rest count as never."""


# -------------------------------------------------------------------------- meters


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


# ------------------------------------------------------------------------- the app


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
        super().__init__(ctl, freeze_startup=True)  # as the hotspare command runs it
        self.frames = 0
        self.out_bytes = 0
        self.probe: Probe | None = None
        self.redraws_skipped = 0
        self.redraw_meter = Meter()
        self.count_dirty = False
        self.dirty: Counter[str] = Counter()
        """With --profile: which widgets each frame repainted."""

    def redraw(self) -> None:
        # HotspareApp.redraw waits for a view to be mounted (LiveScreen.ready); a redraw that
        # still met a view composing (NoMatches: no LiveTable yet) would end the app, so it is
        # counted and reported instead, and the run goes on.
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


async def until(app: ScaleApp, predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        app.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(0.05)


# -------------------------------------------------------------------- key latency


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
