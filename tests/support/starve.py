"""A starved machine, as this test's own processes see it, without starving the test beside it.

Busy loops spin while a block runs. Where the host has a cgroup v1 ``cpu`` hierarchy, the loops,
this pytest process (the console under test) and whatever it starts meanwhile (the probes, a
restarted executor) share one core's worth of CPU in a cgroup of their own: each gets about what
it would get among eight loops per core of the whole machine, and the other xdist worker keeps
its core (a machine-wide starvation once made its tests lose leases). Elsewhere the loops spin
on every core, as before.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator

import psutil

from support.cgroup_v1 import Group
from support.wait import until

PER_CORE = 8
SPUN_S = 0.3
"""CPU seconds each busy loop has burnt before the block runs: past its own start, spinning."""


@contextlib.contextmanager
def _one_core() -> Iterator[int]:
    """This process in a cgroup capped at one core while the block runs; yields how many cores
    the loops should cover (1 there, every core where no cap could be set)."""
    try:
        # a whole period of quota per period (a new group's default period: 100 ms)
        group = Group("cpu", "hotspare-starved", {"cpu.cfs_quota_us": "100000"})
    except OSError:
        yield os.cpu_count() or 1
        return
    try:
        yield 1
    finally:  # this process and all it started back home, uncapped
        group.leave()


@contextlib.asynccontextmanager
async def starved() -> AsyncIterator[None]:
    """Busy loops while the block runs (see the module); all killed and reaped after it."""
    with _one_core() as cores:
        procs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])  # noqa: ASYNC220 - killed below
            for _ in range(PER_CORE * cores)
        ]
        try:
            spinning = [psutil.Process(p.pid) for p in procs]
            await until(
                lambda: all(sum(q.cpu_times()[:2]) >= SPUN_S for q in spinning),
                60,
                "the busy loops spinning",
            )
            yield
        finally:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait(timeout=10)
