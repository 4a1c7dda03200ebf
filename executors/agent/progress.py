"""The step loop's progress: the recent step rate, and Progress reports made from it.

At most one report per interval unless forced (the first step after a (re)start ends a
recovery), and only inside the lease: a console that moved on must not count a stale run's
steps.
"""

from __future__ import annotations

import math
import time
from collections import deque

from executors.agent.control import Control
from executors.fencing.guard import LeaseGuard
from executors.fencing.publish import Emit
from protocol.messages import Progress


class ProgressMeter:
    """Times the last steps, and reports step, loss, rates and ETA to the console."""

    def __init__(self, steps: int, control: Control, emit: Emit, interval_s: float) -> None:
        self.steps = steps
        self.control = control
        self.emit = emit
        self.interval_s = interval_s
        self._rate: deque[tuple[float, int]] = deque(maxlen=32)
        self._last_report = 0.0
        self.loss = math.nan
        """The loss of the last step taken."""
        self.tokens = 0
        """Tokens in one global batch, for tokens/s."""
        self.global_batch = 0
        """Rows of each step over the whole group (an elastic group keeps it when it shrinks)."""
        self.world_size = 1
        """Ranks training each step."""

    def stepped(self, now: float, step: int, loss: float) -> None:
        """Step ``step`` ended at ``now`` (time.monotonic) with this loss."""
        self.loss = loss
        self._rate.append((now, step))

    def step_time(self) -> float:
        """Seconds per step over the last steps; 0 before two were timed."""
        if len(self._rate) < 2:
            return 0.0
        (t0, s0), (t1, s1) = self._rate[0], self._rate[-1]
        return (t1 - t0) / max(1, s1 - s0)

    def report(self, step: int, micro_batch: int, rows: int, force: bool = False) -> None:
        """A Progress message if one is due (``force``: now) and the lease is still valid;
        ``rows`` of each global batch are this host's, in micro-batches of ``micro_batch``."""
        if LeaseGuard(self.control).ended():
            return
        now = time.monotonic()
        if not force and now - self._last_report < self.interval_s:
            return
        self._last_report = now
        dt = self.step_time()
        rate = 1.0 / dt if dt > 0 else 0.0
        left = self.steps - step
        self.emit(
            Progress(
                step=step,
                steps=self.steps,
                loss=self.loss,
                steps_per_s=rate,
                tokens_per_s=rate * self.tokens,
                eta_s=left / rate if rate > 0 else None,
                micro_batch=micro_batch,
                accumulation=rows // micro_batch,
                epoch=self.control.epoch,
                global_batch=self.global_batch,
                world_size=self.world_size,
            )
        )
