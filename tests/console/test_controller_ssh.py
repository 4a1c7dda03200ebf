"""The fleet controller over real sshd hosts: host death, a network partition, a blip."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from chaos.procs import Sampler, Window
from support import sshbed
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_sha,
    cut_until_fenced,
    kill_caught_up,
    stdlib_job,
    until,
    write_inventory,
)
from support.lease_bounds import LeaseBounds
from support.netbed import ns_host

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import HostState, JobState
from console.supervise.policy import Policy

BLIP_S = 0.3


@pytest.fixture
def bed() -> Iterator[sshbed.SshBed]:
    with sshbed.ssh_bed() as b:
        yield b


def inventory(
    tmp_path: Path, a: sshbed.SshHost, b: sshbed.SshHost, lease_s: float = 3.0, **job: object
) -> Path:
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": a.inventory_table("r1"), "b": b.inventory_table("r1", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(**job)}},
        lease_s=lease_s,
    )


def controller(inv: Path, a_env: dict[str, str] | None = None) -> Controller:
    return Controller(
        load(inv),
        Policy.AUTO,
        executor_env={"a": {**EXECUTOR_ENV, **(a_env or {})}, "b": dict(EXECUTOR_ENV)},
    )


def journal(inv: Path) -> list:  # type: ignore[type-arg]
    return list(read(inv.parent / "state" / "journal.jsonl"))


async def start(
    ctl: Controller, predicate, timeout: float, what: str, *, stay: bool = False
) -> asyncio.Task:  # type: ignore[no-untyped-def]
    task = asyncio.create_task(ctl.run(stay=stay))
    await until(lambda: predicate() or task.done(), timeout, what)
    assert not task.done(), f"the run ended before {what}"
    return task


def trained(sampler: Sampler, root: Path) -> list[Window]:
    """Every window in which an executor of ``root``'s workdir trained (/proc), oldest first."""
    return sampler.windows(root / "jobs" / "j")


@pytest.mark.long  # the suite kills an sshd host and fails its job over bit-exact (test_provision_ssh), and bounds a killed host's lost steps (test_controller_local's warm standby test)
async def test_killing_host_a_fails_over_to_b(bed: sshbed.SshBed, tmp_path: Path) -> None:
    a, b = bed.host(name="a"), bed.host(name="b")
    inv = inventory(tmp_path, a, b)
    digest = baseline_sha(inv, "j", tmp_path / "baseline")
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    # The kill falls once the spare has kept up: its replica within one interval of a's newest
    # checkpoint on a's disk, judged with a stopped (the premise of the bound below). Not merely
    # "a replica": on a loaded machine the first replica (step 20) landed as a checkpointed step
    # 160, 0.7 s of training later; and a caught-up console seen before a kill that took a
    # while still lost 60 steps (a trained on while its processes were found).
    task = await start(ctl, lambda: sup.step >= 60, 120, "step 60")
    # sshd and every process under its root
    replica_at_kill, _ = await kill_caught_up(
        ctl, a.processes, a.kill_all, a.root / "jobs" / "j", 20
    )
    await asyncio.wait_for(task, 180)
    await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "b"
    assert sup.sha256 == digest
    (inc,) = incidents(journal(inv))
    assert inc.fault_class == "host_lost"
    assert inc.resolved
    assert inc.resumed_step is not None
    assert inc.resumed_step >= replica_at_kill, "resumed from the newest verified replica"
    assert inc.lost_steps is not None
    assert inc.lost_steps <= 2 * 20, "one interval, plus a checkpoint still on its way to the spare"


