"""The decision to abandon an epoch, without processes: when a member's run ends first (lost,
crashed, stopped), every other member still linked is told ``Abandon`` for this epoch, once; a
group that finished tells no one. (What an executor does with it, a join given up and the
executor left warm, is proven on real executors: tests/executors/test_dist_train.py.)"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from console.fleet.link import ExecutorLink, LinkError
from console.supervise.group.epoch import GroupEpoch
from console.supervise.member import Member
from console.supervise.outcome import Exit, Outcome
from protocol.messages import Abandon, ConsoleMessage


class Link:
    """What a member's link was sent; ``broken``: every send fails, as a closed link's does."""

    def __init__(self, broken: bool = False) -> None:
        self.sent: list[ConsoleMessage] = []
        self.broken = broken

    async def send(self, msg: ConsoleMessage) -> None:
        if self.broken:
            raise LinkError("link is closed")
        self.sent.append(msg)


def epoch(members: list[Member], number: int = 4) -> GroupEpoch:
    unused = cast(Any, None)  # ended() asks none of its collaborators
    return GroupEpoch(
        members,
        epoch=number,
        lease=unused,
        detection=unused,
        loss=unused,
        on_message=unused,
        collective_timeout_s=10.0,
        silent=unused,
        lost=unused,
        answered=unused,
        leave=unused,
    )


def member(rank: int, link: Link | None) -> Member:
    return Member(rank, "abcd"[rank], link=cast(ExecutorLink, link))


async def settled(run: GroupEpoch) -> None:
    """Until the tellings under way have ended (each a send, bounded by the link's timeout)."""
    async with asyncio.timeout(5):
        await asyncio.gather(*run._telling, return_exceptions=True)


@pytest.mark.parametrize(
    "first", [Exit.HOST_LOST, Exit.CRASHED, Exit.RUN_CRASHED, Exit.PLANNED, Exit.STOPPED]
)
async def test_the_first_end_tells_every_other_linked_member_once(first: Exit) -> None:
    links = [Link(), Link(), Link(broken=True), None]
    members = [member(r, link) for r, link in enumerate(links)]
    run = epoch(members)
    run.ended(members[1], Outcome(first, "gone"))
    run.ended(members[0], Outcome(Exit.RUN_CRASHED, "its collective failed"))  # a second end
    await settled(run)
    a, b, c, _ = links
    assert a is not None and b is not None and c is not None
    assert a.sent == [Abandon(epoch=4)], "told once, for this epoch"
    assert b.sent == [], "the member that ended is not told"
    assert c.sent == [], "a broken link is no error of the epoch's"


async def test_a_group_that_finished_tells_no_one() -> None:
    links = [Link(), Link()]
    members = [member(r, link) for r, link in enumerate(links)]
    run = epoch(members)
    run.ended(members[0], Outcome(Exit.FINISHED, "finished"))
    run.ended(members[1], Outcome(Exit.FINISHED, "finished"))
    await settled(run)
    assert [link.sent for link in links] == [[], []]
