"""Where a group starts: on its member hosts that may take a job, as a single host's job is
placed only on a usable host."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.groupbed import controller, local_group

from console.records.journal import Kind, read
from console.states import HostState, JobState


@pytest.mark.parametrize("order", ["cordon", "drain"])
async def test_a_member_host_cordoned_or_drained_before_the_start_gives_its_rank_to_the_spare(
    tmp_path: Path, order: str
) -> None:
    """c is cordoned (or drained) before the group's first epoch: its rank starts on the
    spare d, and nothing of the job ever runs on c. The group started on c regardless."""
    inv = local_group(tmp_path, steps=60)
    ctl = controller(inv)
    getattr(ctl, "cordon" if order == "cordon" else "drain_host")("c")
    await asyncio.wait_for(ctl.run(), 120)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    assert ctl.store.job("j").members == ["a", "b", "d"]
    assert not (tmp_path / "c" / "jobs" / "j").exists(), "no executor of the job on c"
    state = HostState.CORDONED if order == "cordon" else HostState.DRAINED
    assert ctl.fleet.hosts["c"].state is state
    placed = [
        e.msg for e in read(inv.parent / "state" / "journal.jsonl") if e.kind is Kind.PLACEMENT
    ]
    assert f"j: c is {state.value}: its rank starts on d" in placed, placed


@pytest.mark.parametrize(
    ("path", "moved"),
    [
        ((HostState.CORDONED,), True),
        ((HostState.DRAINING,), True),
        ((HostState.DRAINING, HostState.DRAINED), True),
        ((HostState.DOWN,), False),  # judged by its deploy: the recovery replaces it then
        ((HostState.SUSPECT,), False),
        ((), False),
    ],
    ids=["cordoned", "draining", "drained", "down", "suspect", "up"],
)
async def test_which_member_hosts_a_first_placement_gives_to_a_spare(
    tmp_path: Path, path: tuple[HostState, ...], moved: bool
) -> None:
    """The rule, no process started: the group g on a and b, spare c, b's host in each state."""
    from support.jobbed import Calls, services

    from console.supervise.group.supervisor import GroupSupervisor

    svc = services(tmp_path, Calls())
    for h in "abc":
        svc.fleet.set_state(h, HostState.UP, "test")
    for state in path:
        svc.fleet.set_state("b", state, "test")
    g = GroupSupervisor(svc, "g")
    g.live.spares = ["c"]
    assert await asyncio.wait_for(g._first_placement(), 5)
    assert g.members == (["a", "c"] if moved else ["a", "b"])
    assert g.live.rec.members == (g.members if moved else []), "a move persisted at once"
