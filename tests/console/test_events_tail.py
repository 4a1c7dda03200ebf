"""An executor that is gone is classified from the end of its events.jsonl, and the run's last
checkpoint is read back from there too (``Outcome.saved``): its link may have closed before
that CheckpointSaved was read, and a failover that did not know of it resumed from an older
checkpoint (CI at 059ac18: a preemption lost 11 steps so)."""

from __future__ import annotations

import msgspec

from console.supervise.outcome import Exit, from_events_tail
from protocol.messages import CheckpointSaved, ExecutorMessage, Fault, Progress, Stopped
from protocol.spec import CheckpointManifest


def saved(step: int, epoch: int = 2) -> CheckpointSaved:
    manifest = CheckpointManifest(
        job="j",
        step=step,
        file=f"step-{step:010d}.pt",
        size=1234,
        sha256="ab" * 32,
        epoch=epoch,
        spec_hash="s",
        code_version="c",
        created_at=1.0,
    )
    return CheckpointSaved(
        manifest=manifest, path="/x", manifest_path="/x.json", write_s=0.1, stall_s=0.0
    )


def tail(*msgs: ExecutorMessage | str) -> str:
    return "".join(
        (m if isinstance(m, str) else msgspec.json.encode(m).decode()) + "\n" for m in msgs
    )


def progress(step: int) -> Progress:
    return Progress(step=step, steps=100, loss=1.0, steps_per_s=10.0, eta_s=1.0)


def test_a_preemption_read_back_carries_its_checkpoint_at_the_stop() -> None:
    outcome = from_events_tail(
        tail(
            saved(80),
            progress(91),
            Fault(fault="preempted", message="SIGTERM", step=91),
            saved(91),
            progress(91),
            Stopped(step=91, reason="preempted", checkpoint_step=91, exit_code=143),
        )
    )
    assert outcome.exit is Exit.PLANNED and outcome.preempted
    assert outcome.checkpoint_step == 91
    assert outcome.saved is not None
    assert outcome.saved.manifest.step == 91 and outcome.saved.manifest.epoch == 2


def test_a_torn_or_foreign_checkpoint_line_leaves_the_one_before() -> None:
    good = msgspec.json.encode(saved(60)).decode()
    outcome = from_events_tail(
        tail(
            good,
            '{"kind": "checkpoint", "manifest": {"step": "not a number"}}',
            progress(70),
            good[: len(good) // 2],  # cut off mid-write
        )
    )
    assert outcome.exit is Exit.CRASHED
    assert outcome.saved is not None and outcome.saved.manifest.step == 60


def test_a_tail_without_a_checkpoint_has_none() -> None:
    outcome = from_events_tail(tail(progress(5), Stopped(step=5, reason="drain")))
    assert outcome.exit is Exit.PLANNED and outcome.saved is None
    assert from_events_tail("").saved is None
