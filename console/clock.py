"""The console's clocks: a monotonic one for leases and a wall one for people.

Leases and every deadline that fences a write run on ``mono`` (CLOCK_BOOTTIME: it keeps
counting through a suspend, so a console whose laptop slept does not think less time went
by than the executors did). ``wall`` is for timestamps a person reads; a test can step it
(``HOTSPARE_CLOCK_OFFSET_FILE`` names a file holding seconds to add, read again when it
changes) to show that nothing that fences depends on it.
"""

from __future__ import annotations

import os
import time
from functools import cache

_MONO = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)
OFFSET_HOOK = "HOTSPARE_CLOCK_OFFSET_FILE"
_offset: tuple[float, float] = (-1.0, 0.0)
"""(the hook file's mtime when read, its offset)."""


def mono() -> float:
    return time.clock_gettime(_MONO)


@cache
def boot_id() -> str:
    """Names this boot of this machine: ``mono`` readings from another boot mean nothing."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def wall() -> float:
    return time.time() + _wall_offset()


def _wall_offset() -> float:
    global _offset
    path = os.environ.get(OFFSET_HOOK)
    if not path:
        return 0.0
    try:
        mtime = os.stat(path).st_mtime
        if mtime != _offset[0]:
            with open(path) as f:
                _offset = (mtime, float(f.read().strip() or 0))
    except (OSError, ValueError):
        return _offset[1]
    return _offset[1]
