"""Fencing across consoles: a restarted console waits out the lease it cannot see, a second
console on one state dir is refused, an order that cannot be delivered says so (a replacement
readied and then called off leaves nothing behind: test_group_readied). Evidence comes from
/proc (the training threads) and the files on disk, not from the console's own account."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from chaos.observe import executor_events, last_step
from chaos.procs import Sampler
from support.fleetbed import EXECUTOR_ENV, local_host, stdlib_job, until, write_inventory
from support.helpers import REPO, env_with

from console import clock
from console.controller import Controller
from console.inventory import load
from console.records.console_lock import StateDirBusy
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy

LEASE_S = 6.0


def _fleet(tmp_path: Path, **console: object) -> Path:
    return write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=100_000)}},
        **console,
    )


def _console(inventory: Path) -> Controller:
    return Controller(
        load(inventory), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "ab"}
    )


async def _die(ctl: Controller, task: asyncio.Task[object]) -> None:
    """The console is killed: nothing more is sent or written, and the kernel drops its lock."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for sup in ctl.jobs.values():
        if sup.link is not None:
            sup.link.close()
    await ctl.replicator.close()
    await ctl.fleet.close()
    ctl.journal.close()
    ctl.lock.release()


async def _stop(ctl: Controller, task: asyncio.Task[object]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()


def _kill_executors(root: Path) -> None:
    for pidfile in root.glob("jobs/*/executor.pid"):
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), 9)


async def test_a_console_started_while_the_host_is_cut_off_waits_out_the_old_lease(
    tmp_path: Path,
) -> None:
    """Issue 12, found 1: console 2 took 'unreachable' for 'gone' and failed over at once,
    while A trained on under console 1's lease for as long again."""
    inventory = _fleet(tmp_path, lease_s=LEASE_S)
    sampler = Sampler({"j": [tmp_path / "a" / "jobs" / "j", tmp_path / "b" / "jobs" / "j"]})
    sampler.start()
    first = _console(inventory)
    task: asyncio.Task[object] = asyncio.create_task(first.run())
    second: Controller | None = None
    try:
        sup = first.jobs["j"]
        await until(
            lambda: sup.step >= 40 and first.replicator.replica("j", "b").manifest, 90, "a replica"
        )
        bound = first.store.job("j").lease
        assert bound is not None and bound.epoch == sup.epoch
        await until(lambda: first.store.job("j").lease.until > bound.until, 10, "a renewal")
        granted = first.store.job("j").lease.until  # die right after renewing
        await _die(first, task)
        died_at = clock.mono()

        second = _console(inventory)
        second.fleet.hosts["a"].transport.set_down(True)  # a cannot be reached from now on
        task = asyncio.create_task(second.run())
        sup2 = second.jobs["j"]
        await until(lambda: sup2.host == "b" and sup2.step > 0, 90, "j training on b")
        started_on_b = clock.mono()
        await until(lambda: len(sampler.seen_training("j")) == 2, 30, "/proc: b's trainer")
    finally:
        sampler.stop()
        if second is not None:
            await _stop(second, task)
        _kill_executors(tmp_path / "a")
        _kill_executors(tmp_path / "b")
    assert sampler.overlaps == [], (
        f"two trainers of j at once, {len(sampler.overlaps)} samples from {sampler.overlaps[0]}"
    )
    # when b trained first, from /proc (the sampler's first window for b's executor), not when
    # the console noticed a step: b trained at some instant of (t0, t1], so t1 must be later
    b_dir = str(tmp_path / "b" / "jobs" / "j")
    (b_first,) = [t.windows[0] for t in sampler.trainers.values() if t.workdir == b_dir]
    wall = time.time() - clock.mono()  # the console's clock to the sampler's (no step here)
    skew = load(inventory).console.clock_skew_s
    assert b_first.t1 > granted + skew + wall, (
        f"the spare trained {granted + skew + wall - b_first.t1:.2f}s before the old lease's "
        "bound plus clock_skew_s"
    )
    extra = started_on_b - died_at
    assert extra <= LEASE_S + 0.2 + 15, f"waited {extra:.1f} s, far past the lease"
    events = list(read(tmp_path / "state" / "journal.jsonl"))
    moved = [e for e in events if e.kind is Kind.JOB_STATE and "epoch 2" in e.msg]
    assert moved and moved[0].host == "b"
    # The incident the restart opened ends where b really resumed (b's own events say), not
    # at the step the dead console last heard of; none is left open.
    resumed = [
        json.loads(line)["step"]
        for line in (tmp_path / "b" / "jobs" / "j" / "events.jsonl").read_text().splitlines()
        if json.loads(line).get("kind") == "resumed"
    ]
    found = incidents(events)
    assert found and all(i.resolved for i in found), [(i.id, i.fault_class) for i in found]
    assert found[-1].resumed_step == resumed[0]


