"""A move kept while a job was on its way to training is made at its first step, by a single
host's supervisor and a group's alike: both pass each step trained to ``Orders.trains``.

Found in review: a group's progress went to the controller only, so a move kept while it
deployed (an operator's drain of a member's host) was never made; it trained on the drained
host."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.jobbed import Calls, running, services

from console.states import HostState, JobState
from console.supervise.member import Member
from protocol.faults import StopReason
from protocol.messages import ConsoleMessage, Drain, Progress


class Link:
    """What an executor's link is told."""

    def __init__(self) -> None:
        self.sent: list[ConsoleMessage] = []

    async def send(self, msg: ConsoleMessage) -> None:
        self.sent.append(msg)


@pytest.mark.parametrize("kind", ["one host", "group"])
async def test_a_drain_kept_while_the_job_deploys_is_made_at_its_first_step(
    tmp_path: Path, kind: str
) -> None:
    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    sup = running(svc, kind, ["a", "b"], deployed=False)
    sup.request_move(StopReason.DRAIN, "operator drained b", off="b" if kind == "group" else "a")
    assert sup.live.move_kept is not None, "kept: nothing to checkpoint yet"
    link = Link()
    sup.live.link = link  # type: ignore[assignment]  # rank 0's, as the launch leaves it
    sup.live.machine.move(JobState.RUNNING)
    step = Progress(step=1, steps=100, loss=1.0, steps_per_s=5.0)
    sup._messages.on_message(Member(0, "a", link=link), step)  # type: ignore[arg-type]
    await asyncio.sleep(0)  # the send is a task
    assert [type(m) for m in link.sent] == [Drain], link.sent
    assert sup.live.state is JobState.CHECKPOINTING and sup.live.move_kept is None
