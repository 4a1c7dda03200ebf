"""A member that cannot load the step its group resumes from: the next epoch resumes from an
older step, not the same one again.

A restart from an older step spends none of the job's restarts in place (it spent one, as a
crash does: a few damaged steps in a row moved the job off a sound host).

Found by CI (028e228): a member cut off mid-copy left its replacement with a step it could not
load; the group restarted in place three times with that same step, then had no host left to
replace the member with and waited for ever. Here the newcomer's replica of the step it would
resume from is damaged in place (same size, one byte flipped: its manifest still lists it as
sound, so only loading it finds out), once the console has chosen it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from chaos.observe import executor_events
from support.fleetbed import run_until
from support.groupbed import controller, group_baseline, local_group

from console.records.journal import Event, Kind, read
from console.states import JobState


@pytest.fixture(scope="module")
def baseline() -> str:
    return group_baseline()


def replicas(spare: Path, shard: int) -> list[Path]:
    """The spare's replicas of ``shard``, oldest first (their data files)."""
    folder = spare / "replicas" / "j" / f"node-{shard}"
    return [p.with_suffix(".pt") for p in sorted(folder.glob("step-*.json"))]


def events(root: Path) -> list[dict[str, Any]]:
    return executor_events(root / "jobs" / "j")


async def test_a_member_that_cannot_load_the_chosen_step_is_given_an_older_one(
    tmp_path: Path, baseline: str
) -> None:
    inv = local_group(tmp_path)
    ctl = controller(inv)
    sup = ctl.jobs["j"]

    def newest_committed() -> bool:
        """Two replicas on d, the newest of a step the whole group committed: an older step is
        there to fall back to once the chosen one is refused."""
        have = replicas(tmp_path / "d", 2)
        if len(have) < 2:
            return False
        return int(have[-1].stem.removeprefix("step-")) in ctl.store.job("j").committed

    task = await run_until(
        ctl,
        lambda: sup.step >= 60 and newest_committed(),
        120,
        "step 60 and two replicas of shard 2 on the spare, the newest committed",
    )
    damaged: list[int] = []

    def damage_the_chosen_step(e: Event) -> None:
        """Once the console has chosen the step the group resumes from (and promoted d's
        replica of it), before any member loads it: that step's shard on d is damaged. A
        fresh-clone run damaged d's newest replica at the kill instead, and the group resumed
        from another step (the survivors had not all written that one): d never met it. The
        promoted copy, the one d loads, is damaged: the replica folder's link to it may be
        pruned by then (a fresh-clone run at e43cb70 found it gone: a newer replica of c's
        shard, written before the kill, reached d meanwhile)."""
        step = e.data.get("replica_step") if "transfer_done" in e.msg else None
        if damaged or not isinstance(step, int):
            return
        data = tmp_path / "d" / "jobs" / "j" / "checkpoints" / f"step-{step:010d}.pt"
        with data.open("r+b") as f:  # in place: a hard link to it in the replicas is damaged too
            f.seek(data.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([byte[0] ^ 0xFF]))
        damaged.append(step)

    ctl.journal.subscribe(damage_the_chosen_step)
    ctl.kill_host("c")
    await asyncio.wait_for(task, 240)
    await ctl.close()
    assert sup.state is JobState.FINISHED, sup.live.why
    assert sup.sha256 == baseline
    assert ctl.store.job("j").members == ["a", "b", "d"]
    # from d's own events: it could not load the damaged step, and then resumed from an older one
    seen = events(tmp_path / "d")
    refused = [e for e in seen if e.get("kind") == "fault" and e.get("fault") == "resume_failed"]
    assert [e["step"] for e in refused] == damaged, refused
    resumed = [e["step"] for e in seen if e.get("kind") == "resumed"]
    assert len(damaged) == 1 and resumed and resumed[-1] < damaged[0], (damaged, resumed)
    for member in "ab":  # the survivors resumed from that same older step
        steps = [e["step"] for e in events(tmp_path / member) if e.get("kind") == "resumed"]
        assert steps[-1] == resumed[-1], (member, steps)
    # d's run ended as one that could not load its step (its executor waiting, in the same
    # process), and the restart from the older step spent none of the job's restarts in place
    ended = [e for e in seen if e.get("kind") == "run_ended"]
    assert [e["fault"] for e in ended] == ["resume_failed"], ended
    moves = [
        e.msg for e in read(inv.parent / "state" / "journal.jsonl") if e.kind is Kind.JOB_STATE
    ]
    assert any("no restart spent" in m for m in moves), moves
    assert not any("restart 1 of" in m for m in moves), moves
