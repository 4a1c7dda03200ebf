"""Phases of a failover prepared while a silent member's lease ran out (an executor readied on
the spare, its coming up) belong to the incident the lease's end opens, and to no other: when
the member answers again the readying is called off, and a later incident (another fault,
much later) must not carry the called-off executor's ``executor_up`` as its own. Decision
tests with no process (``support.jobbed``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from support.jobbed import Calls, running, services

from console.records.incidents import incidents
from console.records.journal import read
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from console.supervise.supervisor import Supervisor


def readied_on(sup: Supervisor, host: str) -> None:
    """An executor readied on ``host`` for a silent member (its start given up: nothing to stop)."""
    done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    done.set_result(Outcome(Exit.HOST_LOST, f"{host} given up"))
    sup._executors.readied[host] = done  # type: ignore[assignment]


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_readying_called_off_when_the_member_answers_leaves_no_phase_to_a_later_incident(
    tmp_path: Path, kind: str
) -> None:
    svc = services(tmp_path, Calls())
    hosts = ["a"] if kind == "one host" else ["a", "b"]
    sup = running(svc, kind, hosts)
    members = [Member(r, h, link=object(), last_seen=1.0) for r, h in enumerate(hosts)]  # type: ignore[arg-type]
    silent = members[-1]

    readied_on(sup, "c")  # the silent member's lease runs out: c is readied meanwhile
    sup._incident.phase("executor_up", host="c")  # c's executor came up before any incident
    await sup._answered(silent, members)  # the member answers again: a blip, no incident
    await sup._executors.drop_readied([])
    assert not sup._executors.readied

    sup._events.open_incident(silent, "executor_crash", f"{silent.host}: crashed")  # much later
    (inc,) = incidents(read(svc.journal.path))
    assert "executor_up" not in inc.times, inc.times


async def test_a_readying_the_lease_end_turns_into_an_incident_keeps_its_phase(
    tmp_path: Path,
) -> None:
    """The control: not called off, the early phase is the incident's (so the test above is
    about the call-off, not about early phases never being kept)."""
    svc = services(tmp_path, Calls())
    sup = running(svc, "group", ["a", "b"])
    silent = Member(1, "b", link=None, last_seen=1.0)
    readied_on(sup, "c")
    sup._incident.phase("executor_up", host="c")
    sup._events.lost(silent, "unreachable past its lease", "host_lost")
    (inc,) = incidents(read(svc.journal.path))
    assert "executor_up" in inc.times, inc.times
