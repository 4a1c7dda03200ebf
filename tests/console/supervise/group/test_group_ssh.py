"""A multi-host job over real sshd, each member in a network namespace of its own, routed
through this one so gloo traffic between ranks crosses the links a partition cuts."""

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
from support.fleetbed import (
    EXECUTOR_ENV,
    cut_until_fenced,
    executor_proc,
    gone,
    until,
    write_inventory,
)
from support.groupbed import group_baseline, group_job, shards
from support.lease_bounds import LeaseBounds

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


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


@pytest.fixture(scope="module")
def digest() -> str:
    return group_baseline()


@pytest.mark.long  # the suite cuts a member off over sshd, fenced, never writing again (test_elastic_ssh), and replaces a lost member with the spare past its lease bound (test_group_local)
async def test_a_partitioned_member_is_replaced_and_never_writes_again(
    bed: sshbed.SshBed, tmp_path: Path, digest: str
) -> None:
    hosts = {n: netbed.ns_host(bed, n, routed=True) for n in "abcd"}
    # the spare takes shards host to host (a per-job key, forced to its replica receiver)
    spare = {"role": "spare", "authorized_keys": str(bed.authorized_keys)}
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={n: h.inventory_table("r1", **(spare if n == "d" else {})) for n, h in hosts.items()},
        jobs={"j": group_job()},
    )
    ctl = Controller(load(inv), Policy.AUTO, executor_env={n: dict(EXECUTOR_ENV) for n in hosts})
    sup = ctl.jobs["j"]
    c = hosts["c"]
    c_dir, d_dir = (hosts[h].root / "jobs" / "j" for h in "cd")
    sampler = Sampler({"c": [c_dir], "d": [d_dir]}).start()  # c's rank: never two at once
    bounds = LeaseBounds(tmp_path / "state" / "state.json").start()
    task = asyncio.create_task(ctl.run(stay=True))
    await until(
        lambda: task.done() or (sup.step >= 60 and ctl.replicator.replica("j", "d", 2).manifest),
        180,
        "step 60 and shard 2 on the spare",
    )
    assert not task.done()
    epoch = ctl.store.job("j").epoch
    lost_at = time.time()
    frozen = await cut_until_fenced(c.netns.cut, c_dir)
    await until(lambda: sampler.windows(d_dir), 120, "d training (/proc)")
    bounds.stop()
    sampler.stop()
    await until(lambda: sup.state.is_terminal(), 240, "the job to end")
    c.netns.heal()
    await until(lambda: ctl.fleet.hosts["c"].state is HostState.UP, 60, "c reachable again")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == digest
    assert ctl.store.job("j").members == ["a", "b", "d"]
    after = {p: p.stat().st_mtime_ns for p in (c.root / "jobs" / "j").rglob("*") if p.is_file()}
    assert after == frozen, "c never trains or writes again once cut off"
    events = [
        json.loads(x) for x in (c.root / "jobs" / "j" / "events.jsonl").read_text().splitlines()
    ]
    epochs = [
        e["epoch"] if e["kind"] == "resumed" else e["manifest"]["epoch"]
        for e in events
        if e["kind"] in ("resumed", "checkpoint")
    ]
    assert epochs and max(epochs) == 1, "c trained and wrote under epoch 1 only"
    assert {m.node_rank for m in shards(hosts["d"].root)} == {2}
    journal = list(read(tmp_path / "state" / "journal.jsonl"))
    copies = [e for e in journal if e.kind is Kind.REPLICA and e.data.get("ok")]
    direct = {e.data["shard"] for e in copies if e.data["route"] == "direct"}
    assert direct == {0, 1, 2}, "every member's shards went host to host"
    fell_back = {
        e.data["source"] for e in journal if e.kind is Kind.ROUTE and e.data.get("route") == "relay"
    }
    assert fell_back <= {"c"}, "only the cut member's copies fell back to the relay"
    (inc,) = incidents(journal)
    assert inc.fault_class == "host_lost"
    # from /proc and state.json, not the journal: c trained last inside the bound persisted on
    # its epoch's leases; d first trained past the newest grant's end plus clock_skew_s
    console = ctl.inv.console
    bound, granted = (
        bounds.persisted("j", epoch),
        bounds.granted_end("j", epoch, console.lease_s, by=lost_at),
    )
    assert bound is not None and granted is not None
    c_windows, d_first = sampler.windows(c_dir), sampler.windows(d_dir)[0]
    assert c_windows, "the sampler saw c train before the cut"
    assert c_windows[-1].t0 < bound, f"c trained {c_windows[-1].t0 - bound:.2f}s past its bound"
    assert d_first.t1 > granted + console.clock_skew_s, (
        f"d trained {granted + console.clock_skew_s - d_first.t1:.2f}s before c's lease ended"
    )
    assert not sampler.overlaps, "c and d never trained at once"


@pytest.mark.long  # the suite proves it for one host (test_console_fencing); a group's lease path is the same
async def test_a_console_restarted_while_a_member_is_cut_off_waits_out_its_lease(
    bed: sshbed.SshBed, tmp_path: Path, digest: str
) -> None:
    """The fencing case of issue 12 for a group: the new console cannot see the lease the old
    one granted the cut-off member; it must wait out the persisted bound before any new epoch,
    so two trainers of one rank never run at once."""
    hosts = {n: netbed.ns_host(bed, n, routed=True) for n in "abcd"}
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            n: h.inventory_table("r1", **({"role": "spare"} if n == "d" else {}))
            for n, h in hosts.items()
        },
        jobs={"j": group_job()},
        lease_s=6.0,
    )
    env = {n: dict(EXECUTOR_ENV) for n in hosts}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    await until(
        lambda: task.done() or (sup.step >= 60 and ctl.replicator.replica("j", "d", 1).manifest),
        180,
        "step 60 and shard 1 on the spare",
    )
    assert not task.done()
    b = hosts["b"]
    old = executor_proc(b.root / "jobs" / "j")
    b.netns.cut()
    task.cancel()  # the console dies right after the cut
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()
    again = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup2 = again.jobs["j"]
    run2 = asyncio.create_task(again.run())
    await until(lambda: again.store.job("j").epoch >= 2 or run2.done(), 120, "epoch 2")
    assert gone(old), "epoch 2 began while b's executor of epoch 1 still lived"
    await asyncio.wait_for(run2, 240)
    b.netns.heal()
    await again.close()
    assert sup2.state is JobState.FINISHED, sup2.live.why
    assert sup2.sha256 == digest
    assert again.store.job("j").members == ["a", "d", "c"]
