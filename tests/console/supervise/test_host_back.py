"""A host that was lost is a host like any other once it is back: a job with nowhere else to
go waits for a host, and takes the one it left when that one comes back.

Found in a fresh-clone run (test_provision_release): the failover's own target died as the job
started there, came back 0.2 s later, and the job waited for a host forever, because the next
failover never chose the host it was leaving. Real parts: real executors and torch on local
demo hosts, real SIGKILLs of every process a host runs; the evidence is the executors' pid
files and /proc, and the final checkpoint's parameters hashed from the bytes on disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import pytest
from support.fleetbed import (
    EXECUTOR_ENV,
    baseline_params,
    checkpoint_params,
    job_table,
    local_host,
    until,
    write_inventory,
)

from console.controller import Controller
from console.inventory import load
from console.records.incidents import incidents
from console.records.journal import Event, read
from console.states import HostState, JobState
from console.supervise.policy import Policy


def running_executor(root: Path) -> int | None:
    """The pid of the job's executor on a host, from its pid file, if that process lives."""
    try:
        pid = int((root / "jobs" / "j" / "executor.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None


@pytest.mark.long  # the suite proves a job with no spare resumes on a host added later (test_spare_keeper)
async def test_a_job_whose_last_host_died_goes_back_to_it_once_it_is_up(tmp_path: Path) -> None:
    inventory = write_inventory(
        tmp_path / "inventory.toml",
        hosts={
            "a": local_host(tmp_path / "a"),
            "b": local_host(tmp_path / "b", role="spare"),
            # up and reachable, never usable: the console is not cut off from every host
            "c": local_host(tmp_path / "c"),
        },
        jobs={"j": {"host": "a", "spares": ["b"], **job_table(steps=600)}},
    )
    ctl = Controller(
        load(inventory), Policy.AUTO, executor_env={h: dict(EXECUTOR_ENV) for h in "abc"}
    )
    sup = ctl.jobs["j"]
    seen: list[Event] = []
    ctl.journal.subscribe(seen.append)
    ctl.cordon("c")
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 40 or task.done(), 90, "step 40 on a")
        ctl.kill_host("a")
        await until(
            lambda: (
                (sup.host == "b" and sup.state is JobState.RUNNING and sup.step > 60) or task.done()
            ),
            90,
            "the job training on b",
        )
        first_on_b = running_executor(tmp_path / "b")
        assert first_on_b is not None
        # a's incident over first: b's loss is then an incident of its own (a fault during
        # a's recovery would be part of a's, as a fresh-clone run under load found)
        await until(
            lambda: [i.resolved for i in incidents(seen)] == [True] or task.done(),
            60,
            "a's incident resolved",
        )
        ctl.kill_host("b")  # the host the job left is dead too: nowhere to go
        await until(
            lambda: any("waits for a host" in e.msg for e in seen) or task.done(),
            90,
            "the job waiting for a host",
        )
        assert not Path(f"/proc/{first_on_b}").exists(), "b's executor died with b"
        assert running_executor(tmp_path / "a") is None
        ctl.revive_host("b")
        await until(lambda: ctl.fleet.hosts["b"].state is HostState.UP, 30, "b seen up")
        again = await until(
            lambda: running_executor(tmp_path / "b") or task.done(), 90, "an executor on b again"
        )
        assert not task.done(), task
        assert again != first_on_b
        assert running_executor(tmp_path / "a") is None, "a is still dead: nothing runs there"
        assert running_executor(tmp_path / "c") is None, "c is cordoned: no job there"
        await asyncio.wait_for(task, 180)
        assert sup.state is JobState.FINISHED, sup.state
        assert sup.host == "b"
        assert checkpoint_params(tmp_path / "b" / "jobs" / "j") == baseline_params(
            inventory, "j", tmp_path / "baseline"
        ), "bit-exact with a run that never failed"
        found = incidents(read(tmp_path / "state" / "journal.jsonl"))
        assert [(i.fault_class, i.resolved) for i in found] == [("host_lost", True)] * 2
    finally:
        print("\n".join(f"{e.t:.2f} {e.msg}" for e in seen))  # shown if the test fails
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await ctl.close()
        for root in (tmp_path / "a", tmp_path / "b"):
            pid = running_executor(root)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
