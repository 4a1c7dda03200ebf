"""A torch job of two ranks per host under the console (``procs_per_host = 2``, issue 31): two
members and a spare on local demo hosts, gloo over loopback, real executors and their
followers, real kills. What trains where is read from /proc (``chaos.procs.Sampler``, which
knows a follower by its command line), never from the console's account."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from chaos.procs import Sampler, followers_in
from support.fleetbed import job_table, local_host, run_until, until, write_inventory
from support.groupbed import controller

from console.states import HostState, JobState

JOB = job_table(steps=240, procs_per_host=2, config={**job_table()["config"], "global_batch": 8})


def fleet(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    hosts = {"a": local_host(folder / "a"), "b": local_host(folder / "b")}
    hosts["c"] = local_host(folder / "c", role="spare")
    job: dict[str, Any] = {**JOB, "hosts": ["a", "b"], "spares": ["c"]}
    return write_inventory(folder / "inventory.toml", hosts=hosts, jobs={"j": job}, lease_s=6.0)


@pytest.fixture(scope="module")
def baseline() -> str:
    with tempfile.TemporaryDirectory(prefix="hotspare-ranks-") as tmp:
        return asyncio.run(_uninterrupted(fleet(Path(tmp))))


async def _uninterrupted(inv: Path) -> str:
    ctl = controller(inv, hosts=("a", "b", "c"))
    await asyncio.wait_for(ctl.run(), 240)
    await ctl.close()
    sup = ctl.jobs["j"]
    assert sup.state is JobState.FINISHED, sup.live.why
    return sup.sha256


@pytest.mark.long  # the suite proves it at the executor level (tests/executors/test_local_ranks)
async def test_a_member_host_of_two_ranks_killed_is_replaced_by_the_spare_bit_exact(
    tmp_path: Path, baseline: str
) -> None:
    inv = fleet(tmp_path)
    ctl = controller(inv, hosts=("a", "b", "c"))
    sup = ctl.jobs["j"]
    b_dir, c_dir = (tmp_path / h / "jobs" / "j" for h in "bc")
    sampler = Sampler({"b": [b_dir], "c": [c_dir]}).start()
    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and ctl.replicator.replica("j", "c", 1).manifest,
        120,
        "step 60 and b's shard on the spare",
    )
    assert len(followers_in(b_dir)) == 1, "b trains two ranks: its executor and one follower"
    ctl.kill_host("b")
    await until(lambda: not followers_in(b_dir), 30, "b's follower gone with its host")
    await until(lambda: sampler.windows(c_dir), 120, "c training (/proc)")
    await asyncio.wait_for(task, 240)
    sampler.stop()
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "c"]
    assert ctl.fleet.hosts["b"].state is HostState.DOWN
    assert not sampler.overlaps, "no local rank of b's trained beside c's"
    trained = {t.job for t in sampler.trainers.values() if t.windows}
    assert trained == {"b", "b/local-1", "c", "c/local-1"}, trained
