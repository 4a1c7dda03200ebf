"""Restart in place through the console: the executor stays, and a Start at the next epoch
restarts the dead run in the same process (the executor's pid, read from /proc and the
workdir, is the evidence); with no restart left it is told to stop, not left to its lease."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_sha,
    job_table,
    local_host,
    until,
    write_inventory,
)
from support.helpers import PLAIN_SCRIPT, command_pid, maps_torch, plain_command

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Kind, read
from console.states import JobState
from console.supervise.policy import Policy

SCRIPT = PLAIN_SCRIPT
STEPS = 150


def executor_pid(root: Path, job: str) -> int:
    return int((root / "jobs" / job / "executor.pid").read_text())


def command_table() -> dict:
    command = plain_command(step_s=0.03)
    command["argv"] = [*command["argv"], "--warn"]  # a FutureWarning on stderr, first thing
    return {"executor": "command", "steps": STEPS, "command": command}


def plain_reference(tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--checkpoint-dir", str(tmp_path / "ref"), "--steps", "150"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
        check=True,
    )
    return done.stdout.strip().splitlines()[-1].split()[-1]


async def test_a_killed_command_restarts_in_the_same_executor_at_the_next_epoch(
    tmp_path: Path,
) -> None:
    reference = await asyncio.to_thread(plain_reference, tmp_path)
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"p": {"host": "a", "spares": ["b"], **command_table()}},
    )
    ctl = Controller(load(inv), Policy.AUTO)
    sup = ctl.jobs["p"]
    workdir = tmp_path / "a" / "jobs" / "p"
    task = asyncio.create_task(ctl.run())
    await until(lambda: sup.step >= 40 or task.done(), 90, "step 40")
    pid = executor_pid(tmp_path / "a", "p")
    child = command_pid(workdir)
    assert child is not None and child != pid
    os.kill(child, signal.SIGKILL)
    await until(
        lambda: (sup.epoch >= 2 and sup.state is JobState.RUNNING) or task.done(),
        30,
        "a restart at epoch 2",
    )
    await until(
        lambda: command_pid(workdir) not in (None, child) or task.done(), 30, "a new command"
    )
    assert executor_pid(tmp_path / "a", "p") == pid, "the same executor restarted the command"
    assert Path(f"/proc/{pid}").exists()
    assert not maps_torch(pid), "the command kind's executor never imports torch"
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert (sup.state, sup.host, sup.sha256) == (JobState.FINISHED, "a", reference)
    entries = list(read(inv.parent / "state" / "journal.jsonl"))
    started = [e for e in entries if "executor pid" in e.msg and "started on a" in e.msg]
    assert len(started) == 1, [e.msg for e in started]  # b's warm standby aside
    (inc,) = incidents(entries)
    assert inc.fault_class == "run_crash" and inc.resolved
    # told as what happened: the run died of SIGKILL and the executor stayed, not the
    # script's first stderr line (its FutureWarning) and not "executor ... ended"
    ended = next(e for e in entries if e.kind is Kind.EXECUTOR and "ended" in e.msg)
    assert ended.msg.startswith("p: the run on a ended, its executor stays: run_crash: "), ended
    assert ended.msg.split("run_crash: ", 1)[1].startswith(
        "the command killed by SIGKILL after step"
    )


@pytest.mark.long  # the suite restarts a run in its executor at the next epoch (a killed command, in this file), a crashed torch run in place bit-exact (tests/executors/test_serve_restart.py) and under `hotspare run` (test_headless)
async def test_an_injected_crash_restarts_the_torch_run_in_the_same_process_bit_exact(
    tmp_path: Path,
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=300)}},
    )
    baseline = await asyncio.to_thread(baseline_sha, inv, "j", tmp_path / "baseline")
    env = {"a": {**EXECUTOR_ENV, "HOTSPARE_INJECT": "crash@90"}, "b": dict(EXECUTOR_ENV)}
    ctl = Controller(load(inv), Policy.AUTO, executor_env=env)
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    await until(lambda: sup.step >= 20 or task.done(), 90, "step 20")
    pid = executor_pid(tmp_path / "a", "j")
    await until(lambda: sup.epoch >= 2 or task.done(), 90, "the restart at epoch 2")
    await until(lambda: sup.step > 90 or task.done(), 60, "a step past the crash")
    assert executor_pid(tmp_path / "a", "j") == pid and Path(f"/proc/{pid}").exists()
    await asyncio.wait_for(task, 120)
    await ctl.close()
    assert (sup.state, sup.host, sup.sha256) == (JobState.FINISHED, "a", baseline)
    (inc,) = incidents(list(read(inv.parent / "state" / "journal.jsonl")))
    assert inc.fault_class == "run_crash" and inc.resolved, (
        "the torch run raised; its executor stayed"
    )
    assert inc.resumed_step == 80


async def test_with_no_restart_left_the_waiting_executor_is_stopped_not_left_to_its_lease(
    tmp_path: Path,
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"p": {"host": "a", "spares": ["b"], **command_table()}},
        restart_limit=0,
        lease_s=30.0,
    )
    ctl = Controller(load(inv), Policy.AUTO)
    sup = ctl.jobs["p"]
    task = asyncio.create_task(ctl.run())
    await until(lambda: sup.step >= 30 or task.done(), 90, "step 30")
    pid = executor_pid(tmp_path / "a", "p")
    child = command_pid(tmp_path / "a" / "jobs" / "p")
    assert child is not None
    os.kill(child, signal.SIGKILL)
    # Well inside the 30 s lease: the faulted executor was told to stop, not left waiting.
    await until(lambda: not Path(f"/proc/{pid}").exists() or task.done(), 10, "a's executor gone")
    await until(lambda: sup.host == "b" or task.done(), 30, "the failover to b")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()


@pytest.mark.long
async def test_a_console_started_after_the_run_died_restarts_it_in_the_waiting_executor(
    tmp_path: Path,
) -> None:
    """The command dies while no console watches: the next console finds the executor waiting
    (faulted, within its lease) and restarts the run in it, not in a new one."""
    reference = await asyncio.to_thread(plain_reference, tmp_path)
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a"), "b": local_host(tmp_path / "b", role="spare")},
        jobs={"p": {"host": "a", "spares": ["b"], **command_table()}},
        lease_s=30.0,
    )
    workdir = tmp_path / "a" / "jobs" / "p"
    ctl = Controller(load(inv), Policy.AUTO)
    sup = ctl.jobs["p"]
    task = asyncio.create_task(ctl.run())
    await until(lambda: sup.step >= 30 or task.done(), 90, "step 30")
    task.cancel()  # the console dies; the executor trains on under its lease
    await asyncio.gather(task, return_exceptions=True)
    await ctl.close()
    pid = executor_pid(tmp_path / "a", "p")
    child = command_pid(workdir)
    assert child is not None
    os.kill(child, signal.SIGKILL)
    events = workdir / "events.jsonl"
    await until(lambda: '"kind":"run_ended"' in events.read_text(), 30, "run_ended on disk")

    again = Controller(load(inv), Policy.AUTO)
    sup2 = again.jobs["p"]
    run = asyncio.create_task(again.run())
    await until(lambda: sup2.epoch >= 2 or run.done(), 30, "the restart at epoch 2")
    await until(
        lambda: command_pid(workdir) not in (None, child) or run.done(), 30, "a new command"
    )
    assert executor_pid(tmp_path / "a", "p") == pid and Path(f"/proc/{pid}").exists()
    await asyncio.wait_for(run, 120)
    await again.close()
    assert (sup2.state, sup2.host, sup2.sha256) == (JobState.FINISHED, "a", reference)
    entries = list(read(inv.parent / "state" / "journal.jsonl"))
    started = [
        e for e in entries if e.kind is Kind.EXECUTOR and "pid" in e.data and " started " in e.msg
    ]
    # a warm standby (HOTSPARE_TEST_WARM_STANDBY=1) is the one other executor allowed: on b
    assert [e.data["pid"] for e in started if not e.data["standby"]] == [pid], (
        "no second executor was started"
    )
    assert {e.host for e in started if e.data["standby"]} <= {"b"}
    assert any(i.fault_class == "run_crash" and i.resolved for i in incidents(entries))
