"""Was the console itself starved while it waited for a host? Then the wait says nothing
about the host.

A probe that timed out counts as "the host cannot be asked" only if the console was healthy
over the probe's window: its loop did not stall (``loop_watch``) and this machine could start
a program in well under the probe's budget. The second matters as much as the first: a
machine out of CPU (busy loops on every core) leaves a mostly idle event loop on time while
a probe's program (``python -c ...``, here or over SSH) waits for a core; measured on 2 cores
with 16 busy loops, the loop ran at most 0.26 s late while a Python took 1.5 to 2.5 s to
start, three to five times a silent host's probe budget in the tests' fleet (0.5 s). Starting
one here
(the yardstick) is what tells them apart; it is run only when a probe failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from dataclasses import dataclass

from console import loop_watch

YARDSTICK_LIMIT_S = 10.0
"""The yardstick is let run this long (whatever the probe's budget), so that how slow this
machine is now is measured, not only that it was slower than the probe's budget."""
FAIR_SHARE = 0.5
"""A probe had a fair chance if the loop stalled, and a program took to start here, at most
this share of its budget."""


@dataclass(frozen=True)
class Starved:
    stall_s: float
    """The console loop's longest stall over the probe's window."""
    start_s: float
    """How long a Python took to start on this machine just after (at least, if cut off)."""
    budget_s: float

    @property
    def fair_s(self) -> float:
        """A budget that would have been fair, this machine being as slow as it is now."""
        return max(self.stall_s, self.start_s) / FAIR_SHARE

    def __str__(self) -> str:
        return (
            f"the console was starved over a probe of {self.budget_s:.2f} s (its loop stalled "
            f"{self.stall_s:.2f} s, a Python took {self.start_s:.2f} s to start here)"
        )


async def starved(began: float, budget_s: float) -> Starved | None:
    """Whether the console or its machine was too starved since ``began`` (``time.monotonic``)
    for a probe of ``budget_s`` to have had a fair chance; None when it was healthy."""
    stall = loop_watch.for_loop().stall(began)
    start = await start_time(limit_s=max(budget_s, YARDSTICK_LIMIT_S))
    if stall > FAIR_SHARE * budget_s or start > FAIR_SHARE * budget_s:
        return Starved(stall, start, budget_s)
    return None


async def start_time(limit_s: float) -> float:
    """Seconds for a Python to start and exit here (``limit_s`` if it had not by then)."""
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "pass",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # not asyncio.wait_for: on Python 3.11 it swallows a cancel that comes as the process
        # ends, and the reachability loop that asked then never ended (a console's quit hung:
        # test_a_stop_with_no_executor_to_tell_is_kept_not_lost, pytest-timeout at 300 s)
        async with asyncio.timeout(limit_s):
            await proc.wait()
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return limit_s
    return time.monotonic() - began
