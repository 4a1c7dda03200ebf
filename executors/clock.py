"""The executor's lease clock: monotonic, and counting through a suspend (CLOCK_BOOTTIME).

A host that sleeps must not wake up believing its lease still has the time it had: the
console's time went on. The wall clock is never used for a lease.
"""

from __future__ import annotations

import time

_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


def now() -> float:
    return time.clock_gettime(_CLOCK)
