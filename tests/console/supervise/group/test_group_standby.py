"""A group's warm standby (``warm_standby = true``): an idle executor readied on its first
spare before anything fails, which a member's rank moved there takes, as a single host's job
takes its standby (one ``Standby`` for both kinds; issue 30). Real executors, a real kill."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from support.fleetbed import local_host, run_until, slow_python, until, write_inventory
from support.groupbed import controller, executor_pid, group_baseline, group_job, local_group

from console.inventory import load
from console.records.journal import Event, read
from console.states import HostState, JobState
from protocol.errors import ConfigError


def journal(inventory: Path) -> list[Event]:
    return list(read(inventory.parent / "state" / "journal.jsonl"))


@pytest.fixture(scope="module")
def baseline() -> str:
    return group_baseline()


@pytest.mark.long  # the suite's ready standby takes over with no process started (test_controller_local); a member's launch takes it on the same path (group/warm.py)
async def test_a_killed_members_rank_moves_into_the_standby_and_no_process_starts(
    tmp_path: Path,
) -> None:
    """c's host is killed; its rank goes to d, whose standby was up before the kill: the
    only executor ever started on d is that standby (its pid file and the journal's starts),
    no replacement is readied beside it (a second executor on its workdir is refused), and
    the group ends with the uninterrupted run's parameters."""
    # 600 steps: the standby on d is up, and shard 2 there, long before the end (with 240, a
    # loaded run of the long tests finished the job first)
    inv = local_group(tmp_path, warm_standby=True, steps=600)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    events: list[Event] = []
    ctl.journal.subscribe(events.append)

    def ready() -> bool:  # as the job's supervisor says it, and its journal
        up = sup.standby is not None and sup.standby.host == "d"
        return up and any("warm standby ready on d" in e.msg for e in events)

    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and ready() and ctl.replicator.replica("j", "d", 2).manifest,
        120,
        "step 60, the standby up on d and shard 2 there",
    )
    standby = executor_pid(tmp_path / "d")
    ctl.kill_host("c")
    await until(lambda: ctl.store.job("j").members == ["a", "b", "d"], 120, "c's rank on d")
    await asyncio.wait_for(task, 180)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == await asyncio.to_thread(group_baseline, steps=600)
    assert ctl.fleet.hosts["c"].state is HostState.DOWN
    lines = journal(inv)
    started_on_d = [e.data["pid"] for e in lines if e.host == "d" and "started on d" in e.msg]
    assert started_on_d == [standby], "the standby, and nothing started on d after it"
    assert any("the warm standby on d takes the member's rank" in e.msg for e in lines)
    assert not [e.msg for e in lines if "readying an executor on d" in e.msg]


@pytest.mark.long  # the suite proves it for one host (test_warm_standby_default), the same Standby.take_warm
async def test_a_member_lost_while_the_standby_still_starts_moves_into_that_standby(
    tmp_path: Path, baseline: str
) -> None:
    """c is killed while d's standby is still coming up (d's python starts 6 s late): no
    replacement is readied beside it and the recovery does not start a second executor on
    d's workdir (refused: the single host's failover found that); it waits for the standby
    and the rank moves into it."""
    python, slow = slow_python(tmp_path / "bin", delay_s=6.0)
    slow.touch()
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            **{h: local_host(tmp_path / h) for h in "abc"},
            "d": local_host(tmp_path / "d", role="spare", python=str(python)),
        },
        jobs={"j": group_job(warm_standby=True)},
    )
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await run_until(
        ctl,
        lambda: sup.state is JobState.RUNNING and sup._standby.starting_on() == "d",
        120,
        "the group training and d's standby starting",
    )
    ctl.kill_host("c")
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "b", "d"]
    lines = journal(inv)
    story = "\n".join(f"{e.t:.3f} {e.kind.value} {e.host}: {e.msg}" for e in lines)
    started_on_d = [e.msg for e in lines if e.host == "d" and "started on d" in e.msg]
    assert len(started_on_d) == 1 and "as its warm standby" in started_on_d[0], story
    assert any("the warm standby on d takes the member's rank" in e.msg for e in lines), story


def test_a_group_may_keep_a_warm_standby_not_a_warm_twin(tmp_path: Path) -> None:
    assert load(local_group(tmp_path / "s", warm_standby=True)).jobs["j"].placement.standby
    assert not load(local_group(tmp_path / "d")).jobs["j"].placement.standby, "off by default"
    with pytest.raises(ConfigError, match="warm_twin is for jobs on one host for now"):
        load(local_group(tmp_path / "t", warm_twin=True))
