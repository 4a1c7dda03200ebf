"""How late the console's event loop runs what is due: the evidence that the console itself
was starved (a stalled loop, a machine out of CPU) when a heartbeat, a renewal or a probe
was late.

A tick is due every ``TICK_S``; a tick that runs late means nothing else due on the loop
could run either. Ticks later than ``LATE_S`` are kept for ``HISTORY_S``, so a decision can
ask how long the loop stalled over a window (a probe's, a lease's). One watch per loop,
started at its first use (``for_loop``); it is a timer chain, not a task, so a loop that
closes leaves nothing pending behind.
"""

from __future__ import annotations

import asyncio
import weakref
from collections import deque

TICK_S = 0.1
LATE_S = 0.02
"""Lateness below this is a loop doing its work, not a stall: not kept."""
HISTORY_S = 600.0


class LoopWatch:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop_ref = weakref.ref(loop)  # the registry's key: held weakly, or kept forever
        self.started_at = loop.time()
        """The loop's clock (``time.monotonic``) when the watch started: before it, nothing is known."""
        self._late: deque[tuple[float, float]] = deque()
        """(when a tick was due, when it ran) for each tick later than ``LATE_S``."""
        self._due = self.started_at + TICK_S
        loop.call_at(self._due, self._tick)  # the handle is not kept: it holds the loop

    @property
    def _loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop_ref()
        if loop is None:
            raise RuntimeError("the loop watched is gone")
        return loop

    def _tick(self) -> None:
        now = self._loop.time()
        if now - self._due > LATE_S:
            self._late.append((self._due, now))
        while self._late and self._late[0][1] < now - HISTORY_S:
            self._late.popleft()
        self._due = now + TICK_S
        self._loop.call_at(self._due, self._tick)

    def covers(self, since: float) -> bool:
        """Was the loop watched from ``since`` on (``time.monotonic``)?"""
        return self.started_at <= since

    def stall(self, since: float, until: float | None = None) -> float:
        """The longest the loop ran late within ``[since, until]`` (``time.monotonic``; until:
        now), a stall still going on at ``until`` included; 0.0 when it kept time."""
        now = self._loop.time()
        end = now if until is None else min(until, now)
        worst = 0.0
        for due, ran in self._late:
            if ran >= since and due <= end:
                worst = max(worst, min(ran, end) - max(due, since))
        if self._due < end and end - self._due > LATE_S:  # overdue now: the loop is busy
            worst = max(worst, end - max(self._due, since))
        return worst


_WATCHES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopWatch] = (
    weakref.WeakKeyDictionary()
)


def for_loop() -> LoopWatch:
    """The running loop's watch, started now if this is its first use."""
    loop = asyncio.get_running_loop()
    watch = _WATCHES.get(loop)
    if watch is None:
        watch = _WATCHES[loop] = LoopWatch(loop)
    return watch


def ensure() -> None:
    """Start watching the running loop, if there is one (a call from sync code is a no-op)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    for_loop()
