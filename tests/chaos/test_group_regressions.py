"""Bugs the multi-host chaos run found, each pinned by a test of its own (local hosts: fast)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from support.fleetbed import EXECUTOR_ENV, local_host, until, write_inventory
from support.groupbed import controller, group_job, local_group
from support.helpers import REPO, env_with

from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.group.resume import _newest_whole
from protocol.spec import CheckpointManifest


@pytest.mark.long
async def test_a_killed_members_incident_names_it_not_a_survivor_whose_collective_failed(
    tmp_path: Path,
) -> None:
    """SIGKILL of b's executor: a and c's collectives fail at once (connection reset) and
    their RunEnded reached the console before it had probed b's host and found b dead, so the
    incident named the first survivor to report (a crash on a or c, its gloo error as
    the reason, its last word as the fault time)."""
    inv = local_group(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 60 or task.done(), 120, "step 60")
        assert not task.done()
        os.kill(int((tmp_path / "b" / "jobs" / "j" / "executor.pid").read_text()), signal.SIGKILL)
        await asyncio.wait_for(task, 180)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    (inc,) = incidents(list(read(tmp_path / "state" / "journal.jsonl")))
    assert inc.fault_class == "executor_crash"
    assert inc.host == "b", inc.lines[0].msg


@pytest.mark.long  # a chaos find; the suite reattaches a new console to every member (test_group_local)
async def test_a_console_started_after_its_members_ended_restarts_them_in_place(
    tmp_path: Path,
) -> None:
    """The console dies and the members' leases run out: every executor stops and exits. The
    next console found no executor to link to at start and left each member to the epoch's
    watch as silent from the start, where every probe of the host was cut to what was left of
    the persisted lease, 0.2 s once it had passed: a host slower to answer than that (here a
    Python that takes 0.5 s to start; over sshd under load a fresh connection) was called
    unreachable past its lease (host_lost) and replaced by a spare, though it was up and
    nothing could train there any more (chaos, seed 5: a console restart replaced a and b by d
    and e, and the group started again from step 0, 265 steps lost)."""
    slow = tmp_path / "python"
    slow.write_text(f'#!/bin/sh\nsleep 0.5\nexec {sys.executable} "$@"\n')
    slow.chmod(0o755)
    hosts = {h: local_host(tmp_path / h, python=str(slow)) for h in "abc"}
    hosts["d"] = local_host(tmp_path / "d", role="spare", python=str(slow))
    inv = write_inventory(tmp_path / "inventory.toml", hosts=hosts, jobs={"j": group_job()})
    ctl = controller(inv)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 60 or task.done(), 120, "step 60")
        assert not task.done()
        pids = [int((tmp_path / h / "jobs" / "j" / "executor.pid").read_text()) for h in "abc"]
    finally:
        task.cancel()  # the console dies; nothing renews the members' leases
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
    await until(lambda: all(_gone(p) for p in pids), 60, "every member to stop and exit")
    again = controller(inv)
    sup2 = again.jobs["j"]
    task = asyncio.create_task(again.run())
    journal = tmp_path / "state" / "journal.jsonl"
    try:
        await until(
            lambda: (
                task.done() or any(i.fault_class == "host_lost" for i in incidents(read(journal)))
            ),
            180,
            "the job to end, or a host_lost incident",
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await again.close()
    found = incidents(list(read(journal)))
    assert not [i for i in found if i.fault_class == "host_lost"], [i.lines[0].msg for i in found]
    assert sup2.state is JobState.FINISHED, sup2.live.why
    assert again.store.job("j").members == ["a", "b", "c"]


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_a_console_restart_incident_is_resolved_once_the_group_is_reattached(
    tmp_path: Path,
) -> None:
    """The console SIGKILLed while the group trains: the next one opens a console_restart
    incident and reattaches to every member at the same epoch, but the group's reattach never
    said where the job resumed (the single host's does), so no step ever resolved the incident;
    it stayed open to the end, and a member's failure after it could open no incident of its
    own (chaos, seed 5: 'console_restart on b: not resolved')."""
    inv = local_group(tmp_path)
    journal = tmp_path / "state" / "journal.jsonl"
    env = {h: dict(EXECUTOR_ENV) for h in "abcd"}
    first = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "console.cli", "--inventory", str(inv), "run", "--policy", "auto"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=REPO,
        env=env_with(HOTSPARE_EXECUTOR_ENV=json.dumps(env)),
    )
    try:
        await until(
            lambda: (
                journal.exists()
                and any(
                    e.kind is Kind.CHECKPOINT and e.data.get("committed") for e in read(journal)
                )
            ),
            120,
            "a committed step",
        )
    finally:
        first.kill()  # SIGKILL: no "console stopped" in the journal
        await asyncio.wait_for(first.wait(), 30)
    again = controller(inv)
    try:
        await asyncio.wait_for(again.run(), 180)
    finally:
        await again.close()
    assert again.jobs["j"].state is JobState.FINISHED
    assert any("reattached to all 3" in e.msg for e in read(journal))
    (inc,) = incidents(list(read(journal)))
    assert inc.fault_class == "console_restart"
    assert inc.resolved, [e.msg for e in inc.lines]


def _held(step: int, epoch: int, rank: int, nnodes: int) -> tuple[int, str, CheckpointManifest]:
    m = CheckpointManifest(
        job="j",
        step=step,
        file=f"step-{step:010d}.pt",
        size=1,
        sha256="x",
        epoch=epoch,
        spec_hash="s",
        code_version="v",
        created_at=0.0,
        node_rank=rank,
        nnodes=nnodes,
    )
    return (epoch, "/ckpt", m)


def test_a_shrunk_group_resumes_from_a_committed_step_not_one_only_the_survivors_wrote() -> None:
    """Elastic chaos seeds 1 and 3 (scripts/chaos --group --elastic): sigstop_past_lease froze
    a of epoch 4 (a, b, c) in the middle of writing its shard of step 180; b and c wrote theirs
    (the newest committed step was 160). The group shrank to b and c and started epoch 5
    "resuming from committed step 180": no epoch had committed 180 (rank 0's shard of it was
    never written). Here: the survivors' holdings as Resume.step gathers them."""
    survivors = [
        {160: _held(160, 4, 1, 3), 180: _held(180, 4, 1, 3)},
        {160: _held(160, 4, 2, 3), 180: _held(180, 4, 2, 3)},
    ]
    assert _newest_whole(survivors, [160]) == 160
    full = [
        {180: _held(180, 4, 0, 3)},
        {180: _held(180, 4, 1, 3)},
        {180: _held(180, 4, 2, 3)},
    ]
    assert _newest_whole(full, [160]) == 180, "every rank of epoch 4 wrote it: whole"
