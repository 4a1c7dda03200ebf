"""A sharded job (``parallel = "fsdp"``, issue 31) over real sshd, each member in a network
namespace of its own, routed through this one: gloo's all-gathers and reduce-scatters, and the
members' parts sent to each other at a load, cross the links a partition cuts. A member cut
off is replaced by the spare holding its part; the run ends with the uninterrupted run's
parameters, and the cut member never writes again."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos.procs import Sampler
from support import netbed, sshbed
from support.fleetbed import EXECUTOR_ENV, cut_until_fenced, until, write_inventory
from support.groupbed import group_baseline, group_job, shards

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.policy import Policy

pytestmark = pytest.mark.skipif(
    netbed.unavailable() is not None or netbed.forward_blocked() is not None,
    reason=str(netbed.unavailable() or netbed.forward_blocked()),
)

FSDP = {"parallel": "fsdp", "steps": 240}


@pytest.fixture(scope="module")
def digest() -> str:
    return group_baseline(**FSDP)


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


@pytest.mark.long  # the suite proves a part's replacement (test_fsdp_train) and a cut member's fence (test_elastic_ssh)
async def test_a_cut_off_member_of_a_sharded_job_is_replaced_by_its_part_on_the_spare(
    bed: sshbed.SshBed, tmp_path: Path, digest: str
) -> None:
    hosts = {n: netbed.ns_host(bed, n, routed=True) for n in "abcd"}
    # the spare takes each member's part (a DCP folder) host to host
    spare = {"role": "spare", "authorized_keys": str(bed.authorized_keys)}
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={n: h.inventory_table("r1", **(spare if n == "d" else {})) for n, h in hosts.items()},
        jobs={"j": group_job(**FSDP)},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={n: dict(EXECUTOR_ENV) for n in hosts})
    sup = ctl.jobs["j"]
    c = hosts["c"]
    c_dir, d_dir = (hosts[h].root / "jobs" / "j" for h in "cd")
    sampler = Sampler({"c": [c_dir], "d": [d_dir]}).start()  # c's rank: never two at once
    task = asyncio.create_task(ctl.run(stay=True))
    try:
        await until(
            lambda: (
                task.done() or (sup.step >= 60 and ctl.replicator.replica("j", "d", 2).manifest)
            ),
            240,
            "step 60 and rank 2's part on the spare",
        )
        assert not task.done()
        frozen = await cut_until_fenced(c.netns.cut, c_dir)
        await until(lambda: sup.state.is_terminal(), 300, "the job to end")
        c.netns.heal()
        await until(lambda: ctl.fleet.hosts["c"].state is HostState.UP, 60, "c reachable again")
    finally:
        sampler.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == digest
    assert ctl.store.job("j").members == ["a", "b", "d"]
    after = {p: p.stat().st_mtime_ns for p in c_dir.rglob("*") if p.is_file()}
    assert after == frozen, "c never trains or writes again once cut off"
    assert not sampler.overlaps, "c and d never trained at once"
    (part,) = {m.node_rank for m in shards(hosts["d"].root)}
    assert part == 2
    events = [json.loads(x) for x in (d_dir / "events.jsonl").read_text().splitlines()]
    resumed = [e["step"] for e in events if e["kind"] == "resumed"]
    assert resumed and resumed[0] > 0, "d resumed from rank 2's part, not from step 0"
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    copies = [e for e in journal if e.kind is Kind.REPLICA and e.data.get("ok")]
    assert {e.data["shard"] for e in copies if e.data["route"] == "direct"} == {0, 1, 2}, (
        "every member's part (a folder) went host to host"
    )
    (inc,) = incidents(journal)
    assert inc.fault_class == "host_lost"
