"""Bugs the chaos run found, each pinned by a test of its own (local hosts: fast)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import psutil
import pytest
from support.fleetbed import EXECUTOR_ENV, job_table, local_host, until, write_inventory

from console.controller import Controller
from console.fleet.link import ExecutorLink
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState
from console.supervise.policy import Policy
from console.supervise.standby import Prepared


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.long
async def test_a_hung_executor_is_killed_and_restarted_in_place(tmp_path: Path) -> None:
    """SIGSTOP: the console must kill the hung executor (its pkill pattern starts with a dash,
    once read as an option), so the restart in place gets the workdir; no failover."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {"host": "a", "spares": ["b"], **job_table(steps=5000, checkpoint_every_steps=100)}
        },
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    pid = 0
    try:
        await until(lambda: sup.step >= 200 or task.done(), 90, "step 200")
        assert not task.done()
        pid = int((tmp_path / "a" / "jobs" / "j" / "executor.pid").read_text())
        os.kill(pid, signal.SIGSTOP)
        await until(lambda: _gone(pid), 60, "the hung executor to be killed")
        await asyncio.wait_for(task, 180)
    finally:
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "a", "restarted in place, not failed over"
    (inc,) = incidents(read(tmp_path / "state" / "journal.jsonl"))
    assert inc.fault_class == "executor_hang"
    assert inc.resolved


@pytest.mark.long
async def test_a_damaged_newest_replica_is_skipped_for_the_one_before(tmp_path: Path) -> None:
    """The failover promoted only the newest replica; damaged, the job started over from step
    0. Every kept replica is promoted now, so the loader falls back to the one before."""
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={
            "j": {"host": "a", "spares": ["b"], **job_table(steps=4000, checkpoint_every_steps=100)}
        },
    )
    env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    replicas = tmp_path / "b" / "replicas" / "j"
    try:
        await until(
            lambda: len(list(replicas.glob("step-*.json"))) >= 2 or task.done(), 90, "2 replicas"
        )
        assert not task.done()
        ctl.kill_host("a")
        *older, newest = sorted(replicas.glob("step-*.json"))
        data = newest.with_suffix(".pt")
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 2)
        previous = int(older[-1].stem.split("-")[1])
        await asyncio.wait_for(task, 180)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED
    assert sup.host == "b"
    events = list(read(tmp_path / "state" / "journal.jsonl"))
    (inc,) = incidents(events)
    assert inc.fault_class == "host_lost"
    assert inc.resumed_step == previous, "resumed from the replica before the damaged one"
    assert any(e.data.get("fault") == "checkpoint_corrupt" for e in events), "the skip is an event"


@pytest.mark.long
async def test_a_partitioned_host_is_suspected_within_seconds_not_at_the_keepalive(
    tmp_path: Path,
) -> None:
    """Closing a link over a dead path left its reader waiting for the SSH keepalive (15 s):
    a partition was detected ~18 s late. The close now ends the read at once."""
    import time

    from support import sshbed
    from support.netbed import ns_host

    with sshbed.ssh_bed() as bed:
        a, b = ns_host(bed, "a"), bed.host(name="b")
        inv = write_inventory(
            tmp_path / "inventory.toml",
            hosts={"a": a.inventory_table("r1"), "b": b.inventory_table("r1", role="spare")},
            jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=6000)}},
        )
        env = {h: dict(EXECUTOR_ENV) for h in ("a", "b")}
        ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
        sup = ctl.jobs["j"]
        task = asyncio.create_task(ctl.run())
        try:
            await until(lambda: sup.step >= 100 or task.done(), 90, "step 100")
            assert not task.done()
            a.netns.cut()
            cut_at = time.time()
            await until(lambda: incidents(read(tmp_path / "state" / "journal.jsonl")), 30, "one")
            detected = time.time() - cut_at
            await until(lambda: sup.host == "b" and sup.incident is None, 60, "b to take over")
            a.netns.heal()
            await asyncio.wait_for(task, 180)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await ctl.close()
    (inc,) = incidents(read(tmp_path / "state" / "journal.jsonl"))
    assert inc.fault_class == "host_lost"
    assert detected < 6, f"the partition was noticed {detected:.1f}s after the cut"
    assert inc.mttr_s is not None and inc.mttr_s < 14, f"MTTR {inc.mttr_s}"


def _one_job_fleet(tmp_path: Path) -> Controller:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table()}},
    )
    return Controller(load(inv), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"})


async def test_an_executor_told_to_stop_is_never_taken_for_the_next_one_on_its_host(
    tmp_path: Path,
) -> None:
    """Chaos seed 32: a failover target readied during the lease wait was dismissed, the
    failover picked the same host, and the new link reached the dismissed executor, still
    serving the socket; its Stopped("not needed") then failed the job. Here the dismissed
    executor still answers when the next start comes: the start must not hand back a link to
    it (it is told to stop and waited out, and a new executor is linked)."""
    ctl = _one_job_fleet(tmp_path)
    sup = ctl.jobs["j"]
    old = await sup.launcher.start("b", released=lambda _h: None)
    assert isinstance(old, ExecutorLink) and old.hello is not None
    try:
        sup.dismissed.add(("b", old.hello.pid))  # told to stop, not gone yet
        again = await sup.launcher.start("b", released=lambda _h: None)
        assert isinstance(again, ExecutorLink) and again.hello is not None
        assert again.hello.pid != old.hello.pid, "linked to the dismissed executor"
        assert _gone(old.hello.pid)
        await sup._standby.discard(Prepared("b", again))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(old.hello.pid, signal.SIGKILL)
        old.close()
        await ctl.close()


async def test_dismissing_a_readied_executor_waits_until_it_has_let_go_of_the_workdir(
    tmp_path: Path,
) -> None:
    ctl = _one_job_fleet(tmp_path)
    sup = ctl.jobs["j"]
    try:
        old = await sup.launcher.start("b", released=lambda _h: None)
        assert isinstance(old, ExecutorLink) and old.hello is not None
        await sup._standby.discard(Prepared("b", old))
        assert _gone(old.hello.pid), "gone once the discard returns"
        new = await sup.launcher.start("b", released=lambda _h: None)
        assert isinstance(new, ExecutorLink) and new.hello is not None
        assert new.hello.pid != old.hello.pid
        await sup._standby.discard(Prepared("b", new))
    finally:
        await ctl.close()


async def test_an_idle_executor_left_by_a_dead_console_is_taken_not_fought(
    tmp_path: Path,
) -> None:
    """Chaos (partition, then console_restart, overlapped): the dead console had readied a
    failover target on b; every start the new console tried there failed with "another
    executor is already running here", its restarts ran out and the job went to a host with
    no replica. An idle executor on the job's workdir has loaded nothing: it is taken."""
    first = _one_job_fleet(tmp_path)
    left = await first.jobs["j"].launcher.start("b", released=lambda _h: None)
    assert isinstance(left, ExecutorLink) and left.hello is not None
    left.close()  # the first console dies: its link goes, the idle executor stays
    await first.close()
    second = _one_job_fleet(tmp_path)
    try:
        taken = await second.jobs["j"].launcher.start("b", released=lambda _h: None)
        assert isinstance(taken, ExecutorLink) and taken.hello is not None, taken
        assert taken.hello.pid == left.hello.pid
        assert not _gone(left.hello.pid)
        await second.jobs["j"]._standby.discard(Prepared("b", taken))
        assert _gone(left.hello.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(left.hello.pid, signal.SIGKILL)
        await second.close()
