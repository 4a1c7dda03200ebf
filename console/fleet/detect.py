"""Failure detection rules, as pure functions of time: no false failover on a blip.

A host is suspect only after a time window *and* a count of missed heartbeats; it is down
only once its lease has surely ended (the console's send time + ttl + clock skew).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DetectionSettings:
    heartbeat_s: float
    missed_heartbeats: int
    suspect_after_s: float
    lease_s: float
    clock_skew_s: float


def is_suspect(now: float, last_seen: float, s: DetectionSettings) -> bool:
    silence = now - last_seen
    return silence >= s.suspect_after_s and silence >= s.missed_heartbeats * s.heartbeat_s


def renewal_gap(s: DetectionSettings) -> float:
    """How much newer than the last one renewed on an executor's clock reading must be for
    the lease to be renewed on it: every heartbeat, and no more than 24 times a lease.

    The executor stops its run with up to half its lease left (room to checkpoint), so a
    lease must reach it with well over half left, however busy the machine: renewed at each
    reading, it reaches it nearly whole (a reading a heartbeat old at most).
    """
    return min(s.heartbeat_s, s.lease_s / 12) / 2


class ClockPace:
    """Does an executor's clock keep the console's pace? A lease assumes the two monotonic
    clocks agree to within ``clock_skew_s`` over one lease; this checks it against heartbeats.

    Each heartbeat gives ``arrived - sent`` (console clock minus executor clock): a constant,
    plus the message's delay, plus whatever the clocks drifted apart. The smallest value of a
    window of one lease is the least delayed, so two windows' smallest values differ by the
    drift over one lease (give or take the least delay of each).
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._start: float | None = None
        self._low: float | None = None
        self._prev_low: float | None = None

    def sample(self, executor_clock: float, arrived: float) -> float | None:
        """Feed one heartbeat; at each window's end, the drift over it (seconds), else None."""
        offset = arrived - executor_clock
        if self._start is None:
            self._start = arrived
        if self._low is None or offset < self._low:
            self._low = offset
        if arrived - self._start < self.window_s:
            return None
        low, prev = self._low, self._prev_low
        self._start, self._low, self._prev_low = arrived, None, low
        return None if prev is None else low - prev
