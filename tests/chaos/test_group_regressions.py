"""Bugs the multi-host chaos run found, each pinned by a test of its own (local hosts: fast)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from fleetbed import until
from groupbed import controller, local_group

from console.records.incidents import incidents
from console.records.journal import read
from console.states import JobState


async def test_a_killed_members_incident_names_it_not_a_survivor_whose_collective_failed(
    tmp_path: Path,
) -> None:
    """SIGKILL of b's executor: a and c's collectives fail at once (connection reset) and
    their RunEnded reached the console before it had probed b's host and found b dead, so the
    incident named the first survivor to report (executor_crash on a or c, its gloo error as
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