def every_file(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (the lock file's too: flock writes none)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_second_console_on_one_state_dir_is_refused_naming_the_first(tmp_path: Path) -> None:
    inventory = _fleet(tmp_path)
    first = Controller(load(inventory), Policy.AUTO)
    try:
        with pytest.raises(StateDirBusy) as e:
            Controller(load(inventory), Policy.AUTO)
        assert f"pid {os.getpid()} on " in str(e.value)
        before = every_file(tmp_path)  # the state dir and the hosts' roots: nothing runs here
        watcher = Controller(load(inventory), Policy.AUTO, read_only=True)
        watcher.journal.record(Kind.ALERT, "a read-only console writes nothing")
        watcher.store.save()
        assert every_file(tmp_path) == before, "a read-only console wrote a file"
        proc = subprocess.run(
            [sys.executable, "-m", "console.cli", "--inventory", str(inventory), "run"],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=env_with(),
            timeout=60,
        )
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "another console holds this state dir" in lines[0], lines
        assert f"pid {os.getpid()}" in lines[0]
    finally:
        first.lock.release()
        first.journal.close()
    again = Controller(load(inventory), Policy.AUTO)  # released: the next one may start
    again.lock.release()
    again.journal.close()


async def test_a_stop_with_no_executor_to_tell_is_kept_not_lost(tmp_path: Path) -> None:
    """No usable host: the job waits; an operator's stop meanwhile is journalled as not
    delivered and honoured before anything starts."""
    inventory = _fleet(tmp_path)
    ctl = _console(inventory)
    for host in ("a", "b"):
        ctl.fleet.hosts[host].transport.set_down(True)
        ctl.cordon(host)
    task: asyncio.Task[object] = asyncio.create_task(ctl.run())
    try:
        sup = ctl.jobs["j"]
        await until(
            lambda: sup.why.startswith("no usable host for j") and ctl.alerted(sup.why),
            20,
            "j waiting for a host",
        )
        ctl.stop_job("j")
        await until(lambda: sup.state.is_terminal(), 20, "j stopped")
        assert (sup.state, sup.failure) == (JobState.STOPPED, None)
    finally:
        await _stop(ctl, task)
    events = list(read(tmp_path / "state" / "journal.jsonl"))
    assert [e for e in events if e.data.get("order") == "stop" and e.data.get("delivered") is False]
    assert not [e for e in events if e.kind is Kind.EXECUTOR and "started" in e.msg]
    assert not list((tmp_path / "a").glob("jobs/*/executor.pid"))


@pytest.mark.long  # the suite opens `hotspare --read-only` beside a live console: it watches and changes nothing (tests/ui/test_tmux.py)
async def test_a_read_only_console_watches_a_live_job_and_sends_nothing(tmp_path: Path) -> None:
    inventory = _fleet(tmp_path)
    owner = _console(inventory)
    task: asyncio.Task[object] = asyncio.create_task(owner.run())
    watcher = Controller(load(inventory), Policy.AUTO, read_only=True)
    watching: asyncio.Task[object] = asyncio.create_task(watcher.run(stay=True))
    try:
        await until(lambda: owner.jobs["j"].step >= 10, 90, "j training")
        seen = watcher.jobs["j"]
        await until(lambda: seen.state is JobState.RUNNING and seen.step >= 20, 30, "j watched")
        epoch = owner.store.job("j").epoch
        first = seen.step
        await until(lambda: seen.step >= first + 20, 30, "the watcher's view moving")
        assert seen.host == "a" and seen.epoch == epoch
        assert owner.jobs["j"].state is JobState.RUNNING and owner.store.job("j").epoch == epoch
        # the observe path's own words; the tmp path itself holds "watch", so match the phrase
        assert not [e for e in read(tmp_path / "state" / "journal.jsonl") if "(watching)" in e.msg]
    finally:
        await _stop(watcher, watching)
        await _stop(owner, task)
        _kill_executors(tmp_path / "a")


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in folder.glob("*")} if folder.exists() else {}


async def test_a_read_only_console_alone_copies_no_replica_and_drains_nothing(
    tmp_path: Path,
) -> None:
    """Found by the tmux read-only test: a read-only console handled an executor's messages as
    the owner does. It copied every checkpoint to the spare (beside the owner's own copies:
    sha256 failures on b), and a GPU FAIL would have had it drain the job. Here it watches
    alone (the owner quit and left a long last lease): the spare's folder does not change
    while the executor checkpoints on, and a GPU FAIL it sees leaves the executor training."""
    from executors.testing.gpu_fake import write_state

    nvml = tmp_path / "nvml-a.json"
    write_state(nvml, {"devices": [{"name": "Fake H100", "temp_c": 50}]})
    inventory = _fleet(tmp_path, unattended_s=120.0)
    owner = _console(inventory)
    owner.executor_env["a"]["HOTSPARE_FAKE_NVML"] = str(nvml)
    replicas = tmp_path / "b" / "replicas" / "j"
    task: asyncio.Task[object] = asyncio.create_task(owner.run())
    await until(lambda: _files(replicas) or task.done(), 90, "a replica on b")
    await _stop(owner, task)  # a clean quit: the executor trains on under a 120 s lease
    workdir = tmp_path / "a" / "jobs" / "j"
    pid = int((workdir / "executor.pid").read_text())
    watcher = Controller(load(inventory), Policy.AUTO, read_only=True)
    watching: asyncio.Task[object] = asyncio.create_task(watcher.run(stay=True))
    try:
        seen = watcher.jobs["j"]
        await until(lambda: seen.state is JobState.RUNNING, 30, "the job watched")
        before = _files(replicas)
        first = seen.checkpoint.step if seen.checkpoint else 0
        await until(
            lambda: seen.checkpoint is not None and seen.checkpoint.step >= first + 60,
            60,
            "three more checkpoints seen",
        )
        assert _files(replicas) == before, "a read-only console copies no replica"
        write_state(
            nvml,
            {"devices": [{"name": "Fake H100", "temp_c": 50, "ecc_uncorrected": 2, "xids": [79]}]},
        )
        await until(lambda: watcher.fleet.failing("a"), 30, "the GPU FAIL seen")
        at = last_step(workdir)
        await until(lambda: last_step(workdir) >= at + 100, 30, "the executor training on")
        assert Path(f"/proc/{pid}").exists()
        kinds = [e.get("kind") for e in executor_events(workdir)]
        assert "stopped" not in kinds, "nothing told it to drain or stop"
        assert _files(replicas) == before
    finally:
        await _stop(watcher, watching)
        _kill_executors(tmp_path / "a")


async def test_a_read_only_console_shows_the_replicas_the_spares_already_hold(
    tmp_path: Path,
) -> None:
    """Issue 29, item 5: a read-only console started after the owner's copies read 'no
    replica yet' until the next checkpoint was heard of (it looked at a spare only when one
    was); a finished job, or one between checkpoints, showed none at all. It reads what each
    spare holds as it starts. Evidence: the manifests in b's replica folder on disk."""
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **stdlib_job(steps=60)}},
    )
    owner = _console(inventory)
    await asyncio.wait_for(owner.run(), 120)  # the job trains to its end; replicas on b
    await owner.close()
    replicas = tmp_path / "b" / "replicas" / "j"
    on_disk = sorted(
        json.loads(p.read_text())["step"]
        for p in replicas.glob("*.json")
        if "step" in p.read_text()
    )
    assert on_disk, "the owner copied checkpoints to b"
    watcher = Controller(load(inventory), Policy.AUTO, read_only=True)
    watching: asyncio.Task[object] = asyncio.create_task(watcher.run(stay=True))
    try:
        replica = watcher.replicator.replica("j", "b")
        await until(lambda: replica.manifest is not None, 30, "b's replicas read")
        assert replica.manifest is not None and replica.manifest.step == on_disk[-1]
        assert replica.kept == on_disk
    finally:
        await _stop(watcher, watching)
