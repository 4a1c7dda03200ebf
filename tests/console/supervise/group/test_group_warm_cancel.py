"""A group launch cancelled (the console quits) while it waits for an executor readied on a
replacement host ends cancelled: it does not swallow its own cancellation, taking it for the
readied start's, and go on to start an executor on that host. (Looking into a console that
did not quit mid-grow in a loaded run: ``WarmExecutors.executor`` caught every CancelledError
of ``await readied``.)"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support.fleetbed import until

from console.supervise.group.warm import WarmExecutors
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease
from console.supervise.live import LiveJob
from console.supervise.outcome import Exit, Outcome
from console.supervise.policy import Policy


class Starts:
    """A launcher that only records the hosts it was asked to start on."""

    def __init__(self) -> None:
        self.hosts: list[str] = []

    async def start(self, host: str, **_: Any) -> Outcome:
        self.hosts.append(host)
        return Outcome(Exit.CRASHED, "not started: a test")


def warm(starts: Starts) -> WarmExecutors:
    async def gone(_host: str) -> bool:
        return True

    return WarmExecutors(
        cast(LiveJob, SimpleNamespace(name="j", spares=[])),
        launcher=cast(Launcher, starts),
        lease=cast(JobLease, SimpleNamespace(ttl_s=3.0)),
        fleet=cast(Any, None),
        journal=cast(Any, None),
        policy=lambda: Policy.AUTO,
        members=lambda: ["a", "c"],
        wait_gone=gone,
    )


async def test_a_launch_cancelled_while_it_waits_for_a_readied_executor_ends_cancelled() -> None:
    starts = Starts()
    executors = warm(starts)
    readied = asyncio.create_task(asyncio.Event().wait())  # an idle executor still starting
    executors.readied["d"] = cast(Any, readied)
    launch = asyncio.create_task(executors.executor("d"))
    await until(lambda: not executors.readied, 5, "the launch waiting for d's readied start")
    launch.cancel()
    with pytest.raises(asyncio.CancelledError):
        await launch
    assert starts.hosts == [], "nothing started on d by a launch that was cancelled"
    assert readied.cancelled(), "the readied start is cancelled with it (its executor stopped)"


async def test_a_readied_start_cancelled_on_its_own_falls_back_to_a_start() -> None:
    starts = Starts()
    executors = warm(starts)
    readied = asyncio.create_task(asyncio.Event().wait())
    executors.readied["d"] = cast(Any, readied)
    launch = asyncio.create_task(executors.executor("d"))
    await until(lambda: not executors.readied, 5, "the launch waiting for d's readied start")
    readied.cancel()
    got = await asyncio.wait_for(launch, 5)
    assert isinstance(got, Outcome) and starts.hosts == ["d"], "started anew on d"
