"""The one lease guard of an executor: what every kind, the publisher and the fence ask.

A run stops in good time (``ENDING``: room left to stop cleanly and publish a last
checkpoint), or at once and without writing once the lease has ended (``ENDED``); it publishes
only with more than ``PUBLISH_MARGIN_S`` left. How much room a kind needs (two steps and a
write for the torch kind; the command's grace for the command kind) is the kind's to say;
how that room becomes a guard, and every comparison with the lease, is here.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from executors.agent.control import Control

PUBLISH_MARGIN_S = 0.25
"""A checkpoint is published only with more than this left of the lease. The check and the two
renames after it take microseconds; the margin covers a writer descheduled between them (the
GIL handed to the step loop, a loaded host) so that a publish is rarely undone by the check
after the renames, and it is far below a kind's stop guard (a fifth of the lease or more), so
a writer in good time is never refused."""


class Verdict(Enum):
    HOLDS = "holds"
    """No lease (fencing off), or more than the guard left."""
    ENDING = "ending"
    """Within the guard: stop now, publishing what is due."""
    ENDED = "ended"
    """Over (or within the kind's kill margin): stop at once, writing nothing more."""


class LeaseGuard:
    def __init__(self, control: Control) -> None:
        self._control = control

    @property
    def epoch(self) -> int:
        return self._control.epoch

    def left(self) -> float | None:
        """Seconds left of the lease; None when there is none (fencing off)."""
        return self._control.lease_left()

    def valid(self, margin_s: float = 0.0) -> bool:
        """No lease, or one with more than ``margin_s`` left."""
        return self._control.lease_valid(margin_s)

    def ended(self) -> bool:
        """A lease, and nothing left of it: whatever still trains must end at once."""
        return not self.valid(0.0)

    def may_publish(self) -> bool:
        return self.valid(PUBLISH_MARGIN_S)

    def stop_before(self, need_s: float) -> float:
        """How long before the lease's end to stop, for a kind that needs ``need_s`` to stop
        cleanly: that, within a fifth and a half of the lease."""
        ttl = self._control.lease_ttl_s
        return min(0.5 * ttl, max(0.2 * ttl, need_s))

    def verdict(self, need_s: float, *, ended_within_s: float = 0.0) -> Verdict:
        """Where the lease stands for a kind that needs ``need_s`` to stop cleanly and counts
        the lease as ended ``ended_within_s`` before its end (the time to kill a command)."""
        left = self.left()
        if left is None:
            return Verdict.HOLDS
        if left <= ended_within_s:
            return Verdict.ENDED
        if left <= self.stop_before(need_s):
            return Verdict.ENDING
        return Verdict.HOLDS

    def watch(self, watcher: Callable[[float | None], None]) -> Callable[[], None]:
        """``watcher`` told the lease's end now and at every renewal (a run's fence)."""
        return self._control.watch_lease(watcher)
