"""What a group's members did while no console watched, read by the next console: a
preemption's checkpoint at the stop is where the group resumes (no step lost)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from chaos.observe import executor_events
from support.fleetbed import run_until, until
from support.groupbed import controller, executor_pid, group_baseline, local_group

from console.records.journal import read
from console.states import JobState


def events(root: Path) -> list[dict[str, Any]]:
    return executor_events(root / "jobs" / "j")


@pytest.fixture(scope="module")
def baseline() -> str:
    return group_baseline()


async def test_a_preemption_while_no_console_watched_resumes_at_its_stop_under_the_next(
    tmp_path: Path, baseline: str
) -> None:
    """The console quits; member c's host is then preempted (SIGTERM to its executor): every
    member checkpoints at one step and stops. The next console reads that from the members'
    events, moves c's rank off the host being taken away and resumes at the stop's step."""
    inv = local_group(tmp_path, console={"unattended_s": 60.0})
    slow = {"HOTSPARE_INJECT": "slow_step@0.08"}
    first = controller(inv, **slow)
    sup = first.jobs["j"]
    task = await run_until(first, lambda: sup.step >= 30, 120, "step 30")
    task.cancel()  # q: the console quits cleanly, the group trains on
    await asyncio.gather(task, return_exceptions=True)
    await first.close()
    pids = {h: executor_pid(tmp_path / h) for h in "abc"}
    os.kill(pids["c"], signal.SIGTERM)  # the preemption notice
    await until(
        lambda: not any(Path(f"/proc/{p}").exists() for p in pids.values()),
        60,
        "every member's executor to stop",
    )
    stops = {h: [e for e in events(tmp_path / h) if e["kind"] == "stopped"] for h in "abc"}
    (stopped,) = stops["c"]
    assert stopped["reason"] == "preempted" and stopped["checkpoint_step"] == stopped["step"]

    again = controller(inv, **slow)
    await asyncio.wait_for(again.run(), 240)
    await again.close()
    sup2 = again.jobs["j"]
    assert sup2.state is JobState.FINISHED, sup2.live.why
    assert sup2.sha256 == baseline
    assert again.store.job("j").members == ["a", "b", "d"], "the preempted member's rank moved"
    resumed = [e["step"] for e in events(tmp_path / "d") if e["kind"] == "resumed"]
    assert resumed == [stopped["step"]], "no step lost"
    read_back = [
        e.host
        for e in read(inv.parent / "state" / "journal.jsonl")
        if f"checkpoint step {stopped['step']} read back" in e.msg and "no console was" in e.msg
    ]
    assert sorted(read_back) == ["a", "b", "c"], "each member's shard of the stop, read back"
