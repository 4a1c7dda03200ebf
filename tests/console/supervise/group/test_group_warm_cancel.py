"""A group launch cancelled (the console quits) while it waits for an executor readied on a
replacement host ends cancelled: it does not swallow its own cancellation, taking it for the
readied start's, and go on to start an executor on that host. (Looking into a console that
did not quit mid-grow in a loaded run: ``WarmExecutors.executor`` caught every CancelledError
of ``await readied``.) A readied executor no longer needed (its member answers again) is
stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from support.fleetbed import until
from support.jobbed import Calls, running, services

from console import clock
from console.fleet.link import ExecutorLink
from console.records.journal import read
from console.supervise.group.epoch import _MemberSide
from console.supervise.group.warm import WarmExecutors
from console.supervise.launcher import Launcher
from console.supervise.lease import JobLease
from console.supervise.live import LiveJob
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from console.supervise.policy import Policy
from console.supervise.standby import Standby
from console.supervise.supervisor import Supervisor
from console.supervise.twin import Twin
from protocol.faults import StopReason


class Starts:
    """A launcher that only records the hosts it was asked to start on."""

    def __init__(self) -> None:
        self.hosts: list[str] = []

    async def start(self, host: str, **_: Any) -> Outcome:
        self.hosts.append(host)
        return Outcome(Exit.CRASHED, "not started: a test")


class NoStandby:
    """A job that keeps no warm standby."""

    warm = None

    def starting_on(self) -> None:
        return None

    async def take_warm(self, host: str) -> None:
        return None


class NoTwin:
    """A job that keeps no warm twin."""

    def take(self, host: str) -> None:
        return None


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
        standby=cast(Standby, NoStandby()),
        twin=cast(Twin, NoTwin()),
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


class Idle(ExecutorLink):
    """An idle executor's link: keeps what is sent, and whether it was closed."""

    def __init__(self) -> None:  # no transport: nothing is opened
        self.sent: list[object] = []
        self.shut = False
        self.anchor = (clock.mono(), clock.mono())  # a clock reading, as a Hello gives
        self.hello = None

    async def send(self, msg: Any) -> None:
        self.sent.append(msg)

    def close(self) -> None:
        self.shut = True

    async def finish(self, timeout: float = 0.0) -> None:
        self.close()


async def test_a_member_that_answers_again_calls_off_the_executor_readied_to_replace_it(
    tmp_path: Path,
) -> None:
    """A single host's readied target is called off when its host answers again (a blip); a
    group's readied replacement sat idle on the spare (torch imported, its GPU's memory held)
    until the epoch ended. Now it is stopped once no member is silent, and not before."""
    svc = services(tmp_path, Calls())
    sup = running(svc, "group", ["a", "b"])
    assert isinstance(sup, Supervisor)
    a, b = Member(0, "a"), Member(1, "b")  # both silent: their links lost
    run = sup._epoch([a, b], 1)
    readied = Idle()

    async def started() -> Idle:
        return readied

    sup._executors.readied["c"] = cast(Any, asyncio.create_task(started()))
    await _MemberSide(run, b, "link closed").answered(Idle())
    await asyncio.sleep(0)
    assert "c" in sup._executors.readied and not readied.sent, "a is still silent: kept"
    await _MemberSide(run, a, "link closed").answered(Idle())
    await until(lambda: readied.shut, 5, "the readied executor called off")
    assert [getattr(m, "reason", None) for m in readied.sent] == [StopReason.NOT_NEEDED]
    assert not sup._executors.readied
    said = [e.msg for e in read(svc.inv.state_dir / "journal.jsonl")]
    assert any("readied on c is not needed: a answers again" in m for m in said), said
