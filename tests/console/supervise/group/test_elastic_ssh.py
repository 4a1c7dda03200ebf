"""An elastic multi-host job over real sshd, each member in a network namespace of its own:
a member cut off with no spare leaves the group training on two hosts; a host added to the
inventory while it does brings it back to three; the run ends bit-exact with the
uninterrupted three-host run, and the cut-off member never writes again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos.procs import Sampler
from support import netbed, sshbed
from support.event_watch import EventWatch
from support.fleetbed import EXECUTOR_ENV, cut_until_fenced, until, write_inventory
from support.groupbed import group_baseline, group_job, shards
from support.lease_bounds import LeaseBounds

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy

pytestmark = pytest.mark.skipif(
    netbed.unavailable() is not None or netbed.forward_blocked() is not None,
    reason=str(netbed.unavailable() or netbed.forward_blocked()),
)

ELASTIC = {"min_hosts": 2, "deterministic_reduce": True, "steps": 400}


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


@pytest.fixture(scope="module")
def digest() -> str:
    return group_baseline(**ELASTIC)


async def test_a_cut_member_shrinks_the_group_and_an_added_host_grows_it_back(
    bed: sshbed.SshBed, tmp_path: Path, digest: str
) -> None:
    hosts = {n: netbed.ns_host(bed, n, routed=True) for n in "abcd"}
    job = {**group_job(**ELASTIC), "spares": []}
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={n: hosts[n].inventory_table("r1") for n in "abc"},
        jobs={"j": job},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={n: dict(EXECUTOR_ENV) for n in hosts})
    sup = ctl.jobs["j"]
    c = hosts["c"]
    workdirs = {h: hosts[h].root / "jobs" / "j" for h in "abc"}
    sampler = Sampler({"c": [workdirs["c"]]}).start()
    bounds = LeaseBounds(tmp_path / "state" / "state.json").start()
    task = asyncio.create_task(ctl.run(stay=True))
    await until(lambda: task.done() or sup.step >= 60, 180, "step 60 on three hosts")
    assert not task.done()
    epoch = ctl.store.job("j").epoch
    with EventWatch([workdirs["a"], workdirs["b"]]) as watch:
        lost_at = time.time()
        frozen = await cut_until_fenced(c.netns.cut, workdirs["c"])
        await until(
            lambda: ctl.store.job("j").members == ["a", "b"] and sup.state is JobState.RUNNING,
            120,
            "training on a and b",
        )
        resumed = {  # the shrunk epoch's start, as each survivor wrote it
            h: lambda h=h: watch.first(
                workdirs[h], lambda e: e["kind"] == "resumed" and e["epoch"] > epoch
            )
            for h in "ab"
        }
        await until(lambda: all(r() for r in resumed.values()), 60, "a and b resumed, shrunk")
    bounds.stop()
    sampler.stop()
    ctl.add_host("d", hosts["d"].inventory_table("r1"))
    await until(lambda: sup.state.is_terminal(), 300, "the job to end")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await ctl.close()
    c.netns.heal()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == digest, "bit-exact with the uninterrupted 3-host run"
    assert ctl.store.job("j").members == ["a", "b", "d"]
    after = {p: p.stat().st_mtime_ns for p in (c.root / "jobs" / "j").rglob("*") if p.is_file()}
    assert after == frozen, "c never trains or writes again once cut off"
    events = [
        json.loads(x) for x in (c.root / "jobs" / "j" / "events.jsonl").read_text().splitlines()
    ]
    assert {e["epoch"] for e in events if e["kind"] == "resumed"} == {1}
    assert {(m.epoch, m.nnodes) for m in shards(hosts["d"].root)} == {(3, 3)}
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    found = incidents(journal)
    assert [(i.fault_class, i.cause) for i in found] == [("shrunk", "host_lost"), ("grown", None)]
    _shrunk, grown = found
    # from /proc, the executors' own events and state.json, not the journal: c trained last
    # inside the bound persisted on its epoch's leases, and the survivors resumed shrunk only
    # past the newest grant's end plus clock_skew_s
    console = ctl.inv.console
    bound, granted = (
        bounds.persisted("j", epoch),
        bounds.granted_end("j", epoch, console.lease_s, by=lost_at),
    )
    assert bound is not None and granted is not None
    c_windows = sampler.windows(workdirs["c"])
    assert c_windows, "the sampler saw c train before the cut"
    assert c_windows[-1].t0 < bound, f"c trained {c_windows[-1].t0 - bound:.2f}s past its bound"
    for h, at in resumed.items():
        t = at()
        assert t is not None and t > granted + console.clock_skew_s, (
            f"{h} resumed shrunk {granted + console.clock_skew_s - (t or 0):.2f}s before c's "
            "lease ended"
        )
    assert grown.lost_steps == 0
    sizes = {e.data["world_size"] for e in journal if e.kind is Kind.PROGRESS}
    assert sizes == {2, 3}
