"""A Start is anchored to a fresh clock reading: a console loop that stalls between linking
an executor and starting it (readings queued, unread) must not send a lease already spent.

Found in a fresh-clone run (test_state_disk_full): the Start went out on a reading 3 s old,
and the executor's 3 s lease had ended at its first step ('lease ended while a step was
still running; exiting at once'), a restart nobody asked for. Real executor, real lease."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fleetbed import EXECUTOR_ENV, FAST_CONSOLE, job_table, local_host, until, write_inventory

from console.inventory import load
from console.jobs.controller import Controller
from console.jobs.policy import Policy
from console.jobs.watch import Watch
from console.records.journal import read
from console.states import JobState


async def test_a_loop_stalled_before_the_start_still_starts_a_whole_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = write_inventory(
        tmp_path / "inventory.toml",
        hosts={"a": local_host(tmp_path / "a")},
        jobs={"j": {"host": "a", "steps": 100_000, **job_table(steps=100_000)}},
    )
    stalls: list[float] = []
    new_executor = Watch.new_executor

    def stalled(self: Watch) -> None:
        new_executor(self)
        if not stalls:  # the loop blocked longer than a lease, once, right before the Start
            began = time.monotonic()
            time.sleep(FAST_CONSOLE["lease_s"] + 1.0)
            stalls.append(time.monotonic() - began)

    monkeypatch.setattr(Watch, "new_executor", stalled)
    ctl = Controller(load(inv), Policy.AUTO, executor_env={"a": dict(EXECUTOR_ENV)})
    sup = ctl.jobs["j"]
    task = asyncio.create_task(ctl.run())
    try:
        await until(lambda: sup.step >= 50 or task.done(), 90, "50 steps")
        assert not task.done(), task
        assert stalls and stalls[0] > FAST_CONSOLE["lease_s"]
        assert sup.state is JobState.RUNNING and sup.epoch == 1, (sup.state, sup.epoch)
    finally:
        ctl.stop_job("j")
        await asyncio.wait_for(task, 60)
        await ctl.close()
    events = list(read(inv.parent / "state" / "journal.jsonl"))
    lapsed = [e.msg for e in events if "lease" in e.msg and ("lost" in e.msg or "ended" in e.msg)]
    assert not lapsed, lapsed
    workdir_events = (tmp_path / "a" / "jobs" / "j" / "events.jsonl").read_text()
    assert "lease_lost" not in workdir_events, "the executor lost its lease"