@pytest.mark.long  # the suite cuts a member off over sshd and sees it fenced, never writing again (test_elastic_ssh), a run frozen past its lease publish nothing (chaos short), and a console restarted while a host is cut off wait the lease out (test_console_fencing)
async def test_a_partitioned_host_stops_within_its_lease_and_never_writes_again(
    bed: sshbed.SshBed, tmp_path: Path
) -> None:
    a, b = ns_host(bed, "a"), bed.host(name="b")
    # the default lease, longer than detection plus b's cold start over ssh (~6 s here), so a
    # console that did not wait it out would be seen training b before the bound
    # (and A paced to at most 50 steps/s, so that training on cut off until it stops at about
    # half its lease it cannot finish the job: unpaced, an idle machine trained all 2000 steps
    # in 5 s and A's last event was "finished")
    inv = inventory(tmp_path, a, b, lease_s=10.0, steps=2000)
    digest = baseline_sha(inv, "j", tmp_path / "baseline")
    ctl = controller(inv, a_env={"HOTSPARE_INJECT": "slow_step@0.02"})
    sup = ctl.jobs["j"]
    task = await start(  # stay: the console keeps watching A after the job ends
        ctl,
        lambda: sup.step >= 60 and ctl.replicator.replica("j", "b").manifest,
        120,
        "step 60 and a replica on b",
        stay=True,
    )
    epoch = sup.epoch
    skew = load(inv).console.clock_skew_s
    sampler = Sampler({"j": [a.root / "jobs" / "j", b.root / "jobs" / "j"]}).start()
    with LeaseBounds(tmp_path / "state" / "state.json") as bounds:
        await until(lambda: bounds.until.get(("j", "a", epoch)), 10, "A's bound read from disk")
        lost_at = time.time()
        await cut_until_fenced(a.netns.cut, a.root / "jobs" / "j", 30)
        events_a = [
            json.loads(x) for x in (a.root / "jobs" / "j" / "events.jsonl").read_text().splitlines()
        ]
        assert events_a[-1]["kind"] == "stopped"
        assert events_a[-1]["reason"] == "lease_lost", "A stopped itself: its lease ran out"
        await until(lambda: sup.host == "b" and sup.state is JobState.RUNNING, 60, "B to take over")
        await until(lambda: trained(sampler, b.root), 60, "B's executor training (/proc)")
    sampler.stop()
    bound = bounds.wall("j", "a", epoch)
    a_windows = trained(sampler, a.root)
    assert a_windows, "the sampler saw A train before the cut"
    assert a_windows[-1].t0 < bound, (
        f"A trained {a_windows[-1].t0 - bound:.2f}s past the bound persisted on its lease"
    )
    # the console's own failover waits the newest lease's end (the bound less its lead), not
    # the bound a console started later would wait
    granted = bounds.granted_end("j", epoch, load(inv).console.lease_s, by=lost_at)
    assert granted is not None
    b_first = trained(sampler, b.root)[0]
    assert b_first.t1 > granted + skew, (
        f"B trained {granted + skew - b_first.t1:.2f}s before A's lease ended plus clock_skew_s"
    )
    assert not sampler.overlaps, sampler.overlaps
    # what A's run wrote: its checkpoints and its events. The job's warm standby may come to A
    # once A is a spare again (an idle executor of its own, in the same workdir): it trains
    # nothing and writes no checkpoint
    ckpts, events = a.root / "jobs" / "j" / "checkpoints", a.root / "jobs" / "j" / "events.jsonl"
    frozen = {p: p.stat().st_mtime_ns for p in ckpts.rglob("*")}
    said = events.stat().st_size
    a.netns.heal()
    await until(lambda: sup.state.is_terminal(), 240, "the job to end")
    await until(lambda: ctl.fleet.hosts["a"].state is HostState.UP, 30, "A reachable again")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await ctl.close()
    assert sup.sha256 == digest
    after = {p: p.stat().st_mtime_ns for p in ckpts.rglob("*")}
    assert after == frozen, "A never writes a checkpoint again after the partition heals"
    later = [json.loads(x) for x in events.read_bytes()[said:].decode().splitlines() if x.strip()]
    trained_on_a = [
        e
        for e in later
        if e["kind"] in ("progress", "checkpoint", "resumed", "finished")
        or (e["kind"] == "heartbeat" and e["state"] in ("training", "stopping", "faulted"))
    ]
    assert not trained_on_a, "A never trains again after the partition heals"
    starts_on_a = [
        e for e in journal(inv) if e.kind is Kind.EXECUTOR and e.host == "a" and "started" in e.msg
    ]
    assert len(starts_on_a) >= 1 and not starts_on_a[0].data["standby"]
    assert all(e.data["standby"] for e in starts_on_a[1:]), "only a standby started on A since"


async def test_a_short_network_blip_causes_no_failover(bed: sshbed.SshBed, tmp_path: Path) -> None:
    a, b = ns_host(bed, "a"), bed.host(name="b")
    inv = inventory(tmp_path, a, b, steps=800)
    digest = baseline_sha(inv, "j", tmp_path / "baseline")
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = await start(ctl, lambda: sup.step >= 60, 120, "step 60")
    a.netns.cut()
    await asyncio.sleep(BLIP_S)  # the fault itself: a 300 ms outage
    a.netns.heal()
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.sha256 == digest
    assert sup.host == "a"
    assert incidents(journal(inv)) == []
    assert not [e for e in journal(inv) if e.kind is Kind.HOST_STATE and e.host == "a"], (
        "a never even suspect"
    )
