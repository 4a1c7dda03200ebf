"""``Targets.pick`` as a group's recovery calls it for each member it replaces, no process
started: a readied host comes before the job's other spares, and the operator's target is a
lone member's only (two members leaving cannot both go to one host)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from support.jobbed import Calls, services

from console.states import HostState
from console.supervise.supervisor import Supervisor


def group(tmp_path: Path) -> Supervisor:
    """The group g on a and b, spares c then e (all of region r1), d free."""
    svc = services(tmp_path, Calls(), more={"d": "r1", "e": "r1"})
    for h in "abcde":
        svc.fleet.set_state(h, HostState.UP, "test")
    g = Supervisor(svc, "g")
    g._assign_members(["a", "b"])
    g.live.spares = ["c", "e"]
    return g


async def targets(g: Supervisor, leaving: list[str]) -> list[str | None] | None:
    return await asyncio.wait_for(g._group_recovery.targets(leaving, survivors=1), 5)


async def test_the_spares_in_their_order_without_a_readied_host(tmp_path: Path) -> None:
    assert await targets(group(tmp_path), ["a"]) == ["c"]


async def test_a_readied_host_comes_before_the_jobs_other_spares(tmp_path: Path) -> None:
    """e's executor was readied while a's lease ran out: a goes to e, not to c."""
    g = group(tmp_path)
    g._group_recovery._executors.readied["e"] = asyncio.get_running_loop().create_future()
    try:
        assert await targets(g, ["a"]) == ["e"]
    finally:
        g._group_recovery._executors.readied.pop("e").cancel()


async def test_the_operators_target_is_a_lone_members_and_spent_once_taken(
    tmp_path: Path,
) -> None:
    g = group(tmp_path)
    g.live.target = "d"
    assert await targets(g, ["a"]) == ["d"]
    assert g.live.target is None, "taken: the next failover chooses again"


async def test_two_members_leaving_at_once_are_not_both_sent_to_the_operators_target(
    tmp_path: Path,
) -> None:
    g = group(tmp_path)
    g.live.target = "d"
    assert await targets(g, ["a", "b"]) == ["c", "e"]
